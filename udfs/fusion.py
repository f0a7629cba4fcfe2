"""Per-episode hand fusion: `hands_cam` rows and posed frames in, `hands_world` rows out.

Called by the `fusion` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two
light frames per episode (no pixels): the posed frames (`frames` joined with `camera_poses`) and the
episode's `hands_cam` rows. Callable on pandas frames without Spark.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pose_core.camera_poses.completion import PoseQuality
from pose_core.camera_poses.scale import ImuScale, scale_from_imu
from pose_core.errors import EgolakeError
from pose_core.geometry.rigid3 import matrix_from_quat_wxyz
from pose_core.hands import EpisodeFrames, EpisodeObservations, FusionOptions, fuse_episode
from pose_core.hands.fusion import SCALE_SOURCES, ScaleSource
from schemas.tables import HANDS_WORLD
from udfs.guard import run_unit
from udfs.media.sidecars import read_imu

__all__ = ["MEASURED_QUALITIES", "POSED_FRAME_COLUMNS", "fuse_hands", "guarded_fuse_hands"]

logger = logging.getLogger(__name__)

#: Columns of the posed-frame input. Optional: `scale_source` (the camera poses' metric scale: when
#: one of `SCALE_SOURCES`, `world_from_cam_t_m` is taken as metres), `imu_path` (the episode's
#: IMU sidecar, `videos.imu_path`: a metric scale candidate and the gravity direction) and
#: `pose_quality` (only frames of `MEASURED_QUALITIES` give the IMU scale position equations).
POSED_FRAME_COLUMNS: tuple[str, ...] = (
    "episode_id", "frame_idx", "ts_s", "world_from_cam_q_wxyz", "world_from_cam_t_m",
)  # fmt: skip

#: Pose qualities whose camera centre was measured (not held or interpolated).
MEASURED_QUALITIES: tuple[str, ...] = (
    PoseQuality.KEYFRAME.name.lower(),
    PoseQuality.MOTION_ONLY.name.lower(),
)


def _stack(column: pd.Series, width: int) -> np.ndarray:
    """A list column as a float64 array `(N, width)`."""
    if len(column) == 0:
        return np.zeros((0, width))
    return np.stack([np.asarray(v, np.float64) for v in column]).reshape(len(column), width)


def _episode_frames(frames: pd.DataFrame, hands: pd.DataFrame) -> EpisodeFrames:
    """Posed frames (rows with a pose) in frame order, with the intrinsics of the hand fits."""
    posed = frames[frames["world_from_cam_q_wxyz"].notna() & frames["world_from_cam_t_m"].notna()]
    posed = posed.sort_values("frame_idx")
    if posed.empty:
        raise EgolakeError("no camera poses for this episode's frames")
    world_from_cam = np.tile(np.eye(4), (len(posed), 1, 1))
    world_from_cam[:, :3, :3] = matrix_from_quat_wxyz(_stack(posed["world_from_cam_q_wxyz"], 4))
    world_from_cam[:, :3, 3] = _stack(posed["world_from_cam_t_m"], 3)
    fx, fy, cx, cy = np.asarray(hands["intrinsics_px"].iat[0], np.float64)
    return EpisodeFrames(
        frame_idx=posed["frame_idx"].to_numpy(np.int64),
        ts_s=posed["ts_s"].to_numpy(np.float64),
        world_from_cam=world_from_cam,
        camera_k=np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]),
        image_size=(int(hands["image_width"].iat[0]), int(hands["image_height"].iat[0])),
    )


def _observations(hands: pd.DataFrame) -> EpisodeObservations:
    right = (hands["handedness"] == "right").to_numpy()
    p_hand = hands["handedness_score"].to_numpy(np.float64)
    return EpisodeObservations(
        frame_idx=hands["frame_idx"].to_numpy(np.int64),
        keypoints_px=_stack(hands["keypoints_px"], 42).reshape(-1, 21, 2),
        keypoints_cam=_stack(hands["keypoints_cam_m"], 63).reshape(-1, 21, 3),
        score=hands["score"].to_numpy(np.float64),
        p_right=np.where(right, p_hand, 1.0 - p_hand),
        residual_px=hands["fit_residual_px"].to_numpy(np.float64),
        model_palm_size_m=hands["model_palm_size_m"].to_numpy(np.float64),
    )


def _imu_scale(frames: pd.DataFrame, posed: EpisodeFrames, opts: FusionOptions) -> ImuScale | None:
    """The IMU's scale and gravity for the posed frames; None without an IMU sidecar (or disabled).

    Frames whose camera centre was held or interpolated (`pose_quality` rotation_only /
    interpolated) keep their rotation but give no position equations.

    Raises:
        InputError: the sidecar named by `imu_path` cannot be read (the message names the file).
    """
    paths = frames["imu_path"].dropna().unique() if "imu_path" in frames else []
    if len(paths) == 0 or not opts.imu_scale.enabled:
        return None
    imu = read_imu(str(paths[0]))
    measured = None
    if "pose_quality" in frames:
        quality = frames.set_index("frame_idx")["pose_quality"].reindex(posed.frame_idx)
        measured = quality.isin(MEASURED_QUALITIES).to_numpy()
    return scale_from_imu(
        posed.ts_s, posed.world_from_cam, imu[:, 0], imu[:, 1:4], imu[:, 4:7], opts.imu_scale, measured
    )


def _scale_candidates(frames: pd.DataFrame, imu: ImuScale | None) -> dict[ScaleSource, float | None]:
    """Scale candidates: camera poses already metric (`scale_source` column) and the IMU's answer."""
    sources = frames["scale_source"].dropna().unique() if "scale_source" in frames else []
    candidates: dict[ScaleSource, float | None] = {s: 1.0 for s in sources if s in SCALE_SOURCES}
    if imu is not None:
        candidates.setdefault("imu", imu.metres_per_unit)
    return candidates


