"""Stage `hands`: find and fit hands in every frame (mapInPandas) into `hands_cam`.

A task's shards go through the estimator in lockstep (`hands.estimator.lockstep_shards`), so a GPU
gets batched network calls. Each task decodes its shards itself at the estimator's resolution:
estimation costs ~70 ms a frame and decoding ~1 ms, so sharing the priors stage's decode would save
little and couple the stages.
"""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, map_per_shard, write_guarded
from jobs.tables import Lineage, read
from schemas.tables import HANDS_CAM, SHARDS, VIDEOS
from udfs.hands import hands_for_shards

__all__ = ["STAGE"]

logger = logging.getLogger(__name__)


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Find the episodes' hands, one Spark task per shard, and write `hands_cam`."""
    shards = read(ctx.spark, ctx.layout, SHARDS).where(F.col("episode_id").isin(episodes))
    calibration = read(ctx.spark, ctx.layout, VIDEOS).select("episode_id", "calibration_json")
    units = shards.select(*SHARDS.columns).join(F.broadcast(calibration), "episode_id", "left")
    unit = partial(hands_for_shards, opts=ctx.cfg.hands, decode=ctx.cfg.priors.decode)
    result = map_per_shard(ctx, units, unit, HANDS_CAM.arrow, ctx.cfg.hands.estimator.lockstep_shards)
    return write_guarded(ctx, lineage, episodes, result, HANDS_CAM)


STAGE = Stage(
    name="hands",
    version="1",
    upstream="priors",
    config_sections=("hands",),
    outputs=(HANDS_CAM,),
    process=process,
)
