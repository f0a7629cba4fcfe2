"""Stage `priors`: decode every shard once (mapInPandas) and write the light `frames` table."""

from __future__ import annotations

from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, write_guarded
from jobs.tables import Lineage, read
from schemas.base import spark_schema
from schemas.tables import FRAMES, SHARDS
from udfs.guard import guarded_map, guarded_schema
from udfs.priors import frames_for_shard

__all__ = ["STAGE"]


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Decode the episodes' shards, one Spark task per shard, and write `frames`."""
    shards = read(ctx.spark, ctx.layout, SHARDS).where(F.col("episode_id").isin(episodes))
    shards = shards.select(*SHARDS.columns)
    n_tasks = max(1, min(shards.count(), 4 * ctx.spark.sparkContext.defaultParallelism))
    fn = guarded_map(
        partial(frames_for_shard, decode=ctx.cfg.priors.decode), FRAMES.columns, ("episode_id", "shard_idx")
    )
    result = shards.repartition(n_tasks, "episode_id", "shard_idx").mapInPandas(
        fn, spark_schema(guarded_schema(FRAMES.arrow))
    )
    return write_guarded(ctx, lineage, episodes, result, FRAMES)


STAGE = Stage(
    name="priors",
    version="1",
    upstream="ingest",
    config_sections=("priors",),
    outputs=(FRAMES,),
    process=process,
)
