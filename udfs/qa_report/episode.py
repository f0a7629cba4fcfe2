"""One episode's QA inputs as arrays: table rows (pandas) in, per-frame views and quality signals out.

The qa stage, the evidence page and the tests all start here, so the page shows exactly what the
flags were computed from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pose_core.errors import EgolakeError
from pose_core.identities import WEARER_HANDS
from pose_core.qa import EpisodeSignals
from pose_core.training.tensors import nearest_source
from udfs.camera_tables import world_from_cam_from_columns
from udfs.columns import list_column

__all__ = ["WEARER", "EpisodeView", "HandTrack", "arm_sticks", "episode_signals", "episode_view"]

logger = logging.getLogger(__name__)

#: The identities whose hands are the training data.
WEARER: tuple[str, ...] = WEARER_HANDS

_FRAME_COLUMNS = (
    "tracking_state",
    "pose_quality",
    "is_keyframe",
    "segment_id",
    "num_inliers",
    "reproj_error_px",
)
# Camera-pose columns of frames without a camera_poses row: (name, value, dtype).
_FRAME_FILL = (
    ("tracking_state", "lost", object),
    ("pose_quality", "none", object),
    ("is_keyframe", False, bool),
    ("segment_id", -1, np.int64),
    ("num_inliers", np.nan, np.float64),
    ("reproj_error_px", np.nan, np.float64),
)


@dataclass(frozen=True)
class HandTrack:
    """One hand identity over the episode's frames (`F` frames, NaN / False where absent).

    Attributes:
        keypoints_world: `(F, 21, 3)` metres, world frame.
        filled: gap-filled, not observed, `(F,)`.
        score: detector score, `(F,)`.
        switch: fusion gave this identity to a new motion track here (`identity_switch`), `(F,)`; a
            hand returning to the view does this too, so the identity_switches check does not count these.
        depth_source: where its depth came from, `(F,)` object (None where absent).
        hand_slot: `hands_cam.hand_slot` of the observation, `(F,)` (-1 where none).
    """

    keypoints_world: NDArray[np.float64]
    filled: NDArray[np.bool_]
    score: NDArray[np.float64]
    switch: NDArray[np.bool_]
    depth_source: NDArray[np.object_]
    hand_slot: NDArray[np.int64]

    @property
    def present(self) -> NDArray[np.bool_]:
        """Frames where the hand is (observed or filled)."""
        return np.isfinite(self.keypoints_world).all(axis=(1, 2))


@dataclass(frozen=True)
class EpisodeView:
    """An episode frame by frame.

    Attributes:
        episode_id: the episode.
        frames: one row per frame in frame order: frame_idx, ts_s and the camera-pose diagnostics
            (tracking_state, pose_quality, is_keyframe, segment_id, num_inliers, reproj_error_px).
        world_from_cam: `(F, 4, 4)`, NaN where no pose; translation in metres when the episode has a
            metric scale (`hands_world.metres_per_unit`), else in map units (as the hands then are).
        hands: identity -> its track.
        scale_source: the metric scale's source (stereo | imu | hands | user | none).
        metres_per_unit: metres per `camera_poses` unit applied to `world_from_cam` (1 without a scale).
        scale_rel_std: the scale's relative standard error; NaN without a scale or without an error
            (a user's value; `hands_world` before it had `metres_per_unit_std`).
    """

    episode_id: str
    frames: pd.DataFrame
    world_from_cam: NDArray[np.float64]
    hands: dict[str, HandTrack]
    scale_source: str
    metres_per_unit: float = 1.0
    scale_rel_std: float = float("nan")

    @property
    def tracked(self) -> NDArray[np.bool_]:
        """Frames with a pose from tracking: a pose, and neither lost nor missing."""
        has_pose = np.isfinite(self.world_from_cam).all(axis=(1, 2))
        return has_pose & (self.frames["tracking_state"] != "lost").to_numpy()


def _values(column: pd.Series, fill: object, dtype: object) -> np.ndarray:
    """A scalar column (object dtype after stacking) as an array, nulls replaced by `fill`."""
    return np.array([fill if pd.isna(v) else v for v in column], dtype=dtype)


def _hand_track(rows: pd.DataFrame, index: dict[int, int], n: int) -> HandTrack:
    at = np.array([index[int(f)] for f in rows["frame_idx"]], np.int64)
    kp = np.full((n, 21, 3), np.nan)
    kp[at] = list_column(rows["keypoints_world_m"], 63).reshape(-1, 21, 3)

    def column(name: str, fill: object, dtype: object) -> np.ndarray:
        out = np.full(n, fill, dtype=dtype)
        out[at] = _values(rows[name], fill, dtype)
        return out

    return HandTrack(
        keypoints_world=kp,
        filled=column("filled", False, bool),
        score=column("score", np.nan, np.float64),
        switch=column("identity_switch", False, bool),
        depth_source=column("depth_source", None, object),
        hand_slot=column("hand_slot", -1, np.int64),
    )


def episode_view(frames: pd.DataFrame, camera_poses: pd.DataFrame, hands_world: pd.DataFrame) -> EpisodeView:
    """Join an episode's `frames`, `camera_poses` and `hands_world` rows on frame_idx.

    Raises:
        EgolakeError: the episode has no frames.
    """
    if frames.empty:
        raise EgolakeError("no frames for this episode: run priors first")
    episode_id = str(frames["episode_id"].iat[0])
    base = frames[["frame_idx", "ts_s"]].astype({"frame_idx": np.int64, "ts_s": np.float64})
    base = base.sort_values("frame_idx").reset_index(drop=True)
    poses = camera_poses.drop(columns=["ts_s"], errors="ignore").astype({"frame_idx": np.int64})
    joined = base.merge(poses, on="frame_idx", how="left")
    for name, fill, dtype in _FRAME_FILL:
        joined[name] = _values(joined[name], fill, dtype)
    n = len(joined)
    q = joined.get("world_from_cam_q_wxyz", pd.Series([None] * n))
    t = joined.get("world_from_cam_t_mu", pd.Series([None] * n))
    world_from_cam = world_from_cam_from_columns(q.where(q.notna(), None), t.where(t.notna(), None))
    index = {int(f): i for i, f in enumerate(joined["frame_idx"])}
    hands_world = hands_world[hands_world["frame_idx"].isin(index)]
    hands = {
        str(identity): _hand_track(rows, index, n)
        for identity, rows in hands_world.groupby("identity", sort=True)
    }
    sources = hands_world["scale_source"].dropna().unique() if "scale_source" in hands_world else []
    scales = hands_world["metres_per_unit"].dropna() if "metres_per_unit" in hands_world else []
    metres_per_unit = float(scales.iat[0]) if len(scales) else 1.0
    stds = hands_world["metres_per_unit_std"].dropna() if "metres_per_unit_std" in hands_world else []
    scale_rel_std = float(stds.iat[0]) / metres_per_unit if len(stds) and len(scales) else float("nan")
    world_from_cam[:, :3, 3] *= metres_per_unit  # the hands' world: both in one unit
    return EpisodeView(
        episode_id=episode_id,
        frames=joined[["frame_idx", "ts_s", *_FRAME_COLUMNS]],
        world_from_cam=world_from_cam,
        hands=hands,
        scale_source=str(sources[0]) if len(sources) else "none",
        metres_per_unit=metres_per_unit,
        scale_rel_std=scale_rel_std,
    )


def episode_signals(view: EpisodeView) -> EpisodeSignals:
    """The quality-check inputs of an episode: camera path and every hand's wrist in the camera frame.

    Wrists go back into the camera frame with the same `world_from_cam` that placed them in the world
    (translation scaled like the hands'), so they are the hand fit's metric positions, whatever the
    episode's map scale.
    """
    rotation, centre = view.world_from_cam[:, :3, :3], view.world_from_cam[:, :3, 3]
    return EpisodeSignals(
        ts_s=view.frames["ts_s"].to_numpy(np.float64),
        camera_centre=centre,
        tracked=view.tracked,
        segment_id=view.frames["segment_id"].to_numpy(np.int64),
        wrists_cam_m={
            k: np.einsum("fji,fj->fi", rotation, h.keypoints_world[:, 0] - centre)
            for k, h in view.hands.items()
        },
        wearer=WEARER,
        scale_rel_std=view.scale_rel_std,
    )


def arm_sticks(view: EpisodeView, robot_actions: pd.DataFrame) -> dict[str, NDArray[np.float64]]:
    """The retargeted arms as stick figures at the episode's frames, from `robot_actions.arm_points_world`.

    Each video frame takes the control step nearest in time (the robot runs at its own rate).

    Returns:
        ``"<embodiment> <identity>"`` -> ``(F, P, 3)`` world points, metres (base, joints, tool), NaN where
        the step has no valid hand; arms without a stick figure (dexterous hands, refused) are left out.
    """
    if robot_actions.empty:
        return {}
    ts = view.frames["ts_s"].to_numpy(np.float64)
    out = {}
    for (embodiment, identity), group in robot_actions.groupby(["embodiment", "identity"], sort=True):
        rows = group.sort_values("step_idx")
        points = rows["arm_points_world"]
        if not points.notna().any():
            continue
        size = len(next(iter(points.dropna())))
        blank = np.full(size, np.nan)
        steps = np.stack([np.asarray(v, np.float64) if isinstance(v, list | np.ndarray) else blank
                          for v in points]).reshape(len(rows), -1, 3)
        step_ts = rows["ts_s"].to_numpy(np.float64)
        out[f"{embodiment} {identity}"] = steps[nearest_source(step_ts, ts - step_ts[0])]
    return out
