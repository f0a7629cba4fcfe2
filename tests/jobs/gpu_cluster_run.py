"""Child process of tests/jobs/test_gpu_placement.py: the framework's placements on a GPU-scheduling Spark.

    python tests/jobs/gpu_cluster_run.py OUTPUT_DIR

Starts a `local-cluster` Spark (a standalone master, one worker and one executor of 2 cores in separate
JVMs: unlike local[N] it schedules task resource profiles) whose executor has the GPUs that
`conf/gpu_discovery.sh` finds (the test puts a fake nvidia-smi listing two on PATH). It runs a probe unit
through `map_per_shard`, `apply_per_episode` and `cogroup_per_episode` with the `CPU` placement and with
the hands stage's GPU placement, and prints one JSON object: per "<placement>/<helper>", the device, CPUs
and GPU addresses each unit saw, by episode. Needs the repository on PYTHONPATH (the executors import
`udfs` and `jobs`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from jobs.config import GpuOptions, PipelineConfig
from jobs.stage import (
    CPU,
    StageContext,
    apply_per_episode,
    cogroup_per_episode,
    map_per_shard,
    stage_placement,
)
from jobs.tables import Layout
from schemas.base import TableSchema
from udfs.device import current, gpu_addresses
from udfs.guard import ROW_KIND

DISCOVERY = str(Path(__file__).resolve().parents[2] / "conf" / "gpu_discovery.sh")
SEEN = pa.schema([
    pa.field("episode_id", pa.string()), pa.field("device", pa.string()), pa.field("cpus", pa.int64()),
    pa.field("addresses", pa.string()),
])  # fmt: skip


def seen(unit: pd.DataFrame) -> pd.DataFrame:
    """What the unit's task runs on: `udfs.device.current()` and the task's GPU addresses."""
    device = current()
    addresses = ",".join(gpu_addresses(TaskContext.get().resources()))
    row = (unit["episode_id"].iat[0], device.name, device.cpus, addresses)
    return pd.DataFrame([row], columns=SEEN.names)


def main(out: str) -> None:
    """Run the probe under both placements and print what it saw."""
    spark = (
        SparkSession.builder.master("local-cluster[1,2,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.resource.gpu.amount", "2")
        .config("spark.executor.resource.gpu.discoveryScript", DISCOVERY)
        .config("spark.worker.resource.gpu.amount", "2")
        .config("spark.worker.resource.gpu.discoveryScript", DISCOVERY)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ctx = StageContext(spark, PipelineConfig(), Layout(out), "gpu-placement")
    ids = list("abcd")
    rows = pd.DataFrame({"episode_id": ids, "shard_idx": 0})
    episodes, same = spark.createDataFrame(rows), spark.createDataFrame(rows)  # no self-cogroup
    table = TableSchema("seen", "1", ("episode_id",), "episode_id", SEEN, lineage=False)
    result = {}
    for name, placement in (("cpu", CPU), ("gpu", stage_placement(spark, GpuOptions(enabled=True), "hands"))):
        helpers = {
            "map_per_shard": map_per_shard(replace(ctx, placement=placement), episodes, seen, SEEN),
            "apply_per_episode": apply_per_episode(episodes, ids, seen, [table], placement),
            "cogroup_per_episode": cogroup_per_episode(
                episodes, same, ids, lambda left, _: seen(left), SEEN, placement=placement
            ),
        }
        for helper, df in helpers.items():
            rows = df.where(df["_row_kind"] == ROW_KIND).select(*SEEN.names).toPandas()
            result[f"{name}/{helper}"] = rows.sort_values("episode_id").to_dict("list")
    spark.stop()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
