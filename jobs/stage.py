"""The stage framework: which episodes a stage runs on, batching, failure isolation, `runs` rows.

A stage is a name, a version, its upstream stage, the config sections it depends on, and a
`process` function that computes and writes its tables for a list of episodes and says, per
episode, ok or failed. Everything else (resume, --from-stage, progress, the `runs` log) is here,
once, for every stage.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TypeVar

import pandas as pd
import pyarrow as pa
from pyspark.resource import ResourceProfile, ResourceProfileBuilder, TaskResourceRequests
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.config import GpuOptions, PipelineConfig
from jobs.disk import no_space, out_of_space
from jobs.slots import SLOT, spread
from jobs.tables import Layout, Lineage, append, delta_version, exists, read
from schemas import TableSchema
from schemas.base import spark_schema
from schemas.tables import RUNS
from udfs.device import on_task_device
from udfs.guard import (
    ERROR_KIND,
    ROW_KIND,
    PairFn,
    guarded_batch_map,
    guarded_map,
    guarded_pair,
    guarded_schema,
    run_unit,
)
from udfs.memory import with_memory_bound
from udfs.multi_output import TABLE_COLUMN, union_schema

__all__ = [
    "CPU",
    "EpisodeOutcome",
    "GuardedStatus",
    "Placement",
    "Stage",
    "StageContext",
    "apply_per_episode",
    "cogroup_per_episode",
    "gpu_profile",
    "gpu_task_cpus",
    "latest_runs",
    "map_per_shard",
    "read_stacked",
    "record_runs",
    "run_episode_stage",
    "RunsLedger",
    "guarded_rows",
    "guarded_status",
    "stage_placement",
]

logger = logging.getLogger(__name__)

F_ = TypeVar("F_", bound=Callable)


def _same_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The identity Arrow map that carries a resource profile (see `Placement.schedule`)."""
    yield from batches


@dataclass(frozen=True)
class Placement:
    """Where and within what a stage's tasks run: CPU-only (Spark's default profile) or each on a GPU.

    Attributes:
        profile: the stage-level `ResourceProfile` of its tasks (a GPU amount and CPUs); None: the default.
        memory_mb: the writable memory each task's Python worker may fill (`udfs.memory`); None: no bound.
    """

    profile: ResourceProfile | None = None
    memory_mb: int | None = None

    def wrap(self, fn: F_) -> F_:
        """A UDF function run within `memory_mb` on its task's device (`udfs.device`).

        Also on the CPU: the task's CPU threads (OpenCV, BLAS, torch) are capped at its `spark.task.cpus`,
        so the tasks an executor runs at once do not each start a pool as wide as the machine and spin
        against one another.
        """
        bounded = with_memory_bound(fn, self.memory_mb)
        return on_task_device(bounded, gpu=self.profile is not None)  # type: ignore[return-value]

    def schedule(self, grouped: DataFrame) -> DataFrame:
        """The output of a grouped pandas UDF whose tasks run under `profile`.

        `applyInPandas` takes no profile (only `mapInPandas`/`mapInArrow` do, pyspark 4.2), so an identity
        `mapInArrow` carries it: Spark gives every task of a stage the profile of any RDD in it, and the
        identity map is in the grouped UDF's stage (same partitions, no shuffle between). It costs one
        Arrow pass over the UDF's (light) output.
        """
        if self.profile is None:
            return grouped
        return grouped.mapInArrow(_same_batches, grouped.schema, profile=self.profile)


#: Spark's default profile: tasks with `spark.task.cpus` and no GPU.
CPU = Placement()


def gpu_task_cpus(opts: GpuOptions, executor_cores: int | None, task_cpus: int) -> int:
    """CPUs of a GPU stage's task: `opts.task_cpus`, else an executor's share for `opts.task_amount`.

    Args:
        opts: the GPU settings.
        executor_cores: `spark.executor.cores`, None where it is not set (standalone: all a worker's).
        task_cpus: `spark.task.cpus`, the floor.
    """
    if opts.task_cpus:
        return opts.task_cpus
    if executor_cores is None:
        return task_cpus
    return max(task_cpus, int(executor_cores * min(opts.task_amount, 1.0)))


