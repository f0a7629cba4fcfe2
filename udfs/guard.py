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
        out = fn(unit)
        missing = [c for c in columns if c not in out.columns]
        if missing:
            raise KeyError(f"unit function returned no column(s) {missing}")
        out = out.loc[:, list(columns)].copy()
        kind, message = ROW_KIND, None
    except Exception as exc:  # noqa: BLE001 - the single guard of DESIGN.md: the batch goes on
        message = _describe(exc)
        logger.warning("unit failed %s=%s error=%s", key, unit[key].iat[0], message)
        logger.debug("traceback: %s", traceback.format_exc())
        out, kind, message = None, ERROR_KIND, message[:2000]
    if out is None or out.empty:
        row = dict.fromkeys(columns)
        row[key] = unit[key].iat[0]
        out = pd.DataFrame([row], columns=list(columns))
        kind = DONE_KIND if kind == ROW_KIND else kind
    out["_row_kind"] = kind
    out["_error"] = message
    seconds = np.full(len(out), np.nan)
    out["_unit_s"], out["_unit_cpu_s"] = seconds, seconds.copy()
    out.iloc[-1, out.columns.get_indexer(["_unit_s", "_unit_cpu_s"])] = [
        time.perf_counter() - wall0, cpu_seconds() - cpu0,
    ]  # fmt: skip
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
