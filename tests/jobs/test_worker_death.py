"""A Python worker SIGKILLed in the hands, tracking and export stages (issue 23): Spark tries the task
again (`spark.task_max_failures`; local mode alone would try it once) and the run ends with the tables
and dataset of an uninterrupted run.

The faults are injected without hooks in egolake: the stages' unit functions are replaced, in the
driver, by `_dies_once` around them. Spark pickles that wrapper by reference, so the Python workers
import it from this module; the first unit of each stage to finish kills its own worker with SIGKILL
(after its work: the export unit has written its staging files), every later call runs as usual.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.jobs.tables_util import assert_same_tables, dataset_files

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

#: Stage -> (module, name) of the unit function its Spark tasks run.
UNITS = {
    "hands": ("jobs.hands", "hands_for_shard"),
    "tracking": ("jobs.camera_poses", "tracking_unit"),
    "export": ("jobs.export", "export_episode"),
}


def _dies_once(marker: str, fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    """`fn(*args, **kwargs)`; the first call to create `marker` then SIGKILLs its own process."""
    out = fn(*args, **kwargs)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return out
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the worker was killed")


def test_a_worker_killed_in_hands_tracking_and_export_is_retried(spark, demo_run, tmp_path, monkeypatch):
    """One run with a worker killed once in each of the three stages, against the session's uninterrupted
    demo run (same sample, same configuration): every stage ok, same tables, same dataset files."""
    import importlib

    from jobs.pipeline import run_pipeline

    reference, cfg, _ = demo_run
    markers = {stage: tmp_path / f"{stage}.killed" for stage in UNITS}
    for stage, (module, name) in UNITS.items():
        module_ = importlib.import_module(module)
        monkeypatch.setattr(module_, name, partial(_dies_once, str(markers[stage]), getattr(module_, name)))
    out = tmp_path / "out"
    summary = run_pipeline(spark, cfg, os.path.join(reference, "sample", "videos"), str(out))
    assert summary.failed == 0, summary.counts
    assert all(m.exists() for m in markers.values()), "every stage's worker must have been killed"
    assert_same_tables(spark, str(out), reference)
    dataset = ("datasets", "hands", "v1")
    assert dataset_files(out.joinpath(*dataset)) == dataset_files(Path(reference, *dataset))
    assert not (out / "datasets" / "hands" / "_staging").exists()  # the killed export's files went with it
