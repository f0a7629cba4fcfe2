"""Per-frame state and action tensors of one episode, resampled to a uniform dataset rate.

Convention:
    Source frames carry presentation times `ts_s` (seconds, increasing, any spacing). Dataset frame
    `k` is at `timestamp = k / fps` seconds after the episode's first source frame and takes the
    values of the source frame nearest in time (ties go to the earlier one): sample-and-hold, never
    interpolation, so every exported value equals a value of the world-frame tables and the video
    frame shows exactly the instant the state describes. A hand (or the camera pose) missing in the
    chosen source frame is zero-filled AND masked (`observation.present` = 0); consumers must use
    the mask. Rotations are 6-D: the first two columns of the 3x3 matrix, column-major
    `(r00, r10, r20, r01, r11, r21)` (Zhou et al. 2019).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.identities import WEARER_HANDS, is_right_hand
from pose_core.retarget.wrist import grip_aperture_from_keypoints, wrist_from_keypoints

__all__ = [
    "HAND_IDENTITIES",
    "EpisodeTensors",
    "TensorOptions",
    "action_from_state",
    "episode_tensors",
    "nearest_source",
    "robot_tensors",
    "rot6d_from_matrix",
    "uniform_times",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
#: The hands a dataset's state holds, in order.
HAND_IDENTITIES: tuple[str, ...] = WEARER_HANDS
_TIME_EPS_S = 1e-6  # slack so a last frame at exactly (T-1)/fps is kept despite float rounding


@dataclass(frozen=True)
class TensorOptions:
    """How source frames become dataset frames."""

    # Dataset frame rate, Hz: frames are resampled from presentation timestamps to this uniform rate.
    fps: int = 30
    # Action: next = the next frame's state; delta = next state minus this state.
    action_mode: Literal["next", "delta"] = "next"
    # Also export all 21 world-frame keypoints per hand (observation.hand_keypoints, 126 values).
    include_keypoints: bool = False
    # Count hands_world rows filled in short gaps (filled = true) as present.
    use_filled: bool = True

    def __post_init__(self) -> None:
        if self.fps < 1:
            raise ValueError(f"export.tensors.fps must be >= 1, got {self.fps}")
        if self.action_mode not in ("next", "delta"):
            raise ValueError(f"export.tensors.action_mode must be next or delta, got {self.action_mode!r}")


@dataclass(frozen=True)
class EpisodeTensors:
    """One episode's dataset frames.

    Attributes:
        source_index: `(T,)` int64 row of the source arrays each dataset frame takes its values from.
        timestamp: `(T,)` float64 seconds from the first source frame, `k / fps`.
        arrays: feature name -> `(T, D)` float32 (or int64 for `source_frame_idx`).
    """

    source_index: NDArray[np.int64]
    timestamp: FloatArray
    arrays: dict[str, np.ndarray]


def uniform_times(ts_s: FloatArray, fps: int) -> FloatArray:
    """Dataset frame times `k / fps` covering the source frames' time span.

    Args:
        ts_s: source presentation times, seconds, increasing, `(F,)`, F >= 1.
        fps: dataset rate, Hz.

    Returns:
        `(T,)` seconds from `ts_s[0]`, `T = floor((ts_s[-1] - ts_s[0]) * fps) + 1`.

    Example:
        >>> uniform_times(np.array([0.0, 0.04, 0.08, 0.12]), 10).tolist()
        [0.0, 0.1]
    """
    ts = np.asarray(ts_s, np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ShapeError("ts_s", ts.shape, "(F,) with F >= 1")
    count = int(np.floor((ts[-1] - ts[0]) * fps + _TIME_EPS_S)) + 1
    return np.arange(count, dtype=np.float64) / fps


def nearest_source(ts_s: FloatArray, times_s: FloatArray) -> NDArray[np.int64]:
    """Index of the source frame nearest to each dataset time (ties: the earlier frame).

    Args:
        ts_s: source times, seconds, increasing, `(F,)`.
        times_s: dataset times, seconds from `ts_s[0]`, `(T,)`.

    Returns:
        `(T,)` int64 indices into `ts_s`.
    """
    ts = np.asarray(ts_s, np.float64) - ts_s[0]
    hi = np.clip(np.searchsorted(ts, times_s, side="left"), 0, len(ts) - 1)
    lo = np.clip(hi - 1, 0, len(ts) - 1)
    take_lo = np.abs(times_s - ts[lo]) <= np.abs(ts[hi] - times_s) + _TIME_EPS_S  # a tie within 1 us: earlier
    return np.where(take_lo, lo, hi).astype(np.int64)


def rot6d_from_matrix(rotation: FloatArray) -> FloatArray:
    """6-D rotation: the first two columns, `(..., 3, 3)` -> `(..., 6)` as (r00, r10, r20, r01, r11, r21)."""
    rotation = np.asarray(rotation)
    if rotation.shape[-2:] != (3, 3):
        raise ShapeError("rotation", rotation.shape, "(..., 3, 3)")
    return np.concatenate([rotation[..., :, 0], rotation[..., :, 1]], axis=-1)


def action_from_state(
    state: FloatArray, present: NDArray[np.bool_], mode: str
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Actions and their validity from per-frame state.

    Args:
        state: `(T, D)` state, zero where absent.
        present: `(T, D)` bool, where each state value is defined.
        mode: `next` (action k = state k+1) or `delta` (state k+1 - state k).

    Returns:
        `(T, D)` actions (0 where invalid) and `(T, D)` validity: defined in frame k and k+1; the
        last frame repeats its state (next) or is 0 (delta), valid where its state is.
    """
    nxt = np.concatenate([state[1:], state[-1:]])
    nxt_ok = np.concatenate([present[1:], present[-1:]])
    valid = present & nxt_ok
    action = nxt if mode == "next" else nxt - state
    return np.where(valid, action, 0.0), valid


