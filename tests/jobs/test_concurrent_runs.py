"""Two `egolake run` commands at once on one new OUTPUT (issue 23): both finish, every input is accounted.

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
from tests.jvm_flags import SHORT_JVM_FLAGS, java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_two_runs_with_disjoint_inputs_at_once(spark, tmp_path):
    inputs = {}
    for run in ("a", "b"):
        folder = tmp_path / f"in_{run}"
        for k in range(2):
            path = folder / f"clip_{run}{k}.mp4"
            encode_clip(path, textured_frames(10 * (run == "b") + k, 12))
            inputs[str(path)] = run
        (folder / f"broken_{run}.mp4").write_bytes(b"not a video")
        inputs[str(folder / f"broken_{run}.mp4")] = run
    out = tmp_path / "out"
    python = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env = {**java_options_env(SHORT_JVM_FLAGS), **python}
    procs = [
        subprocess.Popen(  # noqa: S603 -- our own CLI, no shell
            [sys.executable, "-m", "jobs.cli", "run", str(tmp_path / f"in_{run}"), str(out),
             "--stages", "ingest", "--set", "spark.master=local[1]"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for run in ("a", "b")
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    videos = table(spark, str(out), "videos")
    quarantine = table(spark, str(out), "quarantine")
    accounted = [*videos["source_path"], *quarantine["source_path"]]
    assert sorted(accounted) == sorted(inputs)  # every input once, none twice
    assert set(quarantine["source_path"]) == {p for p in inputs if "broken" in p}
    runs = table(spark, str(out), "runs")
    assert runs["run_id"].nunique() == 2 and set(runs["episode_id"]) >= set(videos["episode_id"])
