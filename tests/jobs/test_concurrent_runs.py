"""`egolake run` commands at once on one new OUTPUT (issue 23): all finish, every input is accounted.

Each run's first writes create the same tables (videos, shards, quarantine, runs) at the same time;
before commit conflicts were retried, one run died with Delta's ProtocolChangedException and its inputs
were in neither `videos` nor `quarantine`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.corpus import encode_clip, textured_frames
from tests.jobs.tables_util import table
from tests.jvm_flags import java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _inputs(folder: Path, run: str, seed: int) -> dict[str, str]:
    """Two clips and a broken file under `folder`: {path: run}."""
    inputs = {}
    for k in range(2):
        path = folder / f"clip_{run}{k}.mp4"
        encode_clip(path, textured_frames(seed + k, 12))
        inputs[str(path)] = run
    (folder / f"broken_{run}.mp4").write_bytes(b"not a video")
    inputs[str(folder / f"broken_{run}.mp4")] = run
    return inputs


def _ingest_at_once(folders: list[Path], out: Path) -> list[str]:
    """`egolake run --stages ingest` on each folder, all started at once into `out`; their logs."""
    python = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env = {**java_options_env(), **python}
    procs = [
        subprocess.Popen(  # noqa: S603 -- our own CLI, no shell
            [sys.executable, "-m", "jobs.cli", "run", str(folder), str(out),
             "--stages", "ingest", "--set", "spark.master=local[1]"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for folder in folders
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(log[-3000:] for log in logs)
    return logs


def _assert_accounted_once(spark, out: Path, inputs: dict[str, str], run_ids: int) -> None:
    videos = table(spark, str(out), "videos")
    quarantine = table(spark, str(out), "quarantine")
    accounted = [*videos["source_path"], *quarantine["source_path"]]
    assert sorted(accounted) == sorted(inputs)  # every input once, none twice
    assert set(quarantine["source_path"]) == {p for p in inputs if "broken" in p}
    assert videos["episode_id"].is_unique
    runs = table(spark, str(out), "runs")
    assert runs["run_id"].nunique() == run_ids and set(runs["episode_id"]) >= set(videos["episode_id"])


def test_three_runs_at_once_two_of_the_same_input_write_each_row_once(spark, tmp_path):
    """Runs of one input (both write the same keys, `replaceWhere` on the episode) and a run of another at
    once: the later commit of a key wins, no row twice, neither run of the same input takes the other's
    copy of an input for a duplicate of it, and the other input's rows all land. One test, three JVMs:
    each JVM's start is most of a run's cost here."""
    inputs = {**_inputs(tmp_path / "in_a", "a", 0), **_inputs(tmp_path / "in_b", "b", 10)}
    _ingest_at_once([tmp_path / "in_a", tmp_path / "in_a", tmp_path / "in_b"], tmp_path / "out")
    _assert_accounted_once(spark, tmp_path / "out", inputs, run_ids=3)
