"""Determinism and worker death (issue 23), in one run: the same input and configuration give the same
data in every stage table whatever the number of cores, also when Python workers die on the way.

The reference is the session's demo run (`demo_run`: local[2]). A second run of its sample by
`egolake run` on local[1] (its own JVM: a session's master is fixed), with a Python worker SIGKILLed
once in each of the hands, tracking and export stages (`tests.jobs.faults`), must end with every stage
ok (Spark tries the killed tasks again: `spark.task_max_failures`; local mode alone would try a task
once), every stage table but `runs` equal value for value (floats equal, not close: an episode's math,
BA included, runs in one Python worker on rows the unit puts in frame order itself, so Spark's
partitioning cannot reorder a float reduction), the same dataset files but the videos
(`dataset_files`), and no staging files left by the killed export.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.faults import UNITS
from tests.jobs.tables_util import assert_same_tables, dataset_files
from tests.jvm_flags import java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_a_run_on_one_core_with_workers_killed_gives_the_same_tables(spark, demo_run, tmp_path):
    from jobs.cli import DEMO_EMBODIMENTS

    reference, _, _ = demo_run
    out, markers = tmp_path / "out", tmp_path / "markers"
    markers.mkdir()
    env = {**java_options_env(), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(  # noqa: S603 -- our own CLI, no shell
        [sys.executable, "-m", "tests.jobs.killing_cli", str(markers), "run", "-v",
         os.path.join(reference, "sample", "videos"), str(out),
         "--set", "spark.master=local[1]", "--set", f"embodiments=[{','.join(DEMO_EMBODIMENTS)}]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "master=local[1," in proc.stderr  # one core (and task retries)
    assert sorted(p.stem for p in markers.iterdir()) == sorted(UNITS), "every stage's worker must have died"
    assert_same_tables(spark, str(out), reference)
    dataset = ("datasets", "hands", "v1")
    assert dataset_files(out.joinpath(*dataset)) == dataset_files(Path(reference, *dataset))
    assert not (out / "datasets" / "hands" / "_staging").exists()  # the killed export's files went with it
