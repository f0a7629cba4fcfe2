"""The camera's path through a map, smoothed by a motion model that rejects single-frame outliers.

Each non-keyframe is posed on its own (motion-only fit against the map). On real first-person footage
those fits scatter: a head held nearly still at a desk moved 1 cm per frame in map units of a 0.7-unit
scene, and frames with 80-100 inlier points at 1.5 px jumped 0.2-0.3 units away and back (a second
minimum of the fit: a small turn and a sideways shift explain distant points alike). A head or a hand
held camera has mass: its centre follows a constant-velocity model (white-noise acceleration), and a
Rauch-Tung-Striebel smoother over each map's posed frames combines them:

- The measurement noise of a centre is estimated per map from third differences of the path over
  consecutive posed frames (white noise of std s gives third differences of std ``sqrt(20) s``; a
  head's own jerk adds little at video rate), robustly (median absolute deviation), so a path's
  outliers do not inflate it.
- The acceleration spectral density is chosen per frame from a grid relative to that noise by the
  innovations' likelihood over a window (`window_frames`): rests stay still, turns and steps are
  followed. An outlier's innovation counts as at the gate, so one outlier does not make a loose model
  the likelier; a longer run beyond the gate counts in full (the camera moved, a stiff model is wrong).
- A centre whose normalised innovation is improbable under the model (chi-square, 3 degrees of
  freedom) has its noise inflated by the excess: an outlier does not pull the path. A run longer
  than `max_outlier_run` frames is the camera moving and is followed (a gate alone would lock out
  a real fast step).

Everything is in frames and map units: the map's scale is arbitrary, so the density grid is relative
to the estimated noise (units^2 per frame^3). Rotations are left as fitted (they are precise; a
centre off by a sideways shift is the fit's weak direction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.geometry.motion_model import THIRD_DIFF_GAIN, constant_velocity_step, position_block

__all__ = ["PathSmoothingOptions", "smooth_camera_path"]

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

#: Median absolute deviation -> standard deviation for Gaussian samples.
_MAD_TO_STD = 1.4826


@dataclass(frozen=True)
class PathSmoothingOptions:
    """Knobs of the camera path's motion model."""

    # Smooth the centres of each map's posed frames (false keeps every frame's fit as it is).
    enabled: bool = True
    # Acceleration spectral densities searched, relative to the estimated noise variance per frame^3
    # (1: the velocity may wander by one noise std per frame). Spaced evenly in log between the two.
    accel_psd_min_rel: float = 1e-4
    accel_psd_max_rel: float = 1e2
    accel_psd_candidates: int = 13
    # Each frame takes the density most likely over this many frames around it.
    window_frames: int = 15
    # A centre whose normalised innovation (chi-square, 3 dof) exceeds this has its noise inflated by
    # the excess (99 %: 11.34).
    outlier_chi2: float = 11.34
    # Only this many consecutive centres beyond the gate are outliers; from the next on the camera has
    # moved (a fast turn or step) and the path follows it. A fit that settles in a wrong minimum for
    # longer is not told apart from motion here.
    max_outlier_run: int = 2
    # Fewest consecutive-frame third differences for a map's own noise estimate; a map with fewer is
    # left as fitted.
    min_noise_samples: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.accel_psd_min_rel <= self.accel_psd_max_rel or self.accel_psd_candidates < 1:
            raise ValueError(
                "accel_psd_min_rel must be > 0 and <= accel_psd_max_rel, accel_psd_candidates >= 1; got "
                f"{self.accel_psd_min_rel}, {self.accel_psd_max_rel}, {self.accel_psd_candidates}"
            )
        if self.window_frames < 1 or self.outlier_chi2 <= 0:
            raise ValueError(f"window_frames must be >= 1 and outlier_chi2 > 0, got {self}")


def _noise_std(frames: NDArray[np.int64], centres: FloatArray, min_samples: int) -> float | None:
    """Per-axis std of a path's centres `(N, 3)` from its consecutive-frame third differences; None if few."""
    consecutive = np.flatnonzero(np.diff(frames) == 1)
    runs = np.intersect1d(np.intersect1d(consecutive, consecutive - 1), consecutive - 2)
    if len(runs) < min_samples:
        return None
    d3 = centres[runs + 3] - 3 * centres[runs + 2] + 3 * centres[runs + 1] - centres[runs]
    mad = np.median(np.abs(d3 - np.median(d3, axis=0)), axis=0)
    sigma = float(np.sqrt(np.mean((_MAD_TO_STD * mad) ** 2)) / THIRD_DIFF_GAIN)
    return sigma if sigma > 0 else None


