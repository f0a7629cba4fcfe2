"""Reading an output's tables in tests, and comparing two outputs without their lineage columns."""

from __future__ import annotations

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
