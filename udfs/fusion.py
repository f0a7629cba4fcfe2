"""Per-episode hand fusion: `hands_cam` rows and posed frames in, `hands_world` rows out.

Called by the `fusion` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two
light frames per episode (no pixels): the posed frames (`frames` joined with `camera_poses`, plus the
episode's map, its `keyframe_poses` and `ba_points` rows, stacked under `_table`) and the episode's
`hands_cam` rows. Callable on pandas frames without Spark.

Metric scale candidates, most trusted first: the stereo pair (the executor decodes both streams at a
few keyframes and compares the stereo depth of the keyframes' map points with their map depth), the
episode's IMU (its `.imu.csv` sidecar or its video's GoPro GPMF track:
`udfs.media.imu.read_episode_imu`) and the wearer's hands resting on the map's surfaces
(`pose_core.hands.contact_scale`: map points seen in enough keyframes). Each comes with its
relative standard error, written as `metres_per_unit_std`.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd

from pose_core.camera_poses.completion import PoseQuality
from pose_core.camera_poses.scale import ImuScale, scale_from_imu
from pose_core.camera_poses.stereo import (
    StereoMatcher,
    StereoRig,
    StereoScale,
    StereoView,
    right_from_left_of_baseline,
    stereo_scale,
)
from pose_core.errors import EgolakeError, InputError
from pose_core.geometry.rigid3 import matrix_from_quat_wxyz
from pose_core.hands import EpisodeFrames, EpisodeObservations, FusedHands, FusionOptions, fuse_episode
from pose_core.hands.contact_scale import HandScale
from pose_core.hands.fusion import SCALE_SOURCES, ScaleCandidate, ScaleSource
from schemas.tables import BA_POINTS, HANDS_WORLD, KEYFRAME_POSES
from udfs.camera_tables import camera_for_frames, world_from_cam_from_columns
from udfs.columns import list_column
from udfs.media.decode import iter_frames
from udfs.media.imu import read_episode_imu
from udfs.multi_output import TABLE_COLUMN
from udfs.options import DecodeOptions

__all__ = [
    "KEYFRAME_MAP_COLUMNS",
    "MAP_TABLES",
    "MEASURED_QUALITIES",
    "POSED_FRAME_COLUMNS",
    "episode_imu_scale",
    "fuse_hands",
    "fuse_hands_detailed",
    "map_points",
]

logger = logging.getLogger(__name__)

#: Columns of the posed-frame input. Optional: `scale_source` (the camera poses' metric scale: when
#: one of `SCALE_SOURCES`, `world_from_cam_t_mu` is taken as metres), `imu_path` and `imu_source`
#: (the episode's IMU, `videos.imu_path` / `imu_source`: the sidecar, or the video for its GPMF
#: track; a metric scale candidate and the gravity direction) and `pose_quality` (only frames of
#: `MEASURED_QUALITIES` give the IMU scale position equations).
POSED_FRAME_COLUMNS: tuple[str, ...] = (
    "episode_id", "frame_idx", "ts_s", "world_from_cam_q_wxyz", "world_from_cam_t_mu",
)  # fmt: skip

#: Tables whose rows may be stacked (`_table`) under the posed frames: the episode's map, its
#: `keyframe_poses` (with `KEYFRAME_MAP_COLUMNS`) and `ba_points` (`point_idx`, `x_in_world_mu`).
MAP_TABLES: tuple[str, ...] = (KEYFRAME_POSES.name, BA_POINTS.name)

#: Columns of the stacked `keyframe_poses` rows: the keyframe's pose and observations, and the
#: episode's `videos` columns that locate and calibrate a stereo pair (null without a partner).
KEYFRAME_MAP_COLUMNS: tuple[str, ...] = (
    "episode_id", "frame_idx", "world_from_cam_q_wxyz", "world_from_cam_t_mu", "obs_point_idx", "obs_xy",
    "source_path", "stereo_partner_path", "calibration_json",
)  # fmt: skip

#: Pose qualities whose camera centre was measured (not held or interpolated).
MEASURED_QUALITIES: tuple[str, ...] = (
    PoseQuality.KEYFRAME.name.lower(),
    PoseQuality.MOTION_ONLY.name.lower(),
)


def _episode_frames(frames: pd.DataFrame, hands: pd.DataFrame) -> EpisodeFrames:
    """Posed frames (rows with a pose) in frame order, with the intrinsics of the hand fits.

    A frame's centre counts as measured when its `pose_quality` is one of `MEASURED_QUALITIES` (every
    frame's without the column).
    """
    posed = frames[frames["world_from_cam_q_wxyz"].notna() & frames["world_from_cam_t_mu"].notna()]
    posed = posed.sort_values("frame_idx")
    if posed.empty:
        raise EgolakeError("no camera poses for this episode's frames")
    world_from_cam = np.tile(np.eye(4), (len(posed), 1, 1))
    world_from_cam[:, :3, :3] = matrix_from_quat_wxyz(list_column(posed["world_from_cam_q_wxyz"], 4))
    world_from_cam[:, :3, 3] = list_column(posed["world_from_cam_t_mu"], 3)
    fx, fy, cx, cy = np.asarray(hands["intrinsics_px"].iat[0], np.float64)
    measured = posed["pose_quality"].isin(MEASURED_QUALITIES).to_numpy() if "pose_quality" in posed else None
    return EpisodeFrames(
        frame_idx=posed["frame_idx"].to_numpy(np.int64),
        ts_s=posed["ts_s"].to_numpy(np.float64),
        world_from_cam=world_from_cam,
        camera_k=np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]),
        image_size=(int(hands["image_width"].iat[0]), int(hands["image_height"].iat[0])),
        measured=measured,
    )


def _observations(hands: pd.DataFrame) -> EpisodeObservations:
    right = (hands["handedness"] == "right").to_numpy()
    p_hand = hands["handedness_score"].to_numpy(np.float64)
    return EpisodeObservations(
        frame_idx=hands["frame_idx"].to_numpy(np.int64),
        keypoints_px=list_column(hands["keypoints_px"], 42).reshape(-1, 21, 2),
        keypoints_cam=list_column(hands["keypoints_cam_m"], 63).reshape(-1, 21, 3),
        score=hands["score"].to_numpy(np.float64),
        p_right=np.where(right, p_hand, 1.0 - p_hand),
        residual_px=hands["fit_residual_px"].to_numpy(np.float64),
        model_palm_size_m=hands["model_palm_size_m"].to_numpy(np.float64),
        calibrated=bool((hands["intrinsics_source"] == "sidecar").all()) if len(hands) else False,
    )


def episode_imu_scale(frames: pd.DataFrame, posed: EpisodeFrames, opts: FusionOptions) -> ImuScale | None:
    """The IMU's scale and gravity for the posed frames; None without an IMU (or disabled).

    Frames whose camera centre was held or interpolated (`pose_quality` rotation_only /
    interpolated) keep their rotation but give no position equations.

    Args:
        frames: the posed-frame input (`frame_idx`; optional `imu_path`, `imu_source`, `pose_quality`).
        posed: the episode's posed frames (`_episode_frames`).
        opts: fusion settings (`imu_scale`).

    Raises:
        InputError: the sidecar named by `imu_path` cannot be read (the message names the file).
        MetadataError: the video's GPMF track (`imu_source` gpmf) gives no usable IMU.
    """
    with_imu = frames.dropna(subset=["imu_path"]) if "imu_path" in frames else frames.iloc[:0]
    if with_imu.empty or not opts.imu_scale.enabled:
        return None
    source = with_imu["imu_source"].iat[0] if "imu_source" in with_imu else None
    imu = read_episode_imu(str(with_imu["imu_path"].iat[0]), None if pd.isna(source) else str(source))
    measured = None
    if "pose_quality" in frames:
        quality = frames.set_index("frame_idx")["pose_quality"].reindex(posed.frame_idx)
        measured = quality.isin(MEASURED_QUALITIES).to_numpy()
    return scale_from_imu(
        posed.ts_s, posed.world_from_cam, imu[:, 0], imu[:, 1:4], imu[:, 4:7], opts.imu_scale, measured
    )


def _right_from_left(calibration_json: str | None) -> np.ndarray | None:
    """The rig's `right_from_left` `(4, 4)` from the calibration (or its `baseline_m`); None: unknown."""
    if not isinstance(calibration_json, str):
        return None
    calib = json.loads(calibration_json)
    if calib.get("right_from_left") is not None:
        return np.asarray(calib["right_from_left"], np.float64)
    if calib.get("baseline_m") is not None:
        return right_from_left_of_baseline(float(calib["baseline_m"]))
    return None


