"""Stage `priors`: decode every shard once (mapInPandas) and write `frames` and `features`."""

from __future__ import annotations

from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, map_per_shard, write_guarded
from jobs.tables import Lineage, read
from schemas.tables import FEATURES, FRAMES, SHARDS
from udfs.multi_output import union_schema
from udfs.priors import shard_outputs

__all__ = ["STAGE"]


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Decode the episodes' shards, one Spark task per shard, and write `frames` and `features`."""
    shards = read(ctx.spark, ctx.layout, SHARDS).where(F.col("episode_id").isin(episodes))
    shards = shards.select(*SHARDS.columns)
    unit = partial(shard_outputs, decode=ctx.cfg.priors.decode, features=ctx.cfg.priors.features)
    result = map_per_shard(ctx, shards, unit, union_schema([FRAMES, FEATURES]))
    return write_guarded(ctx, lineage, episodes, result, FRAMES, FEATURES)


STAGE = Stage(
    name="priors",
    version="2",
    upstream="ingest",
    config_sections=("priors",),
    outputs=(FRAMES, FEATURES),
    process=process,
)
