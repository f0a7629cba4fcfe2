"""Shared fixtures: one local Spark session for the whole test run, temp output folders."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data_paths import SHARED_DATA


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (read-only real test data); tests skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A small embedded Spark with Delta (local[2], UI off, few shuffle partitions)."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("no Java: Spark tests need a JDK (make setup)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from jobs.spark import SparkOptions, build_spark

    session = build_spark(SparkOptions(master="local[2]", shuffle_partitions=4, driver_memory="2g"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The ingest corpus of good, bad and awkward inputs: (root, {input path: expected outcome})."""
    from tests.corpus import make_corpus

    root = tmp_path_factory.mktemp("corpus")
    return root, make_corpus(root)