def _rts(  # noqa: PLR0913, PLR0914, PLR0917 - one filter pass and its smoother over the path's arrays
    frames: NDArray[np.int64], z: FloatArray, sigma: float, q: FloatArray, gate: float, max_outlier_run: int
) -> tuple[FloatArray, FloatArray]:
    """Robust Kalman filter and RTS smoother of centres `z` `(N, 3)` at `frames` `(N,)`, for G models at once.

    Args:
        frames: frame numbers of the centres, increasing, `(N,)`.
        z: measured centres, map units, `(N, 3)`.
        sigma: their noise std per axis.
        q: acceleration density of each model at each step (from the previous centre), `(G, N)`.
        gate: chi-square (3 dof) above which a centre is down-weighted.
        max_outlier_run: longest run of centres beyond the gate treated as outliers.

    Returns:
        (smoothed centres `(G, N, 3)`, each innovation's log-likelihood `(G, N)`, 0 for the first: Gaussian,
        but an outlier's (a run of at most `max_outlier_run` centres beyond the gate) counts as at the
        gate, so that every candidate model pays the same for it.)
    """
    g, n = q.shape
    x, p = np.zeros((g, n, 6)), np.zeros((g, n, 6, 6))
    x_pred, p_pred, trans = np.zeros((g, n, 6)), np.zeros((g, n, 6, 6)), np.zeros((n, 6, 6))
    h, r = position_block(), sigma**2 * np.eye(3)
    nis, logdet = np.zeros((g, n)), np.zeros((g, n))
    gated = np.zeros(g, np.int64)  # consecutive centres beyond the gate; more than `max_outlier_run`: motion
    x_pred[:, 0, :3] = z[0]
    # the first velocity is unknown: a prior far wider than any step of the path (KITTI: 1.2 m a frame)
    speed = float(np.max(np.linalg.norm(np.diff(z, axis=0), axis=1) / np.diff(frames), initial=sigma))
    p_pred[:, 0] = np.block([[r, np.zeros((3, 3))], [np.zeros((3, 3)), np.eye(3) * (10.0 * speed) ** 2]])
    for i in range(n):
        if i > 0:
            trans[i], unit = constant_velocity_step(float(frames[i] - frames[i - 1]), 1.0)
            x_pred[:, i] = x[:, i - 1] @ trans[i].T
            p_pred[:, i] = trans[i] @ p[:, i - 1] @ trans[i].T + q[:, i, None, None] * unit
        innovation = z[i] - x_pred[:, i, :3]  # (G, 3)
        s = p_pred[:, i, :3, :3] + r
        nis[:, i] = np.einsum("gi,gi->g", innovation, np.linalg.solve(s, innovation[..., None])[..., 0])
        logdet[:, i] = np.linalg.slogdet(s)[1]
        gated = np.where(nis[:, i] > gate, gated + 1, 0)
        down = (gated > 0) & (gated <= max_outlier_run)  # a centre the motion cannot explain counts for less
        s = s + np.where(down, nis[:, i] / gate - 1.0, 0.0)[:, None, None] * r
        gain = p_pred[:, i, :, :3] @ np.linalg.inv(s)  # (G, 6, 3)
        x[:, i] = x_pred[:, i] + np.einsum("gij,gj->gi", gain, innovation)
        p[:, i] = (np.eye(6) - gain @ h) @ p_pred[:, i]
    for i in range(n - 2, -1, -1):
        back = p[:, i] @ trans[i + 1].T @ np.linalg.inv(p_pred[:, i + 1])
        x[:, i] = x[:, i] + np.einsum("gij,gj->gi", back, x[:, i + 1] - x_pred[:, i + 1])
        p[:, i] = p[:, i] + back @ (p[:, i + 1] - p_pred[:, i + 1]) @ back.transpose(0, 2, 1)
    outlier = np.zeros((g, n), bool)
    for m in range(g):
        beyond = np.flatnonzero(nis[m] > gate)
        for run in np.split(beyond, np.flatnonzero(np.diff(beyond) > 1) + 1) if len(beyond) else []:
            outlier[m, run] = len(run) <= max_outlier_run
    loglik = -0.5 * (np.where(outlier, gate, nis) + logdet)
    loglik[:, 0] = 0.0
    return x[:, :, :3], loglik


def _local_density(
    frames: NDArray[np.int64], z: FloatArray, sigma: float, opts: PathSmoothingOptions
) -> FloatArray:
    """Each frame's acceleration density `(N,)`: the grid's most likely over the window around it."""
    grid = sigma**2 * np.geomspace(opts.accel_psd_min_rel, opts.accel_psd_max_rel, opts.accel_psd_candidates)
    q = np.repeat(grid[:, None], len(frames), axis=1)
    _, terms = _rts(frames, z, sigma, q, opts.outlier_chi2, opts.max_outlier_run)
    kernel = np.ones(opts.window_frames)
    windowed = np.stack([np.convolve(t, kernel, mode="same") for t in terms])
    return np.asarray(grid[windowed.argmax(axis=0)], np.float64)


def smooth_camera_path(
    centres: FloatArray, posed: BoolArray, segment_id: NDArray[np.integer], opts: PathSmoothingOptions
) -> FloatArray:
    """Camera centres smoothed per map by the motion model (see the module's docstring).

    Args:
        centres: camera centres in world, map units, `(F, 3)`; rows of frames not `posed` are ignored.
        posed: frames whose centre was measured (keyframes and motion-only fits), `(F,)` bool.
        segment_id: map of each frame, `(F,)`; maps are smoothed separately.
        opts: settings.

    Returns:
        Smoothed centres `(F, 3)`; frames not posed, and maps too short to estimate their noise, unchanged.
    """
    f = len(posed)
    if centres.shape != (f, 3) or segment_id.shape != (f,):
        raise ShapeError("centres / segment_id", (centres.shape, segment_id.shape), f"({f}, 3), ({f},)")
    out = centres.copy()
    if not opts.enabled:
        return out
    for seg in np.unique(segment_id[posed]):
        frames = np.flatnonzero(posed & (segment_id == seg))
        sigma = _noise_std(frames, centres[frames], opts.min_noise_samples)
        if sigma is None:
            continue
        q = _local_density(frames, centres[frames], sigma, opts)
        smoothed, _ = _rts(frames, centres[frames], sigma, q[None], opts.outlier_chi2, opts.max_outlier_run)
        out[frames] = smoothed[0]
    return out
