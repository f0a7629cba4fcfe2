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
