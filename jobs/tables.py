"""Reading and writing egolake's Delta tables under OUTPUT/tables/<name>.

Every stage write goes through `write`: it stamps the lineage columns and overwrites, atomically,
exactly the rows of the partition-key values it was given (`replaceWhere`), so re-running a stage
for an episode replaces its rows and never duplicates them.

Two runs may write one OUTPUT at once. Delta commits optimistically: when another run committed to the
same table first (created it, appended, replaced other keys), the commit fails with one of Delta's
concurrent-modification errors and changes nothing. Both writes here are safe to repeat (a replace of
given keys, an append of rows not yet committed), so `write` and `append` retry them with jittered
exponential backoff (`CONFLICT_RETRIES`); the retry sees the table as it now is (it exists, so a first
write becomes a replace of its keys).

That optimism needs a log store whose commit is an atomic put-if-absent. On a local (or mounted) file
system Delta's `HDFSLogStore` checks that the version's file is absent and then renames its own onto it,
and a rename there replaces the target: the check and the rename are atomic only within one JVM. Two runs
committing one table's next version at once could both succeed, the later file replacing the earlier:
one run's commit lost without an error, or a log that no longer reads (in CI: both runs failed in
Hadoop's checksum reader replaying the log).
So each commit holds an exclusive `flock` on `OUTPUT/tables/.<table>.commit.lock` (`_commit_lock`);
the stage's work is done before it (`jobs.stage.write_guarded` persists its result), so runs still
work at once and only their commits of one table take turns.

A table whose stored columns differ from the schema's (an OUTPUT written by an egolake before a column
was renamed) is refused with `TableColumnsChangedError`, naming the table and the columns, before anything
is written.

A write that fails because the file system is full commits nothing (its partial data files are never
referenced by the log: the table keeps its previous version) and raises `OSError(ENOSPC)` naming the
table's path (`jobs.disk.no_space`), not Spark's page of Java stack; nothing retries it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.disk import NO_SPACE, no_space
from schemas import TABLES, TableSchema

__all__ = [
    "CONFLICT_RETRIES",
    "Layout",
    "Lineage",
    "TableColumnsChangedError",
    "append",
    "delta_version",
    "exists",
    "read",
    "register_all",
    "sql_literal",
    "write",
]

logger = logging.getLogger(__name__)

#: Attempts after a commit conflict with a concurrent run; backoff starts at `_BACKOFF_S`, doubles, +-50 %.
CONFLICT_RETRIES = 8
_BACKOFF_S = 0.5


class TableColumnsChangedError(RuntimeError):
    """An existing table's columns are not the ones this egolake writes (an OUTPUT of an older version)."""


@dataclass(frozen=True)
class Layout:
    """Where a run's outputs live: OUTPUT/tables/<name>, OUTPUT/datasets, OUTPUT/qa, OUTPUT/metrics."""

    root: str

    def table(self, name: str) -> str:
        """Path of table `name`."""
        return os.path.join(self.root, "tables", name)

    @property
    def datasets(self) -> str:
        """Folder of exported datasets."""
        return os.path.join(self.root, "datasets")

    @property
    def qa(self) -> str:
        """Folder of QA reports."""
        return os.path.join(self.root, "qa")

    @property
    def metrics(self) -> str:
        """Folder of per-run metrics files (Prometheus text format)."""
        return os.path.join(self.root, "metrics")


@dataclass(frozen=True)
class Lineage:
    """The columns every stage row carries (DESIGN.md table contract)."""

    run_id: str
    stage_version: str
    config_hash: str


def exists(layout: Layout, schema: TableSchema) -> bool:
    """Whether the table has been written at least once."""
    return os.path.isdir(os.path.join(layout.table(schema.name), "_delta_log"))


def delta_version(layout: Layout, schema: TableSchema) -> int | None:
    """The table's newest committed Delta version from a listing of its log (no Spark), None if unwritten.

    Every commit adds `_delta_log/<20-digit version>.json`, so the largest such name changes exactly
    when the table does: a cache key for answers computed from the table (`jobs/serve.py`).
    """
    log = os.path.join(layout.table(schema.name), "_delta_log")
    if not os.path.isdir(log):
        return None
    commits = [int(f[:-5]) for f in os.listdir(log) if f.endswith(".json") and f[:-5].isdigit()]
    return max(commits, default=None)


def read(spark: SparkSession, layout: Layout, schema: TableSchema) -> DataFrame:
    """The table as a DataFrame; an empty one with the right columns if it does not exist yet."""
    if not exists(layout, schema):
        return spark.createDataFrame([], schema.spark_full)
    return spark.read.format("delta").load(layout.table(schema.name))


