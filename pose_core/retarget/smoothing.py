"""Smooth tool targets from estimated hands before an arm follows them.

Estimated hands jitter from frame to frame (tens of degrees of palm roll; the keypoints' depth noise
of a few centimetres is fusion's motion model's, `pose_core.hands.temporal`) far faster than a hand
moves or an arm can follow. Retargeting therefore smooths the tool targets within each run of steps
that have a hand (`smooth_tool_poses`): the approach axis (and, when `position_window_s` is set, the
position) by a Savitzky-Golay filter (local quadratic fit, zero phase; positions keep the
fitted polynomial at a run's ends, exact for motion up to degree 2, where mirrored ends bent clean
robot-made paths by up to 4 cm; the axes mirror the ends, where fitted ends swung noisy axes); the
closing axis of a gripper whose jaws are symmetric as a *line*, by the principal direction of the
filtered outer products ``y y^T`` (so a palm normal that flips sign does not turn the target half a
turn). What remains too fast for the arm is the trajectory fit's (`pose_core.retarget.trajectory`).

Convention:
    Steps are uniform in time (the profile's control rate), ``dt = 1 / fps``. Poses are ``(F, 4, 4)``
    with NaN rows for steps without a hand; the tool frame's ``z`` is the approach, ``y`` the closing
    axis (`pose_core.retarget.orientation`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.signal import savgol_filter

from pose_core.errors import ShapeError

__all__ = ["SmoothingOptions", "finite_runs", "smooth_tool_poses"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class SmoothingOptions:
    """Knobs of target smoothing."""

    # Savitzky-Golay window of the tool position, seconds; 0 keeps the positions. Off by default: fusion's
    # motion model (`pose_core.hands.temporal`) already smooths the hands with the depth noise they have,
    # and a second, fixed window only bends real motion (0.67 s at order 2 moved true wrists by 9-11 mm
    # p95 of the 15 mm budget). For hands from elsewhere that jitter: 0.67 s at order 4 passes ~2.4 Hz.
    position_window_s: float = 0.0
    # Window of the approach and closing axes, seconds (1 s at 30 Hz: -3 dB at 1 Hz); the estimated palm
    # roll is the noisiest part of a hand (tens of degrees from frame to frame); 0 keeps the rotations.
    orientation_window_s: float = 1.0
    # Polynomial order of the Savitzky-Golay fits.
    polyorder: int = 2

    def __post_init__(self) -> None:
        if self.position_window_s < 0 or self.orientation_window_s < 0 or self.polyorder < 1:
            raise ValueError("retarget smoothing: windows must be >= 0 s and polyorder >= 1")


def finite_runs(mask: BoolArray) -> list[NDArray[np.int64]]:
    """Indices of each run of consecutive True values in ``mask (F,)``."""
    idx = np.flatnonzero(np.asarray(mask, bool))
    return np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1) if len(idx) else []


def _window(seconds: float, fps: float, run: int, polyorder: int) -> int:
    """Odd window in samples for a run of ``run`` steps; 0 when the run is too short to filter."""
    win = min(int(round(seconds * fps)) | 1, run if run % 2 else run - 1)
    return win if win > polyorder + 1 else 0


def _principal(outer: FloatArray, approach: FloatArray) -> FloatArray:
    """Per row the principal unit direction of ``outer (N, 3, 3)`` orthogonal to ``approach (N, 3)``."""
    proj = np.eye(3) - approach[:, :, None] * approach[:, None, :]
    _, vecs = np.linalg.eigh(proj @ outer @ proj)
    return vecs[:, :, -1]


def smooth_tool_poses(base_from_tool: FloatArray, fps: float, opts: SmoothingOptions,
                      symmetric_closing: bool) -> FloatArray:
    """Smoothed tool targets, run by run (see the module's docstring).

    Args:
        base_from_tool: targets in any fixed frame, metres, ``(F, 4, 4)``; NaN rows are steps without a hand.
        fps: step rate, Hz.
        opts: windows and order.
        symmetric_closing: the closing axis is a line (parallel jaws); else a signed direction.

    Returns:
        Smoothed targets ``(F, 4, 4)``, NaN where the input is; runs too short to filter are kept as they are.

    Raises:
        ShapeError: if ``base_from_tool`` is not ``(F, 4, 4)``.
    """
    poses = np.array(base_from_tool, dtype=np.float64)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4):
        raise ShapeError("base_from_tool", poses.shape, "(F, 4, 4)")
    for run in finite_runs(np.all(np.isfinite(poses.reshape(len(poses), -1)), axis=1)):
        win = _window(opts.position_window_s, fps, len(run), opts.polyorder)
        if win:
            poses[run, :3, 3] = savgol_filter(poses[run, :3, 3], win, opts.polyorder, axis=0, mode="interp")
        win = _window(opts.orientation_window_s, fps, len(run), opts.polyorder)
        if not win:
            continue
        raw_y = poses[run, :3, 1]
        z = savgol_filter(poses[run, :3, 2], win, opts.polyorder, axis=0, mode="mirror")
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        if symmetric_closing:
            outer = savgol_filter(raw_y[:, :, None] * raw_y[:, None, :], win, opts.polyorder, axis=0,
                                  mode="mirror")
            y = _principal(outer, z)
            # One sign along the run (continuous), the first step's as estimated.
            turns = np.where(np.sum(y[1:] * y[:-1], axis=1) < 0, -1.0, 1.0)
            y *= np.cumprod(np.r_[-1.0 if y[0] @ raw_y[0] < 0 else 1.0, turns])[:, None]
        else:
            y = savgol_filter(raw_y, win, opts.polyorder, axis=0, mode="mirror")
            y -= np.sum(y * z, axis=1, keepdims=True) * z
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        poses[run, :3, 0], poses[run, :3, 1], poses[run, :3, 2] = np.cross(y, z), y, z
    return poses