def gpu_profile(cpus: int, gpus: float) -> ResourceProfile:
    """A task-only resource profile: `cpus` cores and `gpus` GPUs per task (executors as configured)."""
    return ResourceProfileBuilder().require(TaskResourceRequests().cpus(cpus).resource("gpu", gpus)).build


def stage_placement(spark: SparkSession, opts: GpuOptions, stage: str) -> Placement:
    """`stage`'s placement: a GPU per task when GPUs are on and it is one of `opts.stages`, else `CPU`.

    Raises:
        ValueError: GPUs are on under a local[N] master, where Spark refuses task resource profiles.
    """
    if not (opts.enabled and stage in opts.stages):
        return CPU
    master = spark.sparkContext.master
    if master == "local" or master.startswith("local["):
        raise ValueError(
            f"gpu.enabled needs a cluster manager that schedules GPUs (standalone, YARN, Kubernetes); "
            f"master {master!r} cannot: set gpu.enabled=false"
        )
    conf = spark.sparkContext.getConf()
    executor_cores = conf.get("spark.executor.cores")
    cpus = gpu_task_cpus(
        opts, int(executor_cores) if executor_cores else None, int(conf.get("spark.task.cpus", "1") or 1)
    )
    logger.info("stage %s: tasks ask for %s GPU and %d CPUs", stage, opts.task_amount, cpus)
    return Placement(gpu_profile(cpus, opts.task_amount))


@dataclass
class RunsLedger:
    """A run's copy of `latest_runs`, kept current through its own appends instead of re-read per stage.

    Every stage asks which episodes are done (`runs`' latest row per stage and episode); reading that from
    Delta costs a snapshot and a windowed query (~0.5 s on local[2], more as `runs` grows), and between two
    stages of one run the only change is usually the run's own rows. The copy is keyed by the table's Delta
    version: it is used while the version is the one it was read at, and the run's own append is merged in
    only when that append is the one commit since (version + 1); a commit by anyone else makes the next
    `latest` read the table again.
    """

    version: int | None = None
    latest: pd.DataFrame | None = None

    def read(self, spark: SparkSession, layout: Layout) -> pd.DataFrame:
        """`latest_runs(spark, layout)`, from the copy when the table has not changed since (a copy)."""
        version = delta_version(layout, RUNS)  # listed before the read: a commit in between re-reads later
        if self.latest is None or version is None or version != self.version:
            self.latest, self.version = latest_runs(spark, layout), version
        return self.latest.copy()

    def appended(self, before: int | None, after: int | None, rows: pd.DataFrame) -> None:
        """Merge `rows`, appended by the commit that took `runs` from version `before` to `after`."""
        if self.latest is None or before is None or before != self.version or after != before + 1:
            self.latest, self.version = None, None
            return
        rows = rows[rows["status"] != "skipped"]
        merged = pd.concat([self.latest, rows], ignore_index=True) if len(self.latest) else rows
        # The window of `latest_runs`: newest `finished`, then the larger run id, per (stage, episode).
        merged = merged.sort_values(["finished", "run_id"], ascending=False, kind="stable")
        self.latest = merged.drop_duplicates(["stage", "episode_id"]).reset_index(drop=True)
        self.version = after


