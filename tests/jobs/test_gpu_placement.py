"""GPU stages' placement: the `gpu` options, the task resource profile, the discovery script, and the
framework's UDF helpers under both placements (local Spark; a local-cluster Spark with fake GPUs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pytest

from jobs.config import GpuOptions, load_config
from jobs.stage import CPU, gpu_profile, gpu_task_cpus, stage_placement

ROOT = Path(__file__).resolve().parents[2]
DISCOVERY = ROOT / "conf" / "gpu_discovery.sh"


def fake_spark(master: str, conf: dict[str, str]) -> SimpleNamespace:
    """What `stage_placement` reads of a session: the master and the Spark conf."""
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master, getConf=lambda: conf))


def fake_nvidia_smi(folder: Path, indices: list[int]) -> Path:
    """A folder with an `nvidia-smi` that lists these GPU indices, as `--query-gpu=index` prints them."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + "".join(f"echo {i}\n" for i in indices))
    tool.chmod(0o755)
    return folder


def test_gpu_is_off_by_default_and_set_from_overrides():
    assert GpuOptions().enabled is False
    cfg = load_config(overrides=["gpu.enabled=true", "gpu.task_amount=0.25", "gpu.stages=[hands, ba]"])
    assert cfg.gpu == GpuOptions(enabled=True, stages=("hands", "ba"), task_amount=0.25)


@pytest.mark.parametrize("amount", [0.0, 0.7, 1.5, -1.0])
def test_task_amounts_spark_refuses_are_refused(amount):
    with pytest.raises(ValueError, match="gpu.task_amount"):
        GpuOptions(task_amount=amount)


@pytest.mark.parametrize(
    ("task_cpus", "amount", "executor_cores", "expected"),
    [
        (0, 1.0, 16, 16),  # one task per GPU takes the executor's cores (host cores / GPUs)
        (0, 0.25, 16, 4),  # four tasks share a GPU and the cores
        (0, 2.0, 16, 16),
        (0, 1.0, None, 1),  # executor cores unknown: spark.task.cpus
        (0, 0.0625, 8, 1),  # never below spark.task.cpus
        (3, 1.0, 16, 3),  # set explicitly
    ],
)
def test_gpu_task_cpus(task_cpus, amount, executor_cores, expected):
    opts = GpuOptions(enabled=True, task_amount=amount, task_cpus=task_cpus)
    assert gpu_task_cpus(opts, executor_cores, task_cpus=1) == expected


def test_no_profile_unless_gpus_are_on_and_the_stage_asks():
    cluster = fake_spark("spark://head:7077", {"spark.executor.cores": "16"})
    assert stage_placement(cluster, GpuOptions(), "hands") is CPU
    assert stage_placement(cluster, GpuOptions(enabled=True, stages=("ba",)), "hands") is CPU
    assert stage_placement(cluster, GpuOptions(enabled=True), "qa") is CPU


def test_a_gpu_stage_asks_for_its_gpu_amount_and_cpus():
    cluster = fake_spark("spark://head:7077", {"spark.executor.cores": "16", "spark.task.cpus": "1"})
    profile = stage_placement(cluster, GpuOptions(enabled=True, task_amount=0.5), "hands").profile
    tasks = profile.taskResources
    assert (tasks["gpu"].amount, tasks["cpus"].amount) == (0.5, 8)
    assert profile.executorResources == {}  # executors as the cluster configures them


def test_local_master_cannot_schedule_gpus():
    with pytest.raises(ValueError, match="gpu.enabled=false"):
        stage_placement(fake_spark("local[4]", {}), GpuOptions(enabled=True), "hands")


def test_discovery_script_prints_sparks_resource_json(tmp_path):
    shell = tmp_path / "shell"  # bash alone on PATH: the script needs nothing else, and no real nvidia-smi
    shell.mkdir()
    (shell / "bash").symlink_to(shutil.which("bash"))

    def discover(path: str) -> dict:
        out = subprocess.run([str(DISCOVERY)], capture_output=True, text=True, check=True, env={"PATH": path})
        return json.loads(out.stdout)

    two = fake_nvidia_smi(tmp_path / "two", [0, 1])
    assert discover(f"{two}:{shell}") == {"name": "gpu", "addresses": ["0", "1"]}
    assert discover(str(shell)) == {"name": "gpu", "addresses": []}  # no nvidia-smi: no GPU