def _decode_at(path: str, wanted: set[int], max_long_side_px: int) -> dict[int, np.ndarray]:
    """The frames `wanted` of a video or image folder, decoded in one pass, `{frame_idx: (H, W, 3)}`.

    Raises:
        InputError: the stream cannot be decoded (named), or it ends before the last wanted frame.
    """
    out: dict[int, np.ndarray] = {}
    decode = DecodeOptions(max_long_side_px=max_long_side_px)
    for chunk in iter_frames(path, min(wanted), max(wanted) + 1, decode):
        out.update(
            {int(i): f for i, f in zip(chunk.frame_idx, chunk.frames, strict=True) if int(i) in wanted}
        )
    if len(out) < len(wanted):
        raise InputError("stereo_mismatch", f"frame {min(wanted - set(out))} cannot be decoded", path)
    return out


def _stereo_scale(rows: pd.DataFrame, opts: FusionOptions) -> StereoScale | None:
    """The stereo pair's scale from the stacked `keyframe_poses` + `ba_points` rows; None without them.

    Up to `max_keyframes` keyframes, evenly spread, are decoded from both streams at
    `max_long_side_px`; the right camera has the left one's intrinsics (the sidecar describes one).

    Raises:
        InputError: a stream cannot be decoded, or the right frames differ in size (naming the file).
    """
    so = opts.stereo_scale
    if rows.empty or not so.enabled or "stereo_partner_path" not in rows:
        return None
    keyframes = rows[(rows[TABLE_COLUMN] == KEYFRAME_POSES.name) & rows["world_from_cam_t_mu"].notna()]
    keyframes = keyframes[keyframes["stereo_partner_path"].notna()]
    if keyframes.empty:
        return None
    first = keyframes.iloc[0]
    right_from_left = _right_from_left(first["calibration_json"])
    if right_from_left is None:
        reason = "the calibration sidecar is missing or has neither baseline_m nor right_from_left"
        return StereoScale(None, float("inf"), float("inf"), 0, 0, reason)
    keyframes = keyframes.sort_values("frame_idx")
    pick = np.unique(np.linspace(0, len(keyframes) - 1, min(so.max_keyframes, len(keyframes))).round())
    keyframes = keyframes.iloc[pick.astype(int)]
    wanted = set(keyframes["frame_idx"].astype(int))
    left = _decode_at(str(first["source_path"]), wanted, so.max_long_side_px)
    right = _decode_at(str(first["stereo_partner_path"]), wanted, so.max_long_side_px)
    (height, width), right_size = (next(iter(d.values())).shape[:2] for d in (left, right))
    if right_size != (height, width):
        message = f"right frames decode to {right_size[::-1]}, left ones to {(width, height)}"
        raise InputError("stereo_mismatch", message, str(first["stereo_partner_path"]))
    camera = camera_for_frames(first["calibration_json"], width, height)
    matcher = StereoMatcher(StereoRig(camera, camera, right_from_left), so.disparity)
    points = rows[rows[TABLE_COLUMN] == BA_POINTS.name].set_index("point_idx")["x_in_world_mu"]
    poses = world_from_cam_from_columns(keyframes["world_from_cam_q_wxyz"], keyframes["world_from_cam_t_mu"])
    views = []
    for pose, (_, kf) in zip(poses, keyframes.iterrows(), strict=True):
        idx = np.asarray(kf["obs_point_idx"], np.int64)
        known = np.isin(idx, points.index.to_numpy())
        xy = np.asarray(kf["obs_xy"], np.float64).reshape(-1, 2)[known]
        frame = int(kf["frame_idx"])
        views.append(StereoView(left[frame], right[frame], pose, xy, list_column(points.loc[idx[known]], 3)))
    return stereo_scale(matcher, views, so)