@dataclass(frozen=True)
class StageContext:
    """What every stage gets: the session, the config, where outputs go, this run's id, where tasks run.

    `placement` is set per stage by `run_episode_stage` (`stage_placement`); stages hand it to the
    framework's UDF helpers. `runs` is the run's ledger of `runs` rows, shared by the per-stage copies
    `dataclasses.replace` makes.
    """

    spark: SparkSession
    cfg: PipelineConfig
    layout: Layout
    run_id: str
    placement: Placement = CPU
    runs: RunsLedger = field(default_factory=RunsLedger, compare=False, repr=False)

    def latest_runs(self) -> pd.DataFrame:
        """Latest non-skipped `runs` row per (stage, episode) of this OUTPUT, via the run's ledger."""
        return self.runs.read(self.spark, self.layout)


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode's result in one stage."""

    episode_id: str
    status: str  # ok | failed | skipped
    rows: int = 0
    error: str | None = None
    started: datetime | None = None
    finished: datetime | None = None
    unit_s: float | None = None  # wall seconds of its units on the executors (summed); None: not measured
    cpu_s: float | None = None  # CPU seconds of those units (worker process and its children)


ProcessFn = Callable[[StageContext, Lineage, list[str]], list[EpisodeOutcome]]


@dataclass(frozen=True)
class Stage:
    """A pipeline stage that works per episode.

    Attributes:
        name: stage name (as in `--stages`, `runs.stage`).
        version: bumped when its output changes meaning; part of the config hash.
        upstream: the stage whose ok episodes this one consumes.
        config_sections: `PipelineConfig` sections its output depends on.
        outputs: the tables it writes.
        process: computes and writes its tables for some episodes, returns one outcome each.
        inputs_digest: optional digest of files outside the config its output depends on (the robot
            profiles of retarget), part of the config hash so that editing them invalidates the stage.
    """

    name: str
    version: str
    upstream: str | None
    config_sections: tuple[str, ...]
    outputs: tuple[TableSchema, ...]
    process: ProcessFn
    inputs_digest: Callable[[PipelineConfig], str] | None = None


def now() -> datetime:
    """The current UTC time."""
    return datetime.now(timezone.utc)


def record_runs(ctx: StageContext, stage: str, lineage: Lineage, outcomes: Sequence[EpisodeOutcome]) -> None:
    """Append one `runs` row per outcome."""
    if not outcomes:
        return
    pdf = pd.DataFrame(
        {
            "run_id": ctx.run_id,
            "stage": stage,
            "episode_id": [o.episode_id for o in outcomes],
            "status": [o.status for o in outcomes],
            "started": [o.started for o in outcomes],
            "finished": [o.finished for o in outcomes],
            "rows": [o.rows for o in outcomes],
            "error": [o.error for o in outcomes],
            "unit_s": [o.unit_s for o in outcomes],
            "cpu_s": [o.cpu_s for o in outcomes],
            "config_hash": lineage.config_hash,
            "stage_version": lineage.stage_version,
        }
    )
    rows = ctx.spark.createDataFrame(pdf, RUNS.spark_full)
    before = delta_version(ctx.layout, RUNS)
    append(rows, ctx.layout, RUNS)
    # The rows as `runs` gives them back (Spark's own conversion: timestamps in the session's zone).
    ctx.runs.appended(before, delta_version(ctx.layout, RUNS), rows.toPandas())


def latest_runs(spark: SparkSession, layout: Layout) -> pd.DataFrame:
    """Latest non-skipped `runs` row per (stage, episode) as pandas (small: one row per pair)."""
    if not exists(layout, RUNS):
        return pd.DataFrame(columns=[f.name for f in RUNS.spark_full.fields])
    runs = read(spark, layout, RUNS).where(F.col("status") != "skipped")
    order = Window.partitionBy("stage", "episode_id").orderBy(
        F.col("finished").desc(), F.col("run_id").desc()
    )
    latest = runs.withColumn("_n", F.row_number().over(order)).where("_n = 1").drop("_n")
    return latest.toPandas()


@dataclass(frozen=True)
class GuardedStatus:
    """What a guarded UDF's output says, per episode: failures, unit seconds (summed) and data rows."""

    failures: dict[str, str]  # {episode_id: first error}
    seconds: dict[str, tuple[float, float]]  # {episode_id: (wall, CPU) seconds of its units}
    rows: dict[str, int]  # {episode_id: data rows counted (`guarded_status`'s `counted`)}


