"""Stage `priors`: decode every shard once (mapInPandas) and write `frames` and `features`."""

from __future__ import annotations

from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, write_guarded
from jobs.tables import Lineage, read
from schemas.base import spark_schema
from schemas.tables import FEATURES, FRAMES, SHARDS
from udfs.guard import guarded_map, guarded_schema
from udfs.multi_output import union_schema
from udfs.priors import shard_outputs

__all__ = ["STAGE"]


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Decode the episodes' shards, one Spark task per shard, and write `frames` and `features`."""
    shards = read(ctx.spark, ctx.layout, SHARDS).where(F.col("episode_id").isin(episodes))
    shards = shards.select(*SHARDS.columns)
    n_tasks = max(1, min(shards.count(), 4 * ctx.spark.sparkContext.defaultParallelism))
    out_schema = union_schema([FRAMES, FEATURES])
    fn = guarded_map(
        partial(shard_outputs, decode=ctx.cfg.priors.decode, features=ctx.cfg.priors.features),
        out_schema.names,
        ("episode_id", "shard_idx"),
    )
    result = shards.repartition(n_tasks, "episode_id", "shard_idx").mapInPandas(
        fn, spark_schema(guarded_schema(out_schema))
    )
    return write_guarded(ctx, lineage, episodes, result, FRAMES, FEATURES)


STAGE = Stage(
    name="priors",
    version="2",
    upstream="ingest",
    config_sections=("priors",),
    outputs=(FRAMES, FEATURES),
    process=process,
)
