"""The `TableSchema` value type shared by every table module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["LINEAGE_FIELDS", "TableSchema", "spark_schema"]

#: Columns every stage table carries, set by `jobs.tables.write` (DESIGN.md table contract).
LINEAGE_FIELDS: tuple[pa.Field, ...] = (
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("stage_version", pa.string(), nullable=False),
    pa.field("config_hash", pa.string(), nullable=False),
)


@dataclass(frozen=True)
class TableSchema:
    """A table's name, version, key and columns.

    Attributes:
        name: table name, also its folder under OUTPUT/tables and its SQL name.
        version: bumped on any incompatible column change.
        key: columns that identify a row; `partition_key` rows are replaced together on re-run.
        partition_key: the column a stage's `replaceWhere` filters on (usually `episode_id`).
        arrow: the data columns (without lineage).
        lineage: whether `run_id`, `stage_version`, `config_hash` are appended.
    """

    name: str
    version: str
    key: tuple[str, ...]
    partition_key: str
    arrow: pa.Schema
    lineage: bool = True

    @property
    def arrow_full(self) -> pa.Schema:
        """Arrow schema with lineage columns, as stored."""
        if not self.lineage:
            return self.arrow
        return pa.schema(list(self.arrow) + list(LINEAGE_FIELDS))

    @property
    def spark(self) -> StructType:
        """Spark schema of the data columns (imports pyspark lazily)."""
        return spark_schema(self.arrow)

    @property
    def spark_full(self) -> StructType:
        """Spark schema with lineage columns, as stored."""
        return spark_schema(self.arrow_full)

    @property
    def columns(self) -> list[str]:
        """Data column names in order."""
        return list(self.arrow.names)


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark `StructType` of an Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
