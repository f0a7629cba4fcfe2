"""Reading an output's tables in tests, comparing two outputs without their lineage columns, copying a
shared run's output (the session's runs are read-only) and an episode's upstream rows under another id (a
second episode without a second pipeline run)."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from schemas import LINEAGE_FIELDS, TABLES

DATA_TABLES = ("videos", "shards", "quarantine", "frames")
#: Every table a stage writes: all but `runs`, the log of attempts (its times and run ids differ by run).
STAGE_TABLES = tuple(name for name in TABLES if name != "runs")
_LINEAGE = [f.name for f in LINEAGE_FIELDS]
#: Columns holding a path under OUTPUT: compared relative to it.
_OUTPUT_PATHS = {"qa": ("report_path",)}


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


def assert_same_tables(spark, out: str, reference: str) -> None:
    """Every stage table (`STAGE_TABLES`) of `out` holds exactly the data of `reference`'s: the same tables,
    rows and values, floats equal (not close), lineage columns left out and paths under OUTPUT relative."""
    from jobs.tables import Layout, exists
    from schemas import table as schema_of

    names = [n for n in STAGE_TABLES if exists(Layout(reference), schema_of(n))]
    assert [n for n in STAGE_TABLES if exists(Layout(out), schema_of(n))] == names
    differ = {}
    for name in names:
        got, want = content(spark, out, name), content(spark, reference, name)
        for column in _OUTPUT_PATHS.get(name, ()):
            got[column] = [p and os.path.relpath(p, out) for p in got[column]]
            want[column] = [p and os.path.relpath(p, reference) for p in want[column]]
        try:
            pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)
        except AssertionError as exc:  # name every table that differs, not only the first
            differ[name] = str(exc).strip().splitlines()[0]
    assert not differ, f"tables of {out} that differ from {reference}'s: {differ}"


def dataset_files(version: str | Path) -> dict[str, str]:
    """A dataset version's files by relative path with their SHA-256, all but the manifest and the card
    (they name the run) and the videos. libx264 does not encode the same frames to the same bytes on a
    CPU with AVX-512 (docs/OPERATIONS.md, determinism); the frames it is given are compared through the
    exact image statistics in meta/."""
    root = Path(version)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("manifest.json", "README.md") and p.suffix != ".mp4"
    }


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
