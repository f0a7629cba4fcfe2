"""Reading an output's tables in tests, comparing two outputs without their lineage columns, copying a
shared run's output (the session's runs are read-only) and an episode's upstream rows under another id (a
second episode without a second pipeline run)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from schemas import LINEAGE_FIELDS

DATA_TABLES = ("videos", "shards", "quarantine", "frames")
_LINEAGE = [f.name for f in LINEAGE_FIELDS]


def table(spark, out: str, name: str) -> pd.DataFrame:
    from jobs.tables import Layout, read
    from schemas import table as schema_of

    return read(spark, Layout(out), schema_of(name)).toPandas()


def content(spark, out: str, name: str) -> pd.DataFrame:
    """A table's data columns, sorted by its key, index reset: comparable across runs."""
    from schemas import table as schema_of

    schema = schema_of(name)
    df = table(spark, out, name).drop(columns=_LINEAGE)
    return df.sort_values(list(schema.key)).reset_index(drop=True)


def copy_output(src: str, dest: Path) -> str:
    """A private copy of a shared run's output (tables, datasets, QA pages, sample) at `dest`, for a test
    that re-runs stages: Delta tables hold relative paths, so a copied folder is a whole output."""
    shutil.copytree(src, dest)
    return str(dest)


def copy_episode(
    spark, out: str, episode: str, copy_id: str, overrides: Mapping[str, Mapping[str, object]] | None = None
) -> None:
    """Write `episode`'s rows of videos, frames, camera_poses and hands_world, and its `runs` rows, again
    under `copy_id` (same video, same lineage), so export and retarget see a second finished episode.

    `overrides`: {table: {column: value}} set on the copied rows (e.g. hands_world without a metric
    scale, videos with another source file).
    """
    from pyspark.sql import functions as F

    from jobs.tables import Layout, Lineage, append, write
    from schemas.tables import CAMERA_POSES, FRAMES, HANDS_WORLD, RUNS, VIDEOS

    layout = Layout(out)
    for schema in (VIDEOS, FRAMES, CAMERA_POSES, HANDS_WORLD):
        rows = table(spark, out, schema.name)
        rows = rows[rows["episode_id"] == episode].assign(episode_id=copy_id)
        rows = rows.assign(**(overrides or {}).get(schema.name, {}))
        lineage = Lineage(rows["run_id"].iat[0], rows["stage_version"].iat[0], rows["config_hash"].iat[0])
        write(spark.createDataFrame(rows[schema.columns], schema.spark), layout, schema, [copy_id], lineage)
    runs = spark.read.format("delta").load(layout.table("runs")).where(F.col("episode_id") == episode)
    append(runs.withColumn("episode_id", F.lit(copy_id)), layout, RUNS)