def fuse_hands(frames: pd.DataFrame, hands: pd.DataFrame, opts: FusionOptions) -> pd.DataFrame:
    """`hands_world` rows of one episode.

    Args:
        frames: the episode's frames with their camera poses (`POSED_FRAME_COLUMNS`, optional
            `scale_source`, `imu_path`, `pose_quality`); rows without a pose are ignored.
        hands: the episode's `hands_cam` rows.
        opts: fusion settings.

    Returns:
        One row per (frame, identity), observed or filled.

    Raises:
        EgolakeError: no frame of the episode has a camera pose.
        InputError: the episode's IMU sidecar cannot be read.
    """
    if hands.empty:
        return pd.DataFrame(columns=HANDS_WORLD.columns)
    episode_id = hands["episode_id"].iat[0]
    hands = hands.reset_index(drop=True)
    posed = _episode_frames(frames, hands)
    imu = _imu_scale(frames, posed, opts)
    if imu is not None:
        logger.info(
            "IMU scale episode=%s metres_per_unit=%s offset_s=%.4f excitation=%.3f rel_std=%.4f reason=%s",
            episode_id, imu.metres_per_unit, imu.time_offset_s, imu.excitation_m_s2, imu.rel_std, imu.reason,
        )  # fmt: skip
    fused = fuse_episode(posed, _observations(hands), opts, _scale_candidates(frames, imu))
    metric = fused.scale.scale_source != "none"
    gravity = None if imu is None or imu.gravity_world is None else imu.gravity_world.tolist()
    ts = dict(zip(posed.frame_idx.tolist(), posed.ts_s.tolist(), strict=True))
    src = hands.reindex(np.where(fused.filled, 0, fused.observation)).reset_index(drop=True)
    filled = pd.Series(fused.filled)
    out = pd.DataFrame(
        {
            "episode_id": episode_id,
            "frame_idx": fused.frame_idx,
            "identity": fused.identity.astype(str),
            "ts_s": [ts[int(f)] for f in fused.frame_idx],
            "keypoints_world_m": [kp.ravel().tolist() for kp in fused.keypoints_world],
            "filled": fused.filled,
            "score": src["score"].mask(filled),
            "handedness": src["handedness"].mask(filled),
            "identity_switch": fused.identity_switch,
            "scale_source": fused.scale.scale_source,
            "metres_per_unit": fused.scale.metres_per_unit if metric else None,
            "gravity_dir_world": [gravity] * len(fused.frame_idx),
            "reprojection_error_px": src["fit_residual_px"].mask(filled),
            "supporting_keypoints": src["fit_keypoints"].where(~filled, 0),
            "depth_source": src["depth_source"].where(~filled, "gap_fill"),
            "hand_size_factor": fused.size_factor,
            "hand_slot": src["hand_slot"].mask(filled),
        }
    )
    logger.info(
        "fused episode=%s rows=%d filled=%d identities=%s scale_source=%s", episode_id, len(out),
        int(fused.filled.sum()), sorted(set(out["identity"])), fused.scale.scale_source,
    )  # fmt: skip
    return out


def guarded_fuse_hands(frames: pd.DataFrame, hands: pd.DataFrame, opts: FusionOptions) -> pd.DataFrame:
    """`fuse_hands` for `cogroup(...).applyInPandas`; a failure becomes the episode's error row."""
    unit = frames if not frames.empty else hands
    return run_unit(lambda _: fuse_hands(frames, hands, opts), unit, HANDS_WORLD.columns)
