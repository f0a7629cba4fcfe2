"""One schema per Delta table, each with a version: the table contract in code.

A table's columns are declared once, as an Arrow schema (udfs build pandas/Arrow frames from it
without Spark); the Spark `StructType` is derived from it. Every stage table also gets the
lineage columns `run_id`, `stage_version` and `config_hash`, added by `jobs.tables.write`.
"""

from schemas.base import LINEAGE_FIELDS, TableSchema
from schemas.registry import TABLES, table

__all__ = ["LINEAGE_FIELDS", "TABLES", "TableSchema", "table"]
