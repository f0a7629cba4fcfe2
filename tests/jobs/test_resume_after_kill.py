"""A run killed mid-stage and re-run with --resume ends with the same tables as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.jobs.tables_util import DATA_TABLES, content
from tests.jvm_flags import java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

SETTINGS = ["batch_episodes=3"]
UNTIL = "priors"  # the framework is under test; later stages have their own tests


def _delta_commits(table_dir: Path) -> int:
    log = table_dir / "_delta_log"
    return len(list(log.glob("*.json"))) if log.is_dir() else 0


def test_kill_mid_stage_then_resume_matches_uninterrupted(spark, corpus, corpus_run, tmp_path):
    """The reference is the session's uninterrupted corpus run (ingest..priors, 8 episodes a batch): the
    killed run (3 a batch) must end with the same data whatever its batches and wherever it was cut."""
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline

    root, _ = corpus
    reference, _, _ = corpus_run
    cfg = load_config([], SETTINGS)

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "jobs.cli", "run", str(root), str(killed), "--until-stage", UNTIL]
    cmd += [a for s in SETTINGS for a in ("--set", s)]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        cmd, cwd=repo, env=java_options_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        # Wait until priors has committed two batches (of several; the first one is then also
        # logged in `runs`), then kill the driver and its JVM.
        while _delta_commits(killed / "tables" / "frames") < 2:
            if proc.poll() is not None:
                pytest.fail(f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("priors never committed a batch")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    partial = content(spark, str(killed), "frames")["episode_id"].nunique()
    n_episodes = len(content(spark, str(killed), "videos"))
    assert 0 < partial < n_episodes, "the kill must land mid-stage"

    resumed = run_pipeline(spark, cfg, str(root), str(killed), resume=True, until_stage=UNTIL)
    assert resumed.counts["ingest"]["skipped"] == n_episodes
    # Episodes whose batch committed (and was logged in `runs`) before the kill are not redone.
    assert resumed.counts["priors"]["skipped"] <= partial
    assert resumed.counts["priors"]["ok"] + resumed.counts["priors"]["skipped"] == n_episodes
    assert resumed.counts["priors"]["ok"] < n_episodes
    for name in DATA_TABLES:
        pd.testing.assert_frame_equal(content(spark, str(killed), name), content(spark, reference, name))
