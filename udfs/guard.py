"""The one place where per-unit exceptions are caught.

A pandas UDF processes units (a shard, an episode). `guarded` runs the unit's function and turns
any exception into a status row, so one bad episode marks only itself failed and the batch goes on.
Output rows carry `_row_kind` ("row" for data, "error" for a failed unit) and `_error`; the job
side (`jobs.stage.split_guarded`) separates them.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterator, Sequence

import pandas as pd
import pyarrow as pa

__all__ = ["ERROR_KIND", "ROW_KIND", "guarded_map", "guarded_pair", "guarded_schema", "run_unit"]

logger = logging.getLogger(__name__)

ROW_KIND = "row"
ERROR_KIND = "error"
_STATUS_FIELDS = (pa.field("_row_kind", pa.string()), pa.field("_error", pa.string()))

UnitFn = Callable[[pd.DataFrame], pd.DataFrame]
PairFn = Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame]


def guarded_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with every field nullable plus the two status columns."""
    return pa.schema([f.with_nullable(True) for f in schema] + list(_STATUS_FIELDS))


def run_unit(fn: UnitFn, unit: pd.DataFrame, columns: Sequence[str], key: str = "episode_id") -> pd.DataFrame:
    """Run `fn` on one unit; on any exception return one error row naming the unit's key.

    Args:
        fn: unit function, pandas frame in, frame with `columns` out.
        unit: the unit's input rows (all share `key`).
        columns: output data columns, in order.
        key: the column naming the episode the unit belongs to.
    """
    try:
        out = fn(unit)
        missing = [c for c in columns if c not in out.columns]
        if missing:
            raise KeyError(f"unit function returned no column(s) {missing}")
        out = out.loc[:, list(columns)].copy()
        out["_row_kind"] = ROW_KIND
        out["_error"] = None
        return out
    except Exception as exc:  # noqa: BLE001 - the single guard of DESIGN.md: the batch goes on
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("unit failed %s=%s error=%s", key, unit[key].iat[0], message)
        logger.debug("traceback: %s", traceback.format_exc())
        row = dict.fromkeys(columns)
        row[key] = unit[key].iat[0]
        row["_row_kind"] = ERROR_KIND
        row["_error"] = message[:2000]
        return pd.DataFrame([row], columns=[*columns, "_row_kind", "_error"])


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