def guarded_status(result: DataFrame, counted: Column | None = None) -> GuardedStatus:
    """Collect the failures, unit seconds and data-row counts of a guarded UDF's output.

    One small collect: a stage's outcomes need no second pass over its rows.

    Args:
        result: the guarded output; the caller must `persist` it first, or the UDF runs twice.
        counted: which data rows `rows` counts (e.g. one table's of a stacked output); None: all.
    """
    is_row = F.col("_row_kind") == ROW_KIND
    status = (
        result.groupBy("episode_id")
        .agg(
            F.sum("_unit_s").alias("unit_s"),
            F.sum("_unit_cpu_s").alias("cpu_s"),
            F.min(F.when(F.col("_row_kind") == ERROR_KIND, F.col("_error"))).alias("error"),
            F.count(F.when(is_row if counted is None else is_row & counted, 1)).alias("rows"),
        )
        .collect()
    )
    return GuardedStatus(
        {r["episode_id"]: r["error"] for r in status if r["error"] is not None},
        {r["episode_id"]: (float(r["unit_s"]), float(r["cpu_s"])) for r in status if r["unit_s"] is not None},
        {r["episode_id"]: int(r["rows"]) for r in status},
    )


def guarded_rows(result: DataFrame, columns: Sequence[str], failures: dict[str, str]) -> DataFrame:
    """The data rows of a guarded UDF's output, without those of failed episodes."""
    data = result.where(F.col("_row_kind") == ROW_KIND).select(*columns)
    return data.where(~F.col("episode_id").isin(list(failures))) if failures else data


def outcomes_from(episodes: Sequence[str], status: GuardedStatus, started: datetime) -> list[EpisodeOutcome]:
    """Outcomes of a batch: row counts, errors and unit seconds per episode from `status`."""
    finished = now()
    outcomes = []
    for e in episodes:
        unit_s, cpu_s = status.seconds.get(e, (None, None))
        failed = e in status.failures
        outcomes.append(
            EpisodeOutcome(
                e, "failed" if failed else "ok", 0 if failed else status.rows.get(e, 0),
                status.failures.get(e), started, finished, unit_s, cpu_s,
            )
        )  # fmt: skip
    return outcomes


def select_episodes(
    stage: Stage, latest: pd.DataFrame, scope: Sequence[str] | None, config_hash: str, force: bool
) -> tuple[list[str], list[str]]:
    """(episodes to run, episodes to skip) for `stage`.

    Candidates are the episodes whose latest upstream status is ok (within `scope` when given).
    Without `force`, an episode is skipped when its latest status here is ok with the same config
    hash and finished after its upstream's latest ok run.
    """
    up = latest[(latest["stage"] == stage.upstream) & (latest["status"] == "ok")]
    up_finished = dict(zip(up["episode_id"], up["finished"], strict=True))
    candidates = sorted(e for e in up_finished if scope is None or e in set(scope))
    if force:
        return candidates, []
    mine = latest[latest["stage"] == stage.name].set_index("episode_id")
    run, skip = [], []
    for episode in candidates:
        done = (
            episode in mine.index
            and mine.at[episode, "status"] == "ok"
            and mine.at[episode, "config_hash"] == config_hash
            and mine.at[episode, "finished"] >= up_finished[episode]
        )
        (skip if done else run).append(episode)
    return run, skip


