"""`jobs.spark`'s options without a session: an embedded local master retries failed tasks."""

from __future__ import annotations

import pytest

from jobs.spark import SparkOptions, local_master


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", "local[1,4]"),
        ("local[2]", "local[2,4]"),
        ("local[*]", "local[*,4]"),
        ("local[2,1]", "local[2,1]"),  # the user's own number of attempts
        ("local-cluster[2,1,1024]", "local-cluster[2,1,1024]"),  # spark.task.maxFailures applies there
        ("spark://host:7077", "spark://host:7077"),
    ],
)
def test_local_masters_get_task_retries(master, expected):
    assert local_master(master, 4) == expected


def test_task_max_failures_must_allow_one_attempt():
    with pytest.raises(ValueError, match="task_max_failures"):
        SparkOptions(task_max_failures=0)


@pytest.mark.spark
def test_workers_fork_from_the_daemon_with_the_stage_modules_loaded(spark):
    """A new Python worker finds the stage modules imported (`udfs.worker_daemon`), not at its first task."""
    import pandas as pd

    from udfs.worker_daemon import PRELOADED

    assert spark.conf.get("spark.python.daemon.module") == "udfs.worker_daemon"

    def loaded(batches):
        import sys  # noqa: PLC0415 -- runs in the worker

        for _ in batches:
            yield pd.DataFrame({"missing": [",".join(m for m in PRELOADED if m not in sys.modules)]})

    missing = spark.range(4).repartition(2).mapInPandas(loaded, "missing string").toPandas()["missing"]
    assert len(missing) >= 1
    assert set(missing) == {""}