def map_points(rows: pd.DataFrame, min_observations: int) -> np.ndarray | None:
    """The map's points seen in at least `min_observations` keyframes, world frame, map units, `(P, 3)`.

    Args:
        rows: the stacked map rows (`MAP_TABLES` in `_table`): `ba_points` (`point_idx`,
            `x_in_world_mu`) and `keyframe_poses` (`obs_point_idx`).
        min_observations: fewest keyframes that must have seen a point.

    Returns:
        The points; None when the episode has no `ba_points` rows.
    """
    points = rows[rows[TABLE_COLUMN] == BA_POINTS.name] if TABLE_COLUMN in rows else rows.iloc[:0]
    if points.empty:
        return None
    keyframes = rows[rows[TABLE_COLUMN] == KEYFRAME_POSES.name]
    seen = [np.asarray(v, np.int64) for v in keyframes["obs_point_idx"].dropna()] if len(keyframes) else []
    ids, counts = np.unique(np.concatenate(seen), return_counts=True) if seen else (np.zeros(0), np.zeros(0))
    count = pd.Series(counts, index=ids).reindex(points["point_idx"].to_numpy(np.int64)).fillna(0)
    kept = points[(count >= min_observations).to_numpy()]
    return list_column(kept["x_in_world_mu"], 3)