def run_episode_stage(
    ctx: StageContext, stage: Stage, config_hash: str, scope: Sequence[str] | None, force: bool
) -> list[EpisodeOutcome]:
    """Run `stage` over its episodes in batches; returns every outcome (ok, failed, skipped)."""
    lineage = Lineage(ctx.run_id, stage.version, config_hash)
    placement = stage_placement(ctx.spark, ctx.cfg.gpu, stage.name)
    ctx = replace(ctx, placement=replace(placement, memory_mb=ctx.cfg.spark.python_worker_memory_mb))
    todo, skip = select_episodes(stage, ctx.latest_runs(), scope, config_hash, force)
    skipped = [EpisodeOutcome(e, "skipped", started=now(), finished=now()) for e in skip]
    record_runs(ctx, stage.name, lineage, skipped)
    outcomes: list[EpisodeOutcome] = list(skipped)
    size = ctx.cfg.batch_episodes
    t0 = time.monotonic()
    for i in range(0, len(todo), size):
        batch = todo[i : i + size]
        done = _process_isolated(ctx, stage, lineage, batch)
        record_runs(ctx, stage.name, lineage, done)
        outcomes.extend(done)
        logger.info(
            "progress stage=%s done=%d/%d failed=%d skipped=%d elapsed_s=%.1f",
            stage.name, i + len(batch), len(todo), sum(o.status == "failed" for o in outcomes),
            len(skip), time.monotonic() - t0,
        )  # fmt: skip
    return outcomes


def _process_isolated(
    ctx: StageContext, stage: Stage, lineage: Lineage, batch: list[str]
) -> list[EpisodeOutcome]:
    """Process a batch; if the Spark job itself dies (a crashed worker), retry episode by episode.

    Per-episode errors are caught by `udfs.guard`. A task whose Python worker dies (the OOM killer, a
    crash) is first tried again by Spark (`spark.task_max_failures` attempts); this catches a job that
    still fails, such as a decoder that segfaults its worker at every attempt, so that it costs one
    episode, not the batch.
    """
    started = now()
    try:
        return stage.process(ctx, lineage, batch)
    except Exception as exc:  # noqa: BLE001 - job-level failure: isolate the culprit, go on
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise  # a full disk is no episode's fault: every batch would fail, stop the run
        if len(batch) == 1:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:2000]
            logger.warning("episode failed stage=%s episode=%s error=%s", stage.name, batch[0], message)
            return [EpisodeOutcome(batch[0], "failed", 0, message, started, now())]
        logger.warning("batch failed stage=%s episodes=%d: retrying one by one", stage.name, len(batch))
        return [o for e in batch for o in _process_isolated(ctx, stage, lineage, [e])]


def write_guarded(
    ctx: StageContext,
    lineage: Lineage,
    episodes: Sequence[str],
    result: DataFrame,
    *schemas: TableSchema,
) -> list[EpisodeOutcome]:
    """Write a guarded UDF's output to one or more tables and return per-episode outcomes.

    With one schema every data row belongs to it. With several, `result` stacks the tables
    (`udfs.multi_output`): each row names its table in `_table`. The UDF runs once (the result is
    persisted); failed episodes get no rows in any table (their stale rows are removed too).
    `EpisodeOutcome.rows` counts the rows of the first table.
    """
    if not schemas:
        raise ValueError("write_guarded needs at least one table schema")
    from jobs.tables import write  # local: keeps the import graph of this module small

    started = now()
    result = result.persist()
    try:
        first_table = None if len(schemas) == 1 else F.col(TABLE_COLUMN) == schemas[0].name
        status = guarded_status(result, first_table)
        if full := out_of_space(status.failures.values()):  # units write files too (QA pages)
            raise no_space(f"in a unit ({full})", ctx.layout.root)
        for schema in schemas:
            rows = result if len(schemas) == 1 else result.where(F.col(TABLE_COLUMN) == schema.name)
            write(guarded_rows(rows, schema.columns, status.failures), ctx.layout, schema, episodes, lineage)
        return outcomes_from(episodes, status, started)
    finally:
        result.unpersist()


