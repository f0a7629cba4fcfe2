"""Stage `fusion`: world-frame hands per episode (groupBy(episode_id), cogroup) into `hands_world`.

Inputs are light columns only: `frames` (times) joined with `camera_poses` (world_from_cam per
frame) and `videos.imu_path` / `imu_source` (the IMU sidecar or the video's GPMF track, read on the
executor by `udfs.media.imu.read_episode_imu`: metric scale and gravity), and
`hands_cam` (keypoints, fits). The episode's map, its `keyframe_poses` and `ba_points` rows, is
stacked under its posed frames (`_table`), with the `videos` paths and calibration on the keyframe
rows: the executor decodes a stereo partner's streams at a few keyframes for the stereo scale, and
the hands' scale looks for the surfaces the wearer's hands rest on among the points.
Design decision: this is one cogroup, not a stage or table of its own; a scale is a per-episode
number that only fusion uses, and the keyframes' poses and points are all it needs.
An episode without camera poses fails with the error "no camera poses" and gets no rows.
"""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, cogroup_per_episode, now, write_guarded
from jobs.tables import Layout, Lineage, exists, read
from schemas.tables import BA_POINTS, CAMERA_POSES, FRAMES, HANDS_CAM, HANDS_WORLD, KEYFRAME_POSES, VIDEOS
from udfs.fusion import KEYFRAME_MAP_COLUMNS, POSED_FRAME_COLUMNS, fuse_hands
from udfs.multi_output import TABLE_COLUMN

__all__ = ["NO_POSES", "STAGE", "process"]

logger = logging.getLogger(__name__)

#: The error of an episode that has no camera poses.
NO_POSES = "EgolakeError: no camera poses"


def _camera_poses(spark: SparkSession, layout: Layout, episodes: list[str]) -> DataFrame | None:
    """The episodes' camera poses (the columns fusion uses), or None when the table does not exist."""
    if not exists(layout, CAMERA_POSES):
        return None
    poses = read(spark, layout, CAMERA_POSES).where(F.col("episode_id").isin(episodes))
    columns = ["episode_id", "frame_idx", "world_from_cam_q_wxyz", "world_from_cam_t_mu"]
    optional = [c for c in ("scale_source", "pose_quality") if c in poses.columns]
    return poses.select(*columns, *optional)


def _map_rows(ctx: StageContext, episodes: list[str], videos: DataFrame) -> DataFrame | None:
    """The episodes' maps: `keyframe_poses` + `ba_points` rows, `_table` naming the table.

    Every episode's map when the hands' scale is on, else only those with a stereo partner (for the
    stereo scale); None when neither scale is on or ba wrote no tables.
    """
    fusion = ctx.cfg.fusion
    if not (fusion.stereo_scale.enabled or fusion.hand_scale.enabled) or not all(
        exists(ctx.layout, t) for t in (KEYFRAME_POSES, BA_POINTS)
    ):
        return None
    wanted = videos if fusion.hand_scale.enabled else videos.where(F.col("stereo_partner_path").isNotNull())
    stereo = wanted.select("episode_id", "source_path", "stereo_partner_path", "calibration_json")
    in_scope = F.col("episode_id").isin(episodes)
    keyframes = read(ctx.spark, ctx.layout, KEYFRAME_POSES).where(in_scope).join(stereo, "episode_id")
    points = read(ctx.spark, ctx.layout, BA_POINTS).where(in_scope).join(stereo, "episode_id", "left_semi")
    return (
        keyframes.select(*KEYFRAME_MAP_COLUMNS)
        .withColumn(TABLE_COLUMN, F.lit(KEYFRAME_POSES.name))
        .unionByName(
            points.select("episode_id", "point_idx", "x_in_world_mu").withColumn(
                TABLE_COLUMN, F.lit(BA_POINTS.name)
            ),
            allowMissingColumns=True,
        )
    )


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Fuse the episodes' hands with their camera poses and write `hands_world`."""
    started = now()
    poses = _camera_poses(ctx.spark, ctx.layout, episodes)
    if poses is None:
        logger.warning("fusion: table %s does not exist; %d episodes fail", CAMERA_POSES.name, len(episodes))
        return [EpisodeOutcome(e, "failed", 0, NO_POSES, started, now()) for e in episodes]
    posed_ids = {r["episode_id"] for r in poses.select("episode_id").distinct().collect()}
    in_scope = F.col("episode_id").isin(episodes)
    frames = read(ctx.spark, ctx.layout, FRAMES).where(in_scope).select("episode_id", "frame_idx", "ts_s")
    videos = read(ctx.spark, ctx.layout, VIDEOS).where(in_scope)
    imu = videos.select("episode_id", "imu_path", "imu_source")
    posed = frames.join(poses, ["episode_id", "frame_idx"], "inner").join(imu, "episode_id", "left")
    optional = [c for c in ("scale_source", "pose_quality", "imu_path", "imu_source") if c in posed.columns]
    posed = posed.select(*POSED_FRAME_COLUMNS, *optional)
    maps = _map_rows(ctx, episodes, videos)
    if maps is not None:
        posed = posed.unionByName(maps, allowMissingColumns=True)
    hands = read(ctx.spark, ctx.layout, HANDS_CAM).where(in_scope & F.col("episode_id").isin(list(posed_ids)))
    result = cogroup_per_episode(
        posed, hands.select(*HANDS_CAM.columns), episodes, partial(fuse_hands, opts=ctx.cfg.fusion),
        HANDS_WORLD.arrow, placement=ctx.placement,
    )  # fmt: skip
    # Every episode's old rows are replaced; those without poses get none and fail.
    outcomes = write_guarded(ctx, lineage, episodes, result, HANDS_WORLD)
    failed = {e: EpisodeOutcome(e, "failed", 0, NO_POSES, started, now()) for e in set(episodes) - posed_ids}
    return [failed.get(o.episode_id, o) for o in outcomes]


STAGE = Stage(
    name="fusion",
    version="6",
    upstream="completion",
    config_sections=("fusion",),
    outputs=(HANDS_WORLD,),
    process=process,
)