def _scale_candidates(
    frames: pd.DataFrame, imu: ImuScale | None, stereo: StereoScale | None
) -> dict[ScaleSource, ScaleCandidate]:
    """Scale candidates with their relative standard errors: poses already metric, the stereo pair, the IMU.

    Poses already metric (a `scale_source` column) have no standard error (unknown).
    """
    sources = frames["scale_source"].dropna().unique() if "scale_source" in frames else []
    candidates: dict[ScaleSource, ScaleCandidate] = {
        s: ScaleCandidate(1.0) for s in sources if s in SCALE_SOURCES
    }
    if stereo is not None:
        candidates.setdefault("stereo", ScaleCandidate(stereo.metres_per_unit, stereo.rel_std))
    if imu is not None:
        candidates.setdefault("imu", ScaleCandidate(imu.metres_per_unit, imu.rel_std))
    return candidates


def fuse_hands(frames: pd.DataFrame, hands: pd.DataFrame, opts: FusionOptions) -> pd.DataFrame:
    """`hands_world` rows of one episode (`fuse_hands_detailed` without the details)."""
    return fuse_hands_detailed(frames, hands, opts)[0]


def fuse_hands_detailed(
    frames: pd.DataFrame, hands: pd.DataFrame, opts: FusionOptions
) -> tuple[pd.DataFrame, FusedHands | None]:
    """`hands_world` rows of one episode, and the fusion's arrays (scales and moments included).

    Args:
        frames: the episode's frames with their camera poses (`POSED_FRAME_COLUMNS`, optional
            `scale_source`, `imu_path`, `imu_source`, `pose_quality`); rows without a pose are
            ignored. The episode's `keyframe_poses` and `ba_points` rows may be stacked under them
            (`MAP_TABLES` in `_table`; the posed frames' `_table` is null): the stereo scale (with a
            partner) and the hands' scale use them.
        hands: the episode's `hands_cam` rows.
        opts: fusion settings.

    Returns:
        (One row per (frame, identity), observed or filled; the fused hands, None without hands).

    Raises:
        EgolakeError: no frame of the episode has a camera pose.
        InputError: the episode's IMU sidecar or a stereo stream cannot be read.
        MetadataError: the episode's GPMF track gives no usable IMU.
    """
    if hands.empty:
        return pd.DataFrame(columns=HANDS_WORLD.columns), None
    episode_id = hands["episode_id"].iat[0]
    hands = hands.reset_index(drop=True)
    stacked = (
        frames[TABLE_COLUMN].isin(MAP_TABLES) if TABLE_COLUMN in frames else pd.Series(False, frames.index)
    )
    frames, map_rows = frames[~stacked], frames[stacked]
    posed = _episode_frames(frames, hands)
    stereo = _stereo_scale(map_rows, opts)
    if stereo is not None:
        logger.info(
            "stereo scale episode=%s metres_per_unit=%s rel_spread=%.4f rel_std=%.4f points=%d keyframes=%d "
            "reason=%s",
            episode_id, stereo.metres_per_unit, stereo.rel_spread, stereo.rel_std, stereo.points_used,
            stereo.keyframes_used, stereo.reason,
        )  # fmt: skip
    imu = episode_imu_scale(frames, posed, opts)
    if imu is not None:
        logger.info(
            "IMU scale episode=%s metres_per_unit=%s offset_s=%.4f excitation=%.3f rel_std=%.4f reason=%s",
            episode_id, imu.metres_per_unit, imu.time_offset_s, imu.excitation_m_s2, imu.rel_std, imu.reason,
        )  # fmt: skip
    points = map_points(map_rows, opts.hand_scale.min_point_observations)
    fused = fuse_episode(posed, _observations(hands), opts, _scale_candidates(frames, imu, stereo), points)
    _log_hand_scale(episode_id, fused.hand_scale)
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
            "metres_per_unit_std": fused.scale.metres_per_unit_std if metric else None,
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
    return out, fused


def _log_hand_scale(episode_id: str, scale: HandScale | None) -> None:
    if scale is not None:
        logger.info(
            "hand scale episode=%s metres_per_unit=%s rel_std=%.4f rel_std_fit=%.4f moments=%d in_contact=%d "
            "observations_with_plane=%d reason=%s", episode_id, scale.metres_per_unit, scale.rel_std,
            scale.rel_std_fit, len(scale.moments), scale.moments_in_contact, scale.observations_with_plane,
            scale.reason,
        )  # fmt: skip
