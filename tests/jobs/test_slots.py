"""One task per episode in the per-episode helpers, with adaptive execution on (Spark's default)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from jobs.slots import hash_partition, slot_values

pytestmark = pytest.mark.spark

SEEN = pa.schema([pa.field("episode_id", pa.string()), pa.field("partition", pa.int64())])


def test_spark_hash_partitioning_is_predicted_without_a_job(spark):
    """Slots come from `hash_partition` instead of a probe job: it must be Spark's own."""
    from pyspark.sql import functions as F

    values = [0, 1, 2, 41, 2**31 - 1, 2**31, 2**32 + 5, 2**40 + 3, -1, -(2**35)]
    for n in (1, 2, 3, 4, 7):
        expected = (
            spark.createDataFrame([(v,) for v in values], "v long")
            .select(F.expr(f"pmod(hash(v), {n})").alias("p"))
            .toPandas()["p"]
            .tolist()
        )
        assert [hash_partition(v, n) for v in values] == expected
        assert [hash_partition(v, n) for v in slot_values(n, 10)] == [k % n for k in range(10)]


def test_each_episode_of_a_batch_has_a_task_of_its_own(spark):
    """Eight light episodes: adaptive execution merged a plain groupBy's partitions into one task; the
    helpers give each episode its own (local[2]: 8 tasks) and shuffle once."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    from jobs.stage import apply_per_episode, cogroup_per_episode
    from schemas.base import TableSchema

    table = TableSchema("seen", "1", ("episode_id",), "episode_id", SEEN, lineage=False)
    ids = [f"episode_{k}" for k in range(8)]
    rows = spark.createDataFrame(pd.DataFrame({"episode_id": sorted(ids * 3), "x": range(24)}))
    other = spark.createDataFrame(pd.DataFrame({"episode_id": ids, "y": range(8)}))

    def seen(unit: pd.DataFrame) -> pd.DataFrame:
        assert list(unit.columns) == ["episode_id", "x"]  # the slot is not the unit's business
        task = TaskContext.get().partitionId()
        return pd.DataFrame({"episode_id": [unit["episode_id"].iat[0]], "partition": [task]})

    def seen_pair(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        assert list(right.columns) == ["episode_id", "y"]
        return seen(left)

    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        plain = rows.groupBy("episode_id").applyInPandas(seen, "episode_id string, partition long")
        assert plain.toPandas()["partition"].nunique() == 1  # what the helpers are for
        for result in (
            apply_per_episode(rows, ids, seen, [table]),
            cogroup_per_episode(rows, other, ids, seen_pair, SEEN),
        ):
            got = result.where(F.col("_row_kind") == "row").select("episode_id", "partition").toPandas()
            assert sorted(got["episode_id"]) == ids
            assert got["partition"].nunique() == len(ids), got
            plan = result._jdf.queryExecution().executedPlan().toString()
            # Only the slots' own shuffles: grouping by the slot needs no second one.
            assert plan.count("Exchange hashpartitioning") == plan.count("REPARTITION_BY_NUM")
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)
