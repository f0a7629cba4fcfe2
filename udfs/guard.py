"""The one place where per-unit exceptions are caught.

A pandas UDF processes units (a shard, an episode). `guarded` runs the unit's function and turns
any exception into a status row, so one bad episode marks only itself failed and the batch goes on.
Output rows carry `_row_kind` ("row" for data, "error" for a failed unit, "done" for a unit that
returned no rows) and `_error`. Each unit reports its wall and CPU seconds (`_unit_s`, `_unit_cpu_s`:
what `runs` records as cost) exactly once: on its last data row, else on its error or done row (so
data columns keep their dtypes: no all-null row is concatenated to them). The job side
(`jobs.stage.guarded_status`, `guarded_rows`) separates data, failures and seconds.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from udfs.memory import memory_bound_mb

__all__ = [
    "DONE_KIND",
    "ERROR_KIND",
    "ROW_KIND",
    "cpu_seconds",
    "guarded_batch_map",
    "guarded_map",
    "guarded_pair",
    "guarded_schema",
    "run_unit",
]

logger = logging.getLogger(__name__)

ROW_KIND = "row"
ERROR_KIND = "error"
DONE_KIND = "done"
_STATUS_FIELDS = (
    pa.field("_row_kind", pa.string()),
    pa.field("_error", pa.string()),
    pa.field("_unit_s", pa.float64()),
    pa.field("_unit_cpu_s", pa.float64()),
)

UnitFn = Callable[[pd.DataFrame], pd.DataFrame]
#: Several units at once (e.g. shards in lockstep): per unit, its rows or the exception that failed it.
BatchFn = Callable[[list[pd.DataFrame]], list[pd.DataFrame | Exception]]
PairFn = Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame]


def guarded_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with every field nullable plus the status columns (kind, error, unit seconds)."""
    return pa.schema([f.with_nullable(True) for f in schema] + list(_STATUS_FIELDS))


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) plus its waited-for children (e.g. a probe's fork)."""
    children = os.times()
    return time.process_time() + children.children_user + children.children_system


def run_unit(fn: UnitFn, unit: pd.DataFrame, columns: Sequence[str], key: str = "episode_id") -> pd.DataFrame:
    """Run `fn` on one unit; on any exception return one error row naming the unit's key.

    The unit's wall and CPU seconds go on its last row (see the module doc). A Python worker runs
    one task at a time, so the process's CPU time over the unit is the unit's.

    Args:
        fn: unit function, pandas frame in, frame with `columns` out.
        unit: the unit's input rows (all share `key`).
        columns: output data columns, in order.
        key: the column naming the episode the unit belongs to.
    """
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    try:
        result: pd.DataFrame | Exception = fn(unit)
    except Exception as exc:  # noqa: BLE001 - the single guard of DESIGN.md: the batch goes on
        result = exc
    return _status_rows(result, unit, columns, key, time.perf_counter() - wall0, cpu_seconds() - cpu0)


def _status_rows(
    result: pd.DataFrame | Exception,
    unit: pd.DataFrame,
    columns: Sequence[str],
    key: str,
    wall_s: float,
    cpu_s: float,
) -> pd.DataFrame:
    """A unit's guarded output: its rows (or a done row), or one error row for an exception."""
    out: pd.DataFrame | None = None
    kind, message = ERROR_KIND, None
    try:
        if isinstance(result, Exception):
            raise result
        missing = [c for c in columns if c not in result.columns]
        if missing:
            raise KeyError(f"unit function returned no column(s) {missing}")
        out, kind = result.loc[:, list(columns)].copy(), ROW_KIND
    except Exception as exc:  # noqa: BLE001 - the single guard of DESIGN.md: the batch goes on
        message = _describe(exc)
        logger.warning("unit failed %s=%s error=%s", key, unit[key].iat[0], message)
        logger.debug("traceback: %s", "".join(traceback.format_exception(exc)))
        message = message[:2000]
    if out is None or out.empty:
        row = dict.fromkeys(columns)
        row[key] = unit[key].iat[0]
        out = pd.DataFrame([row], columns=list(columns))
        kind = DONE_KIND if kind == ROW_KIND else kind
    out["_row_kind"] = kind
    out["_error"] = message
    seconds = np.full(len(out), np.nan)
    out["_unit_s"], out["_unit_cpu_s"] = seconds, seconds.copy()
    out.iloc[-1, out.columns.get_indexer(["_unit_s", "_unit_cpu_s"])] = [wall_s, cpu_s]
    return out


#: An allocation refused outside Python: torch's allocator, a failed mmap (ENOMEM).
_OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory")
#: What a thread whose stack cannot be mapped says (pthread_create's EAGAIN: FFmpeg's decoder threads).
_NO_THREAD = "Resource temporarily unavailable"


def _describe(exc: Exception) -> str:
    """`Type: message`; for running out of memory, also the worker's bound (`udfs.memory`) when it has one."""
    message = f"{type(exc).__name__}: {exc}"
    bound = memory_bound_mb()
    if bound is None:
        return message
    over = f"over this task's memory bound of {bound} MiB: spark.python_worker_memory_mb"
    if isinstance(exc, MemoryError) or any(sign in message for sign in _OUT_OF_MEMORY):
        return f"{message} ({over})"
    return f"{message} (perhaps {over})" if _NO_THREAD in message else message


def guarded_pair(fn: PairFn, columns: Sequence[str], key: str = "episode_id") -> PairFn:
    """`fn(left, right)` of one unit's two inputs (a cogroup's two sides) under the guard.

    The error row names the unit by `key` from whichever side has rows.
    """

    def guarded(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        return run_unit(lambda _: fn(left, right), left if not left.empty else right, columns, key)

    return guarded


def guarded_map(
    fn: UnitFn, columns: Sequence[str], unit_keys: Sequence[str], key: str = "episode_id"
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A `mapInPandas` function running `fn` once per unit (rows sharing `unit_keys`)."""

    def mapper(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            for _, unit in batch.groupby(list(unit_keys), sort=False):
                yield run_unit(fn, unit.reset_index(drop=True), columns, key)

    return mapper


def guarded_batch_map(
    fn: BatchFn,
    columns: Sequence[str],
    unit_keys: Sequence[str],
    batch_units: int,
    weight: Callable[[pd.DataFrame], float],
    key: str = "episode_id",
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A `mapInPandas` function running `fn` on up to `batch_units` units of the task at a time.

    Each unit's result is guarded as `run_unit`'s is; an exception of the call itself fails its units.
    The call's seconds are shared among its units in proportion to `weight(unit)` (e.g. frames).
    """

    def mapper(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        units = [
            unit.reset_index(drop=True)
            for batch in batches
            for _, unit in batch.groupby(list(unit_keys), sort=False)
        ]
        size = max(1, batch_units)
        for start in range(0, len(units), size):
            group = units[start : start + size]
            wall0, cpu0 = time.perf_counter(), cpu_seconds()
            try:
                results = fn(group)
            except Exception as exc:  # noqa: BLE001 - the single guard of DESIGN.md: the batch goes on
                results = [exc] * len(group)
            wall_s, cpu_s = time.perf_counter() - wall0, cpu_seconds() - cpu0
            weights = np.array([max(float(weight(unit)), 0.0) for unit in group])
            shares = weights / weights.sum() if weights.sum() > 0 else np.full(len(group), 1.0 / len(group))
            for unit, result, share in zip(group, results, shares, strict=True):
                yield _status_rows(result, unit, columns, key, share * wall_s, share * cpu_s)

    return mapper