def map_per_shard(
    ctx: StageContext,
    units: DataFrame,
    unit_fn: Callable,
    out_schema: pa.Schema,
    batch_units: int | None = None,
) -> DataFrame:
    """Run `unit_fn` on the shard rows of `units`, one Spark task per few shards, guarded by `udfs.guard`.

    `units` holds one light row per (episode_id, shard_idx) (paths and frame ranges, never pixels);
    the result is the guarded output for `write_guarded`. Tasks are capped at 4 per core; they run
    where `ctx.placement` says. `unit_fn` takes one shard, or with `batch_units` a list of up to that
    many shards of its task at once (`udfs.guard.BatchFn`; each call's seconds shared by frames owned).
    """
    n_tasks = max(1, min(units.count(), 4 * ctx.spark.sparkContext.defaultParallelism))
    keys = ("episode_id", "shard_idx")
    if batch_units is None:
        mapper = guarded_map(unit_fn, out_schema.names, keys)
    else:
        mapper = guarded_batch_map(unit_fn, out_schema.names, keys, batch_units, _frames_owned)
    return units.repartition(n_tasks, *keys).mapInPandas(
        ctx.placement.wrap(mapper), spark_schema(guarded_schema(out_schema)), profile=ctx.placement.profile
    )


def _frames_owned(shard: pd.DataFrame) -> float:
    return float(shard["own_stop"].iat[0] - shard["own_start"].iat[0])


def read_stacked(
    ctx: StageContext, episodes: list[str], schemas: Sequence[TableSchema], given: dict[str, DataFrame]
) -> DataFrame:
    """The rows of `schemas` for `episodes`, stacked with `_table` (tables read unless `given`)."""
    names = union_schema(schemas).names
    parts = []
    for schema in schemas:
        df = given.get(schema.name)
        if df is None:
            df = read(ctx.spark, ctx.layout, schema).where(F.col("episode_id").isin(episodes))
        parts.append(df.select(*schema.columns).withColumn(TABLE_COLUMN, F.lit(schema.name)))
    out = parts[0]
    for df in parts[1:]:
        out = out.unionByName(df, allowMissingColumns=True)
    return out.select(*names)


def apply_per_episode(
    inputs: DataFrame,
    episodes: Sequence[str],
    unit: Callable[[pd.DataFrame], pd.DataFrame],
    outputs: Sequence[TableSchema],
    placement: Placement = CPU,
) -> DataFrame:
    """Run `unit` per episode of `episodes` under the guard, one task each (`jobs.slots`).

    Tasks run where `placement` says. The result stacks `outputs` (or is `outputs[0]`'s rows).
    """
    schema = union_schema(outputs) if len(outputs) > 1 else outputs[0].arrow
    columns = schema.names

    def guarded_unit(pdf: pd.DataFrame) -> pd.DataFrame:
        return run_unit(unit, pdf.drop(columns=SLOT), columns)

    fn = placement.wrap(guarded_unit)
    grouped = spread(inputs, episodes).groupBy(SLOT)  # one slot per episode
    return placement.schedule(grouped.applyInPandas(fn, spark_schema(guarded_schema(schema))))


def cogroup_per_episode(
    left: DataFrame,
    right: DataFrame,
    episodes: Sequence[str],
    unit: PairFn,
    output: pa.Schema,
    placement: Placement = CPU,
) -> DataFrame:
    """Run `unit(left rows, right rows)` per episode of `episodes` under the guard, one task each.

    A unit's failure is its error row; `jobs.slots` spreads the episodes over the tasks.

    Args:
        left: the first input (the unit's first argument); an episode may have no rows on one side.
        right: the second input.
        episodes: the batch, in the order its tasks take them (the k-th in task k mod n).
        unit: pandas in, rows of `output` out (columns by name).
        output: the unit's Arrow schema.
        placement: where the tasks run (`CPU`, or a stage's `ctx.placement`).
    """

    def unslotted(left_rows: pd.DataFrame, right_rows: pd.DataFrame) -> pd.DataFrame:
        return unit(left_rows.drop(columns=SLOT), right_rows.drop(columns=SLOT))

    fn = placement.wrap(guarded_pair(unslotted, output.names))
    # By the slot alone (one per episode): two sides grouped by (slot, episode) would be shuffled again,
    # since a co-partitioned operator needs all its keys in the partitioning.
    grouped = spread(left, episodes).groupBy(SLOT).cogroup(spread(right, episodes).groupBy(SLOT))
    return placement.schedule(grouped.applyInPandas(fn, spark_schema(guarded_schema(output))))
