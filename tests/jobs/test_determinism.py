"""Determinism (issue 23): the same input and configuration give the same data in every stage table,
run after run and whatever the number of cores.

The reference is the session's demo run (`demo_run`: local[2]); a second run of its sample by
`egolake run` on local[1] (its own JVM: a session's master is fixed) must give every stage table but
`runs` value for value (floats equal, not close: an episode's math, BA included, runs in one Python
worker on rows the unit puts in frame order itself, so Spark's partitioning cannot reorder a float
reduction), and the same dataset files but the videos (`dataset_files`). A second local[2] run is
`test_worker_death.py`'s, compared the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.tables_util import assert_same_tables, dataset_files
from tests.jvm_flags import SHORT_JVM_FLAGS, java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_a_second_run_on_one_core_gives_the_same_tables(spark, demo_run, tmp_path):
    from jobs.cli import DEMO_EMBODIMENTS

    reference, _, _ = demo_run
    out = tmp_path / "out"
    env = {**java_options_env(SHORT_JVM_FLAGS), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(  # noqa: S603 -- our own CLI, no shell
        [sys.executable, "-m", "jobs.cli", "run", "-v", os.path.join(reference, "sample", "videos"), str(out),
         "--set", "spark.master=local[1]", "--set", f"embodiments=[{','.join(DEMO_EMBODIMENTS)}]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "master=local[1," in proc.stderr  # one core (and task retries)
    assert_same_tables(spark, str(out), reference)
    dataset = ("datasets", "hands", "v1")
    assert dataset_files(out.joinpath(*dataset)) == dataset_files(Path(reference, *dataset))