def sql_literal(value: str) -> str:
    """A Spark SQL string literal for `value` (quotes and backslashes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write(
    df: DataFrame,
    layout: Layout,
    schema: TableSchema,
    replace_keys: Iterable[str],
    lineage: Lineage | None = None,
) -> None:
    """Replace the rows whose partition key is in `replace_keys` by the rows of `df`.

    `df` must hold only rows with keys in `replace_keys` (Delta checks it). Keys with no row in
    `df` end with no rows: a failed episode leaves no stale output behind. Columns are selected
    and cast to the schema, so a transform cannot add or drop columns silently.
    """
    keys = sorted(set(replace_keys))
    if not keys:
        return
    if schema.lineage:
        if lineage is None:
            raise ValueError(f"table {schema.name} needs lineage columns; pass lineage=")
        df = (
            df.withColumn("run_id", F.lit(lineage.run_id))
            .withColumn("stage_version", F.lit(lineage.stage_version))
            .withColumn("config_hash", F.lit(lineage.config_hash))
        )
    target = schema.spark_full
    df = df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])
    predicate = f"{schema.partition_key} IN ({', '.join(sql_literal(k) for k in keys)})"

    def commit() -> None:
        writer = df.write.format("delta")
        if exists(layout, schema):  # asked again on a retry: a concurrent run may have created it
            _check_columns(df.sparkSession, layout, schema)
            writer = writer.mode("overwrite").option("replaceWhere", predicate)
        else:
            writer = writer.mode("append")
        writer.save(layout.table(schema.name))

    _retry_conflicts(commit, schema.name, layout.table(schema.name))
    logger.info("wrote table=%s keys=%d", schema.name, len(keys))


def _check_columns(spark: SparkSession, layout: Layout, schema: TableSchema) -> None:
    """Refuse to write into a table stored with other columns (Delta would fail with a bare schema diff)."""
    path = layout.table(schema.name)
    if delta_version(layout, schema) is None:  # a concurrent run made its log folder, committed nothing yet
        return
    stored = set(spark.read.format("delta").load(path).schema.fieldNames())
    expected = set(schema.spark_full.fieldNames())
    if stored != expected:
        raise TableColumnsChangedError(
            f"table {schema.name} at {path} holds columns {sorted(stored - expected)} where this egolake "
            f"writes {sorted(expected - stored)} (schema version {schema.version}): the OUTPUT was written "
            "by an older egolake; run into a new OUTPUT"
        )


def append(df: DataFrame, layout: Layout, schema: TableSchema) -> None:
    """Append rows (the `runs` log).

    New nullable columns of a later schema version are merged into an existing log (Delta's
    `mergeSchema`): an OUTPUT written before them keeps its history, whose rows read null there.
    """
    target = schema.spark_full
    df = df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])
    path = layout.table(schema.name)
    writer = df.write.format("delta").mode("append").option("mergeSchema", "true")
    _retry_conflicts(lambda: writer.save(path), schema.name, path)


def _retry_conflicts(commit: Callable[[], None], table: str, path: str) -> None:
    """Run `commit`, again after a Delta commit conflict with a concurrent writer (see the module doc).

    Raises:
        OSError: ENOSPC, naming `path`, when the file system is full (`jobs.disk.no_space`).
    """
    from delta.exceptions import (  # noqa: PLC0415 -- importing it teaches pyspark Delta's error classes
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
        ProtocolChangedException,
    )

    conflicts = (
        ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
        ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
        MetadataChangedException, ProtocolChangedException,
    )  # fmt: skip
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            with _commit_lock(path):
                commit()
            return
        except conflicts as exc:
            if attempt == CONFLICT_RETRIES:
                raise
            wait = _BACKOFF_S * 2**attempt * random.uniform(0.5, 1.5)  # noqa: S311 -- jitter, not security
            logger.warning("commit conflict table=%s attempt=%d wait_s=%.1f error=%s",
                           table, attempt + 1, wait, type(exc).__name__)
            time.sleep(wait)
        except (Py4JJavaError, PySparkException) as exc:
            if NO_SPACE in str(exc):  # an IOException of a task or of the log, under Spark's wrapping
                raise no_space(f"writing table {table}", path) from exc
            raise


@contextlib.contextmanager
def _commit_lock(path: str) -> Iterator[None]:
    """Hold an exclusive lock for one commit to the table at `path` (see the module doc), across processes.

    The lock file stays (a hidden file beside the table: Delta never reads it); the kernel releases the
    lock when its holder dies, so a killed run never blocks the next. Where the file system has no
    locks (warned once) or the lock file cannot be made (a full disk), the commit goes ahead unlocked.
    """
    folder, name = os.path.split(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, f".{name}.commit.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:  # a full disk: the commit itself then fails with its clear error
        logger.warning("commit lock not made table=%s error=%s", path, exc)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            _warn_no_locks(folder, exc.strerror or type(exc).__name__)
        yield
    finally:
        os.close(fd)  # releases the lock


@functools.cache
def _warn_no_locks(folder: str, reason: str) -> None:
    """Once per folder and process: a file system without locks would warn at every commit."""
    logger.warning("commit locks not taken folder=%s error=%s: runs at once may lose commits", folder, reason)


def register_all(spark: SparkSession, layout: Layout) -> list[str]:
    """Register every committed table as a temp view named after it, pinned at its newest version.

    The views are one snapshot per table until registered again: every query over them (a self-join,
    several queries of a notebook) reads the same rows while stages keep writing; a Delta view of the
    path itself would follow each new commit. Delta has no snapshot across tables: `runs` is pinned
    first and stages commit their rows before their `runs` rows, so an `ok` in the views never names
    rows missing from them, unless another run rewrote that episode in between (every row's `run_id`
    says which run wrote it).

    Returns:
        The registered names, `runs` first.
    """
    names = []
    for schema in sorted(TABLES.values(), key=lambda t: t.name != "runs"):
        version = delta_version(layout, schema)
        if version is None:  # never written, or its first commit is still in progress
            continue
        pinned = spark.read.format("delta").option("versionAsOf", version).load(layout.table(schema.name))
        pinned.createOrReplaceTempView(schema.name)
        names.append(schema.name)
    return names
