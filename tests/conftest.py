"""Shared fixtures: one local Spark session for the whole test run, the ingest corpus and one pipeline run
over it, one `egolake demo` run, temp output folders.

The shared runs are read-only: a test that re-runs stages or adds episodes works on a copy
(`tests.jobs.tables_util.copy_output`)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data_paths import SHARED_DATA

# Every JVM the suite starts reads tests/spark_conf/spark-defaults.conf (why: its comments).
os.environ["SPARK_CONF_DIR"] = str(Path(__file__).resolve().parent / "spark_conf")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (read-only real test data); tests skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A small embedded Spark with Delta (local[2], UI off, few shuffle partitions, Delta's log replay in
    `SparkOptions.delta_snapshot_partitions` = 2 partitions instead of 50: each read and write of the tests'
    tiny tables is several times cheaper), its JVM started with `tests.jvm_flags.JVM_FLAGS`."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("no Java: Spark tests need a JDK (make setup)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from jobs.spark import SparkOptions, build_spark
    from tests.jvm_flags import java_options_env

    with pytest.MonkeyPatch.context() as patch:  # this JVM's flags only: subprocesses choose their own
        patch.setenv("JDK_JAVA_OPTIONS", java_options_env()["JDK_JAVA_OPTIONS"])
        session = build_spark(SparkOptions(master="local[2]", shuffle_partitions=4, driver_memory="2g"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The ingest corpus of good, bad and awkward inputs: (root, {input path: expected outcome})."""
    from tests.corpus import make_corpus

    root = tmp_path_factory.mktemp("corpus")
    return root, make_corpus(root)


@pytest.fixture(scope="session")
def corpus_run(spark, corpus, tmp_path_factory) -> tuple[str, object, object]:
    """The corpus through ingest and priors, uninterrupted (`batch_episodes=8`): (output, config, summary).

    Read-only: the framework tests share it as their first run and reference; a test that re-runs stages
    works on a copy (`copy_output`).
    """
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline

    root, _ = corpus
    out = str(tmp_path_factory.mktemp("corpus_run"))
    cfg = load_config([], ["batch_episodes=8"])
    return out, cfg, run_pipeline(spark, cfg, str(root), out, until_stage="priors")


@pytest.fixture(scope="session")
def demo_run(spark, tmp_path_factory) -> tuple[str, object, object]:
    """`egolake demo` with the default configuration (`jobs.cli.run_demo`: the generated 5-s clip through
    every stage, ending in datasets hands/v1, hands-so100/v1 and hands-panda/v1): (output, config,
    summary). The sample is under OUTPUT/sample.

    Read-only: the export tests share it; a test that re-runs stages or adds episodes
    works on a copy (`copy_output`).
    """
    from dataclasses import replace

    from jobs.cli import DEMO_EMBODIMENTS, run_demo
    from jobs.config import load_config

    out = str(tmp_path_factory.mktemp("demo"))
    cfg = replace(load_config([], []), embodiments=DEMO_EMBODIMENTS)  # as `egolake demo` runs it
    return out, cfg, run_demo(spark, cfg, out)


SHARED_RUNS = ("demo_run", "corpus_run")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """How `make test` (`pytest -n N`) shares tests among workers: a module's tests stay on one worker (its
    module fixtures are built once), and so do all modules that use one of the shared pipeline runs
    (`SHARED_RUNS`: minutes of CPU each, so each is built once). The controller does not
    collect, so a module's run is read from its source: the fixture's name in it."""
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModuleOrSharedRun(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(root, nodeid.split("::", maxsplit=1)[0])

    return ModuleOrSharedRun(config, log)


@functools.cache
def _scope(root: Path, module: str) -> str:
    """The shared run `module` uses (by name), else the module itself."""
    text = (root / module).read_text(encoding="utf-8")
    return next((run for run in SHARED_RUNS if run in text), module)
