"""Several tables in one pandas-UDF frame: rows stacked, each naming its table in `_table`.

A Spark UDF returns one schema. When one pass produces rows of several tables (priors: `frames`
and `features`; tracking: `tracks`, `cameras`, `keyframes`, `map_points`), its output schema is the
union of the tables' columns plus `_table`; each row fills its own table's columns and leaves the
others null. `jobs.stage.write_guarded` splits them again. The same layout carries several input
tables into one `applyInPandas` group (`jobs.camera_poses.stacked`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from schemas import TableSchema

__all__ = ["TABLE_COLUMN", "split_tables", "stack_tables", "union_schema"]

logger = logging.getLogger(__name__)

#: Column naming the table of each stacked row.
TABLE_COLUMN = "_table"


def union_schema(schemas: Sequence[TableSchema]) -> pa.Schema:
    """The data columns of all `schemas` (first occurrence order, all nullable) plus `_table`.

    Raises:
        TypeError: a column name appears in two tables with different types.
    """
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for f in schema.arrow:
            if f.name in fields and fields[f.name].type != f.type:
                raise TypeError(f"column {f.name} is {fields[f.name].type} and {f.type} in stacked tables")
            fields.setdefault(f.name, f.with_nullable(True))
    return pa.schema([*fields.values(), pa.field(TABLE_COLUMN, pa.string())])


def stack_tables(parts: Sequence[tuple[TableSchema, pd.DataFrame]]) -> pd.DataFrame:
    """Stack per-table frames into one frame with the columns of `union_schema` (missing = null)."""
    union = union_schema([s for s, _ in parts])
    frames = [df.loc[:, list(schema.columns)].assign(**{TABLE_COLUMN: schema.name}) for schema, df in parts]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=union.names)
    out = pd.concat(frames, ignore_index=True).reindex(columns=union.names)
    for f in union:  # rows of other tables hold NaN in list columns: Arrow needs None there
        if pa.types.is_list(f.type):
            out[f.name] = [None if isinstance(v, float) else v for v in out[f.name]]
    return out


def split_tables(stacked: pd.DataFrame, schemas: Sequence[TableSchema]) -> dict[str, pd.DataFrame]:
    """Inverse of `stack_tables`: each table's rows and columns, by table name (empty when absent)."""
    out = {}
    for schema in schemas:
        rows = stacked[stacked[TABLE_COLUMN] == schema.name]
        out[schema.name] = rows.loc[:, list(schema.columns)].reset_index(drop=True)
    return out
