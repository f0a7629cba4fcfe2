"""Building the Spark session: the only place egolake configures Spark.

Locally (`egolake run`), this starts an embedded `local[N]` Spark with Delta's jars from the
set-up cache, so a run never downloads. Under `spark-submit`, on Databricks or EMR, the session
already exists and is reused; Delta jars are added only if the session lacks Delta.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pyspark loads only when a session is built: reading the options stays light
    from pyspark.sql import SparkSession

__all__ = ["SparkOptions", "build_spark", "delta_jars", "local_master"]

logger = logging.getLogger(__name__)

#: Quiet JVM logging for embedded sessions (errors only).
LOG4J_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "log4j2.properties"

#: `local`, `local[N]`, `local[*]`: local masters that try a task once, whatever spark.task.maxFailures says.
_LOCAL_MASTER = re.compile(r"local(?:\[\s*(\d+|\*)\s*\])?")


@dataclass(frozen=True)
class SparkOptions:
    """How egolake gets its Spark session."""

    # Master for an embedded session; ignored when a session already exists (spark-submit, notebooks).
    master: str = "local[2]"
    # Attempts of a task before its job fails (spark.task.maxFailures; 4 is Spark's default on a cluster):
    # a Python worker that dies (the OOM killer, a crashing native library) costs a retry, not the batch.
    # Local mode ignores spark.task.maxFailures and tries a task once, so an embedded local or local[N]
    # master becomes local[N,task_max_failures] (local[N,F] keeps its F). 1: no retry. Sessions egolake
    # did not start (spark-submit, notebooks) keep their own setting.
    task_max_failures: int = 4
    # Writable memory (MiB) each stage task's Python worker may fill (RLIMIT_DATA, udfs.memory): a unit
    # that needs more fails alone with a MemoryError naming this bound, where the OOM killer would take
    # the worker (or the host) and say nothing of which episode. Counts heap and arrays, not the address
    # ranges torch, LiteRT and CUDA reserve (which is why Spark's spark.executor.pyspark.memory, an
    # address-space cap, is not used). Per worker: a machine needs about (tasks at once) x this, plus
    # the JVM. null: no bound.
    python_worker_memory_mb: int | None = 8192
    app_name: str = "egolake"
    driver_memory: str = "4g"
    shuffle_partitions: int = 8
    # Rows per Arrow batch into pandas UDFs. Keep small: some rows carry frames or feature blobs.
    arrow_max_records_per_batch: int = 64
    # auto: load Delta from the set-up jar cache ($EGOLAKE_HOME/jars) unless the session has Delta;
    # none: never (the cluster provides Delta).
    delta_jars: Literal["auto", "none"] = "auto"
    # Partitions in which an embedded session's Delta rebuilds a table's state (log replay). Delta's
    # default, 50, suits long logs on a cluster; egolake's tables have short logs, and on local[N] 50
    # tasks per table read cost more than they parallelise. Sessions egolake did not start keep theirs.
    delta_snapshot_partitions: int = 2
    # Module of the Python daemon that forks the executors' Python workers (spark.python.daemon.module):
    # udfs.worker_daemon imports the stage modules once, so a new worker does not spend ~1.1 CPU-s
    # importing them. null: Spark's own (pyspark.daemon). Sessions egolake did not start keep theirs.
    worker_daemon: str | None = "udfs.worker_daemon"
    # Spark's own log level; egolake's logs are configured separately (jobs.logs).
    log_level: str = "ERROR"
    # Any other Spark settings, e.g. {"spark.executor.memory": "8g"}.
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task_max_failures < 1:
            raise ValueError(f"spark.task_max_failures must be >= 1, got {self.task_max_failures}")
        if self.python_worker_memory_mb is not None and self.python_worker_memory_mb < 256:
            raise ValueError(
                f"spark.python_worker_memory_mb must be >= 256 (or null), got {self.python_worker_memory_mb}"
            )
        if self.delta_snapshot_partitions < 1:
            raise ValueError(
                f"spark.delta_snapshot_partitions must be >= 1, got {self.delta_snapshot_partitions}"
            )


def egolake_home() -> str:
    """Root of egolake's caches (jars, models); `$EGOLAKE_HOME` or ~/.cache/egolake."""
    return os.environ.get("EGOLAKE_HOME", os.path.join(os.path.expanduser("~"), ".cache", "egolake"))


def delta_jars() -> list[str]:
    """Delta's jars fetched by `make setup`; raises with the fix when they are missing."""
    jars = sorted(glob.glob(os.path.join(egolake_home(), "jars", "*.jar")))
    if not any(os.path.basename(j).startswith("delta-spark") for j in jars):
        raise FileNotFoundError(
            f"Delta Lake jars not found in {os.path.join(egolake_home(), 'jars')}: run `make setup` "
            "(it fetches them once from Maven Central), or set spark.delta_jars=none on a cluster "
            "that provides Delta."
        )
    return jars


def local_master(master: str, task_max_failures: int) -> str:
    """`master` with `task_max_failures` attempts per task where it is `local`, `local[N]` or `local[*]`.

    Spark's local mode tries a task once unless the master says otherwise (`local[N,F]`); every other
    master (local[N,F], local-cluster, a cluster URL) is returned unchanged.
    """
    match = _LOCAL_MASTER.fullmatch(master.strip())
    if match is None:
        return master
    return f"local[{match.group(1) or 1},{task_max_failures}]"


def build_spark(opts: SparkOptions) -> SparkSession:
    """The active session, or a new embedded one configured for egolake and Delta."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 -- see the TYPE_CHECKING import

    active = SparkSession.getActiveSession()
    if active is not None:
        _tune(active, opts)
        return active
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Launched by spark-submit: master, jars and JVM options come from its command line.
        spark = _with_delta(SparkSession.builder.appName(opts.app_name), opts).getOrCreate()
        _tune(spark, opts)
        logger.info("spark session ready master=%s version=%s", spark.sparkContext.master, spark.version)
        return spark
    # Executors must run the same interpreter that has egolake's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(local_master(opts.master, opts.task_max_failures))
        .appName(opts.app_name)
        .config("spark.task.maxFailures", str(opts.task_max_failures))
        .config("spark.driver.memory", opts.driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.snapshotPartitions", str(opts.delta_snapshot_partitions))
    )
    if opts.delta_jars == "auto":
        builder = builder.config("spark.jars", ",".join(delta_jars()))
    spark = _with_delta(builder, opts).getOrCreate()
    _tune(spark, opts)
    logger.info("spark session ready master=%s version=%s", spark.sparkContext.master, spark.version)
    return spark


def _with_delta(builder: SparkSession.Builder, opts: SparkOptions) -> SparkSession.Builder:
    """Delta's SQL extension and catalog, UTC session time, the worker daemon, the user's extra settings."""
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    if opts.worker_daemon is not None:
        builder = builder.config("spark.python.daemon.module", opts.worker_daemon)
    for key, value in opts.extra.items():
        builder = builder.config(key, value)
    return builder


def _tune(spark: SparkSession, opts: SparkOptions) -> None:
    """Settings that may change on an existing session."""
    spark.sparkContext.setLogLevel(opts.log_level)
    spark.conf.set("spark.sql.shuffle.partitions", str(opts.shuffle_partitions))
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(opts.arrow_max_records_per_batch))