def _hand_state(keypoints: FloatArray, is_right: bool) -> FloatArray:
    """`(F, 21, 3)` keypoints -> `(F, 10)`: wrist position, 6-D rotation, grip aperture (NaN: missing)."""
    world_from_wrist = wrist_from_keypoints(keypoints, is_right)
    grip = grip_aperture_from_keypoints(keypoints)
    return np.concatenate(
        [world_from_wrist[:, :3, 3], rot6d_from_matrix(world_from_wrist[:, :3, :3]), grip[:, None]], axis=1
    )


def episode_tensors(  # noqa: PLR0913 - the episode's arrays, each documented
    frame_idx: NDArray[np.int64],
    ts_s: FloatArray,
    keypoints_world: FloatArray,
    world_from_cam: FloatArray,
    metres_per_unit: float,
    opts: TensorOptions,
) -> EpisodeTensors:
    """Dataset frames of one episode (see the module's Convention).

    Args:
        frame_idx: source frame numbers, `(F,)`, increasing with `ts_s`.
        ts_s: source presentation times, seconds, `(F,)`.
        keypoints_world: `(F, I, 21, 3)` world-frame keypoints in metres of the identities
            `HAND_IDENTITIES` (I = 2); NaN where the hand is absent.
        world_from_cam: `(F, 4, 4)` camera poses, translation in map units; NaN where unposed.
        metres_per_unit: metres per map unit of the camera poses (1.0 without a metric scale).
        opts: rate, action mode, keypoints.

    Returns:
        `EpisodeTensors` with `observation.state` `(T, 10 I)`, `observation.present` `(T, I + 1)`,
        `observation.camera_pose` `(T, 9)`, optionally `observation.hand_keypoints` `(T, 63 I)`,
        `action` `(T, 10 I)`, `action_valid` `(T, I)` and `source_frame_idx` `(T, 1)`.

    Raises:
        ShapeError: if the arrays disagree in length or trailing shape.
    """
    kp = np.asarray(keypoints_world, np.float64)
    n_frames = len(ts_s)
    if kp.ndim != 4 or kp.shape[0] != n_frames or kp.shape[2:] != (21, 3) or len(frame_idx) != n_frames:
        raise ShapeError("keypoints_world", kp.shape, f"({n_frames}, I, 21, 3)")
    if np.shape(world_from_cam) != (n_frames, 4, 4):
        raise ShapeError("world_from_cam", np.shape(world_from_cam), f"({n_frames}, 4, 4)")
    times = uniform_times(ts_s, opts.fps)
    src = nearest_source(ts_s, times)
    kp = kp[src]
    n_hands = kp.shape[1]
    hands = [_hand_state(kp[:, i], is_right_hand(HAND_IDENTITIES[i])) for i in range(n_hands)]
    hand_ok = np.stack([np.isfinite(h).all(axis=1) for h in hands], axis=1)  # (T, I)
    cam = np.asarray(world_from_cam, np.float64)[src]
    cam_vec = np.concatenate([cam[:, :3, 3] * metres_per_unit, rot6d_from_matrix(cam[:, :3, :3])], axis=1)
    cam_ok = np.isfinite(cam_vec).all(axis=1)
    state = np.concatenate(hands, axis=1)
    state_ok = np.repeat(hand_ok, state.shape[1] // n_hands, axis=1)
    state = np.where(state_ok, state, 0.0)
    action, action_ok = action_from_state(state, state_ok, opts.action_mode)
    arrays: dict[str, np.ndarray] = {
        "observation.state": state.astype(np.float32),
        "observation.present": np.concatenate([hand_ok, cam_ok[:, None]], axis=1).astype(np.float32),
        "observation.camera_pose": np.where(cam_ok[:, None], cam_vec, 0.0).astype(np.float32),
        "action": action.astype(np.float32),
        "action_valid": action_ok[:, :: state.shape[1] // n_hands].astype(np.float32),
        "source_frame_idx": np.asarray(frame_idx, np.int64)[src][:, None],
    }
    if opts.include_keypoints:
        flat = kp.reshape(len(src), -1)
        ok = np.repeat(hand_ok, 63, axis=1)
        arrays["observation.hand_keypoints"] = np.where(ok, flat, 0.0).astype(np.float32)
    return EpisodeTensors(src, times, arrays)


def robot_tensors(
    frame_idx: NDArray[np.int64], ts_s: FloatArray, joints: list[FloatArray], opts: TensorOptions
) -> EpisodeTensors:
    """Dataset frames of one episode of a robot dataset (see the module's Convention).

    Args:
        frame_idx: source frame numbers, `(F,)`, increasing with `ts_s`.
        ts_s: source presentation times, seconds, `(F,)`.
        joints: per followed hand, `(F, J_i)` joint positions (+ gripper), NaN where undefined.
        opts: rate and action mode (`include_keypoints` and `use_filled` do not apply).

    Returns:
        `EpisodeTensors` with `observation.state` `(T, sum J_i)`, `observation.present` `(T, I)`,
        `action`, `action_valid` `(T, I)` and `source_frame_idx` `(T, 1)`.

    Raises:
        ShapeError: if an arm's array does not have F rows.
    """
    for arm in joints:
        if arm.ndim != 2 or arm.shape[0] != len(ts_s):
            raise ShapeError("joints", arm.shape, f"({len(ts_s)}, J)")
    times = uniform_times(ts_s, opts.fps)
    src = nearest_source(ts_s, times)
    arms = [np.asarray(arm, np.float64)[src] for arm in joints]
    arm_ok = np.stack([np.isfinite(a).all(axis=1) for a in arms], axis=1)  # (T, I)
    state_ok = np.concatenate(
        [np.repeat(arm_ok[:, [i]], a.shape[1], axis=1) for i, a in enumerate(arms)], axis=1
    )
    state = np.where(state_ok, np.concatenate(arms, axis=1), 0.0)
    action, action_ok = action_from_state(state, state_ok, opts.action_mode)
    first_dim = np.cumsum([0] + [a.shape[1] for a in arms[:-1]])
    arrays: dict[str, np.ndarray] = {
        "observation.state": state.astype(np.float32),
        "observation.present": arm_ok.astype(np.float32),
        "action": action.astype(np.float32),
        "action_valid": action_ok[:, first_dim].astype(np.float32),
        "source_frame_idx": np.asarray(frame_idx, np.int64)[src][:, None],
    }
    return EpisodeTensors(src, times, arrays)
