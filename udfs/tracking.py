"""Camera-pose unit functions, one episode each: tracking, global BA, completion (pandas in and out).

Each is called by a `groupBy(episode_id).applyInPandas` stage (`jobs.camera_poses`) through
`udfs.guard`, and can be called on pandas frames without Spark. Inputs and outputs stack several
tables (`udfs.multi_output`); only light columns travel (ids, pixel positions, poses), never pixels.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa

from pose_core.camera_poses.completion import (
    CompletionOptions,
    PoseQuality,
    bundle_adjust_keyframes,
    complete_poses,
)
from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.self_calibration import track_self_calibrated
from schemas import TableSchema
from schemas.tables import (
    BA_CAMERAS,
    BA_POINTS,
    CAMERAS,
    FEATURES,
    FRAMES,
    KEYFRAME_POSES,
    KEYFRAMES,
    MAP_POINTS,
    TRACKS,
)
from udfs.camera_tables import (
    camera_for_frames,
    camera_from_row,
    camera_row,
    keyframe_rows,
    point_rows,
    points_from_rows,
    pose_columns,
    state_names,
    tracking_result_from_rows,
)
from udfs.feature_links import link_shards
from udfs.multi_output import split_tables, stack_tables
from udfs.options import CameraTrackingOptions

__all__ = [
    "BA_INPUTS",
    "BA_OUTPUTS",
    "COMPLETION_INPUTS",
    "FEATURE_VIEW",
    "TRACKING_OUTPUTS",
    "ba_unit",
    "completion_unit",
    "episode_features",
    "feature_view_of",
    "tracking_unit",
]

logger = logging.getLogger(__name__)


FEATURE_VIEW = TableSchema(
    name="feature_view",
    version="1",
    key=FEATURES.key,
    partition_key="episode_id",
    lineage=False,
    arrow=pa.schema(
        [
            *FEATURES.arrow,
            pa.field("calibration_json", pa.string()),  # `videos.calibration_json`
            pa.field("width", pa.int32()),  # decoded frame size (`frames`)
            pa.field("height", pa.int32()),
            # (u0, v0, u1, v1) per hand, flat, pixels; null: no hand known in the frame
            pa.field("hand_boxes_px", pa.list_(pa.float32())),
        ]
    ),
)

TRACKING_OUTPUTS: tuple[TableSchema, ...] = (TRACKS, CAMERAS, KEYFRAMES, MAP_POINTS)
BA_INPUTS: tuple[TableSchema, ...] = (CAMERAS, TRACKS, KEYFRAMES, MAP_POINTS)
BA_OUTPUTS: tuple[TableSchema, ...] = (KEYFRAME_POSES, BA_POINTS, BA_CAMERAS)
COMPLETION_INPUTS: tuple[TableSchema, ...] = (
    FEATURE_VIEW,
    FRAMES,
    BA_CAMERAS,
    TRACKS,
    KEYFRAME_POSES,
    MAP_POINTS,
    BA_POINTS,
)


def feature_view_of(
    features: pd.DataFrame, frames: pd.DataFrame, hands_cam: pd.DataFrame, calibration_json: str | None
) -> pd.DataFrame:
    """One episode's `FEATURE_VIEW` columns from its tables' rows, as the tracking stage joins them in Spark.

    The frame size is the largest decoded one; a frame's hand boxes are all its `hands_cam` boxes, flat
    (None where it has none): the pandas twin of `jobs.camera_poses`' view, for Spark-free runs.
    Returns `features` (row order kept) with `calibration_json`, `width`, `height` and `hand_boxes_px`.
    """
    boxes = (
        hands_cam.dropna(subset=["box_px"])
        .groupby("frame_idx")["box_px"]
        .agg(lambda b: np.concatenate(list(b)).astype(np.float32))
    )
    return features.assign(
        calibration_json=calibration_json,
        width=np.int32(frames["width"].max()),
        height=np.int32(frames["height"].max()),
        hand_boxes_px=[b if isinstance(b, np.ndarray) else None for b in features["frame_idx"].map(boxes)],
    )


def episode_features(view: pd.DataFrame, link_max_px: float, hand_margin_px: float) -> list[FrameFeatures]:
    """An episode's features, frames 0..F-1, ids linked across shards, features in hand boxes dropped.

    Args:
        view: the episode's `FEATURE_VIEW` rows (every shard, overlap frames included).
        link_max_px: see `udfs.feature_links.link_shards`.
        hand_margin_px: hand boxes grow by this many pixels per side.
    """
    shards = []
    for _, rows in view.sort_values(["shard_idx", "frame_idx"]).groupby("shard_idx", sort=True):
        feats = {
            int(f): FrameFeatures.from_flat(int(f), np.asarray(ids, np.int64), np.asarray(uv, np.float32), d)
            for f, ids, uv, d in zip(
                rows["frame_idx"], rows["track_ids"], rows["uv_px"], rows["descriptors"], strict=True
            )
        }
        owned = rows.loc[rows["owned"], "frame_idx"]
        shards.append((feats, int(owned.min()), int(owned.max()) + 1))
    linked, links = link_shards(shards, link_max_px)
    logger.info(
        "episode %s: %d frames, %d shards, %d links",
        view["episode_id"].iat[0],
        len(linked),
        len(shards),
        links,
    )
    owned_rows = view[view["owned"]].set_index("frame_idx")
    return [
        _drop_in_boxes(feat, owned_rows.at[feat.frame_idx, "hand_boxes_px"], hand_margin_px)
        for feat in linked
    ]


def _drop_in_boxes(feat: FrameFeatures, boxes_flat: object, margin_px: float) -> FrameFeatures:
    """`feat` without the features inside any box ``(u0, v0, u1, v1)`` grown by `margin_px`."""
    if boxes_flat is None or len(boxes_flat) == 0:  # type: ignore[arg-type]
        return feat
    boxes = np.asarray(boxes_flat, np.float64).reshape(-1, 4)
    u, v = feat.uv_px[:, 0, None], feat.uv_px[:, 1, None]
    inside = (
        (u >= boxes[:, 0] - margin_px)
        & (u <= boxes[:, 2] + margin_px)
        & (v >= boxes[:, 1] - margin_px)
        & (v <= boxes[:, 3] + margin_px)
    ).any(axis=1)
    return feat.select(~inside)


def tracking_unit(view: pd.DataFrame, opts: CameraTrackingOptions) -> pd.DataFrame:
    """Track one episode: `FEATURE_VIEW` rows in, `TRACKING_OUTPUTS` stacked out.

    Args:
        view: the episode's `FEATURE_VIEW` rows.
        opts: linking, masking and tracking options.
    """
    episode = view["episode_id"].iat[0]
    first = view.iloc[0]
    camera = camera_for_frames(first.calibration_json, int(first.width), int(first.height))
    features = episode_features(view, opts.link_max_px, opts.hand_margin_px)
    result, camera = track_self_calibrated(features, camera, opts.tracker, opts.self_calibration)
    q, t = pose_columns(result.world_from_cam)
    tracks = pd.DataFrame(
        {
            "episode_id": episode,
            "frame_idx": np.arange(len(result.state), dtype=np.int64),
            "tracking_state": state_names(result.state),
            "segment_id": result.segment_id,
            "is_keyframe": result.is_keyframe,
            "num_features": np.array([len(f.track_ids) for f in features], np.int32),
            "num_inliers": result.num_inliers,
            "reproj_error_px": result.reproj_error_px.astype(np.float32),
            "world_from_cam_q_wxyz": q,
            "world_from_cam_t_mu": t,
        }
    )
    return stack_tables(
        [
            (TRACKS, tracks),
            (CAMERAS, camera_row(episode, camera)),
            (KEYFRAMES, keyframe_rows(episode, result.keyframes, result.segment_id)),
            (
                MAP_POINTS,
                point_rows(episode, result.points_in_world, result),
            ),
        ]
    )


def ba_unit(stacked: pd.DataFrame, opts: CompletionOptions) -> pd.DataFrame:
    """Global BA of one episode's keyframes: `BA_INPUTS` stacked in, `BA_OUTPUTS` stacked out.

    A focal that is not calibrated (`cameras.intrinsics_source` prior | metadata) is refined when the
    motion determines it (`opts.refine_focal`); `ba_cameras` records the camera the outputs agree with.
    """
    t = split_tables(stacked, BA_INPUTS)
    episode = stacked["episode_id"].iat[0]
    camera = camera_from_row(t[CAMERAS.name])
    result = tracking_result_from_rows(
        t[TRACKS.name], t[KEYFRAMES.name], t[MAP_POINTS.name], points_from_rows(t[MAP_POINTS.name])
    )
    ba = bundle_adjust_keyframes(result, camera, opts)
    logger.info(
        "episode %s: global BA of %d keyframes, %d solves, converged %d, focal %.1f -> %.1f px (%s)",
        episode,
        len(result.keyframes),
        len(ba.solves),
        sum(r.converged for r in ba.solves),
        camera.focal_px,
        ba.camera.focal_px,
        ba.focal_status,
    )
    cameras = camera_row(episode, ba.camera).assign(
        focal_prior_px=camera.focal_px,
        focal_std_px=None if np.isnan(ba.focal_std_px) else ba.focal_std_px,
        focal_status=ba.focal_status,
        radial_std=None if np.isnan(ba.radial_k1_std) else ba.radial_k1_std,
        radial_status=ba.radial_status,
    )
    return stack_tables(
        [
            (KEYFRAME_POSES, keyframe_rows(episode, result.keyframes, result.segment_id)),
            (BA_POINTS, point_rows(episode, result.points_in_world)),
            (BA_CAMERAS, cameras),
        ]
    )


def completion_unit(
    stacked: pd.DataFrame, opts: CompletionOptions, tracking: CameraTrackingOptions
) -> pd.DataFrame:
    """A pose for every frame of one episode: `COMPLETION_INPUTS` stacked in, `camera_poses` rows out.

    Args:
        stacked: the episode's input tables, stacked.
        opts: completion options.
        tracking: the tracking options, to rebuild the features tracking consumed.
    """
    t = split_tables(stacked, COMPLETION_INPUTS)
    episode = stacked["episode_id"].iat[0]
    camera = camera_from_row(t[BA_CAMERAS.name])  # the focal global BA refined, if it did
    features = episode_features(t[FEATURE_VIEW.name], tracking.link_max_px, tracking.hand_margin_px)
    result = tracking_result_from_rows(
        t[TRACKS.name], t[KEYFRAME_POSES.name], t[MAP_POINTS.name], points_from_rows(t[BA_POINTS.name])
    )
    done = complete_poses(result, features, camera, opts)
    q, tr = pose_columns(done.world_from_cam)
    ts = t[FRAMES.name].set_index("frame_idx")["ts_s"].reindex(np.arange(len(done.quality))).to_numpy()
    return pd.DataFrame(
        {
            "episode_id": episode,
            "frame_idx": np.arange(len(done.quality), dtype=np.int64),
            "ts_s": ts,
            "world_from_cam_q_wxyz": q,
            "world_from_cam_t_mu": tr,
            "pose_quality": [PoseQuality(int(x)).name.lower() for x in done.quality],
            "tracking_state": state_names(done.tracking_state),
            "segment_id": done.segment_id,
            "is_keyframe": done.is_keyframe,
            "num_inliers": done.num_inliers,
            "reproj_error_px": done.reproj_error_px.astype(np.float32),
        }
    )