SEEN = pa.schema([pa.field("episode_id", pa.string()), pa.field("rows", pa.int64())])


@pytest.mark.spark
def test_with_gpus_off_the_helpers_run_as_before(spark):
    """Off, no profile: the per-episode helpers plan no extra step and give the unit's rows."""
    from jobs.stage import apply_per_episode, cogroup_per_episode
    from schemas.base import TableSchema

    table = TableSchema("seen", "1", ("episode_id",), "episode_id", SEEN, lineage=False)
    rows = pd.DataFrame({"episode_id": list("aab"), "x": [1, 2, 3]})
    episodes, same = spark.createDataFrame(rows), spark.createDataFrame(rows)  # no self-cogroup

    def count(unit: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"episode_id": [unit["episode_id"].iat[0]], "rows": [len(unit)]})

    results = [
        apply_per_episode(episodes, ["a", "b"], count, [table]),
        cogroup_per_episode(episodes, same, ["a", "b"], lambda left, _: count(left), SEEN),
    ]
    for result in results:
        assert "MapInArrow" not in result._jdf.queryExecution().executedPlan().toString()
        rows = result.where("_row_kind = 'row'").select("episode_id", "rows").toPandas()
        assert dict(zip(rows["episode_id"], rows["rows"], strict=True)) == {"a": 2, "b": 1}


@pytest.mark.spark
def test_local_spark_refuses_a_gpu_profile_so_placement_stops_first(spark):
    """Spark itself refuses task resource profiles under local[N]: `stage_placement` says so before a job."""
    from jobs.stage import Placement, apply_per_episode
    from schemas.base import TableSchema

    table = TableSchema("seen", "1", ("episode_id",), "episode_id", SEEN, lineage=False)
    episodes = spark.createDataFrame(pd.DataFrame({"episode_id": ["a"]}))
    gpu = Placement(gpu_profile(1, 1.0))
    placed = apply_per_episode(episodes, ["a"], lambda u: u.assign(rows=1), [table], gpu)
    assert "MapInArrow" in placed._jdf.queryExecution().executedPlan().toString()  # carries the profile
    with pytest.raises(Exception, match="TaskResourceProfiles are only supported"):
        placed.collect()
    with pytest.raises(ValueError, match="gpu.enabled"):
        stage_placement(spark, GpuOptions(enabled=True), "hands")


@pytest.mark.spark
@pytest.mark.slow
def test_gpu_stages_run_on_the_gpu_spark_gives_their_task(tmp_path):
    """On a cluster that schedules GPUs (local-cluster, two fake GPUs from conf/gpu_discovery.sh), each
    helper's unit runs on the GPU address of its task with the profile's CPUs; on `CPU`, tasks get none."""
    if shutil.which("java") is None:
        pytest.skip("no Java")
    import pyspark

    home = tmp_path / "spark_home"  # pyspark's files, but executors' work folders go here, not into the venv
    home.mkdir()
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PATH": f"{fake_nvidia_smi(tmp_path / 'bin', [0, 1])}:{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYSPARK_PYTHON": sys.executable,
    }
    run = [sys.executable, str(ROOT / "tests" / "jobs" / "gpu_cluster_run.py"), str(tmp_path / "out")]
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for helper in ("map_per_shard", "apply_per_episode", "cogroup_per_episode"):
        cpu, gpu = seen[f"cpu/{helper}"], seen[f"gpu/{helper}"]
        assert cpu["episode_id"] == gpu["episode_id"] == list("abcd"), helper
        assert set(cpu["addresses"]) == {""} and set(cpu["device"]) == {"cpu"}, helper
        assert set(gpu["addresses"]) <= {"0", "1"} and "" not in gpu["addresses"], helper
        assert gpu["device"] == [f"cuda:{a}" for a in gpu["addresses"]], helper
        assert set(gpu["cpus"]) == {2}, helper  # the profile's (executor cores x amount), not spark.task.cpus
