"""Stages `tracking`, `ba` and `completion`: camera poses per episode (groupBy(episode_id).applyInPandas).

One module for the three because they share the same shape: read a few tables for a batch of
episodes, stack them into one frame per episode (`udfs.multi_output`), run a unit function of
`udfs.tracking` under `udfs.guard`, write the stacked outputs with `write_guarded`. Only light
columns travel: KLT ids and positions, poses, map points; no stage here decodes video.

- tracking: `features` (linked across shards, hand boxes of `hands_cam` removed when that table
  exists) -> `tracks`, `cameras`, `keyframes`, `map_points`.
- ba: `cameras`, `tracks`, `keyframes`, `map_points` -> `keyframe_poses`, `ba_points`, `ba_cameras`
  (the camera after BA: a focal that is not calibrated is refined there).
- completion: `ba_cameras`, `tracks`, `keyframe_poses`, `map_points`, `ba_points`, `features`, `frames`
  -> `camera_poses` (a pose for every frame).
"""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.stage import (
    EpisodeOutcome,
    Stage,
    StageContext,
    apply_per_episode,
    read_stacked,
    write_guarded,
)
from jobs.tables import Lineage, exists, read
from schemas.tables import CAMERA_POSES, FEATURES, FRAMES, HANDS_CAM, VIDEOS
from udfs.tracking import (
    BA_INPUTS,
    BA_OUTPUTS,
    COMPLETION_INPUTS,
    FEATURE_VIEW,
    TRACKING_OUTPUTS,
    ba_unit,
    completion_unit,
    tracking_unit,
)

__all__ = ["BA", "COMPLETION", "TRACKING"]

logger = logging.getLogger(__name__)


def _feature_view(ctx: StageContext, episodes: list[str]) -> DataFrame:
    """`FEATURE_VIEW` rows of `episodes`: features + calibration + decoded size + hand boxes."""
    mine = F.col("episode_id").isin(episodes)
    feats = read(ctx.spark, ctx.layout, FEATURES).where(mine).select(*FEATURES.columns)
    calib = read(ctx.spark, ctx.layout, VIDEOS).where(mine).select("episode_id", "calibration_json")
    size = (
        read(ctx.spark, ctx.layout, FRAMES)
        .where(mine)
        .groupBy("episode_id")
        .agg(F.max("width").alias("width"), F.max("height").alias("height"))
    )
    view = feats.join(calib, "episode_id", "left").join(size, "episode_id", "left")
    if exists(ctx.layout, HANDS_CAM):
        boxes = (
            read(ctx.spark, ctx.layout, HANDS_CAM)
            .where(mine & F.col("box_px").isNotNull())
            .groupBy("episode_id", "frame_idx")
            .agg(F.flatten(F.collect_list("box_px")).alias("hand_boxes_px"))
        )
        view = view.join(boxes, ["episode_id", "frame_idx"], "left")
    else:  # the hook is a no-op until the hands stage has written hands_cam
        view = view.withColumn("hand_boxes_px", F.lit(None).cast("array<float>"))
    return view.select(*FEATURE_VIEW.columns)


def _process_tracking(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Link features across shards, mask hands, track each episode; write the tracking tables."""
    unit = partial(tracking_unit, opts=ctx.cfg.tracking)
    return write_guarded(
        ctx,
        lineage,
        episodes,
        apply_per_episode(_feature_view(ctx, episodes), episodes, unit, TRACKING_OUTPUTS, ctx.placement),
        *TRACKING_OUTPUTS,
    )


def _process_ba(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Bundle-adjust each episode's keyframes; write `keyframe_poses`, `ba_points` and `ba_cameras`."""
    unit = partial(ba_unit, opts=ctx.cfg.completion)
    inputs = read_stacked(ctx, episodes, BA_INPUTS, {})
    result = apply_per_episode(inputs, episodes, unit, BA_OUTPUTS, ctx.placement)
    return write_guarded(ctx, lineage, episodes, result, *BA_OUTPUTS)


def _process_completion(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Give every frame a pose; write `camera_poses`."""
    unit = partial(completion_unit, opts=ctx.cfg.completion, tracking=ctx.cfg.tracking)
    given = {FEATURE_VIEW.name: _feature_view(ctx, episodes)}
    inputs = read_stacked(ctx, episodes, COMPLETION_INPUTS, given)
    result = apply_per_episode(inputs, episodes, unit, (CAMERA_POSES,), ctx.placement)
    return write_guarded(ctx, lineage, episodes, result, CAMERA_POSES)


TRACKING = Stage(
    name="tracking",
    version="2",  # 2: map-unit columns named `_mu` (world_from_cam_t_mu, x_in_world_mu)
    upstream="hands",
    config_sections=("tracking",),
    outputs=TRACKING_OUTPUTS,
    process=_process_tracking,
)
BA = Stage(
    name="ba",
    version="2",  # 2: refines a prior focal, writes ba_cameras
    upstream="tracking",
    config_sections=("completion",),
    outputs=BA_OUTPUTS,
    process=_process_ba,
)
COMPLETION = Stage(
    name="completion",
    version="3",  # 2: reads the camera from ba_cameras; 3: the camera path's motion model
    upstream="ba",
    config_sections=("completion",),
    outputs=(CAMERA_POSES,),
    process=_process_completion,
)
