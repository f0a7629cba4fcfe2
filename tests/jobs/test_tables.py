"""Delta writes under concurrency: commits that conflict with another run's are retried, nothing lost."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from schemas.tables import QUARANTINE

REPO = Path(__file__).resolve().parents[2]


def test_a_conflict_is_retried_and_other_errors_are_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("delta")
    from delta.exceptions import ProtocolChangedException
    from pyspark.errors import PySparkException

    from jobs import tables

    monkeypatch.setattr(tables, "_BACKOFF_S", 0.0)
    path = str(tmp_path / "tables" / "t")
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ProtocolChangedException(message="a concurrent writer created the table")

    tables._retry_conflicts(flaky, "t", path)
    assert len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise ValueError("not a conflict")

    calls.clear()
    with pytest.raises(ValueError, match="not a conflict"):
        tables._retry_conflicts(broken, "t", path)
    assert len(calls) == 1

    def always() -> None:
        raise ProtocolChangedException(message="still")

    with pytest.raises(ProtocolChangedException):
        tables._retry_conflicts(always, "t", path)

    def full() -> None:
        calls.append(1)
        raise PySparkException(message="Task failed: java.io.IOException: No space left on device")

    calls.clear()
    message = f"no space left on device writing table t at {path}: nothing"
    with pytest.raises(OSError, match=re.escape(message)):
        tables._retry_conflicts(full, "t", path)
    assert len(calls) == 1  # not retried


_HOLD_THE_LOCK = """
import sys, time
from jobs.tables import _commit_lock
with _commit_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_commit_waits_while_another_process_commits_to_the_table(tmp_path: Path) -> None:
    """Delta's local log store is atomic only within one JVM (jobs/tables.py): a commit waits for another
    process's commit to the same table, and a holder that dies (SIGKILL) releases it at once."""
    pytest.importorskip("delta")
    from jobs import tables

    path = str(tmp_path / "tables" / "videos")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_LOCK, path], cwd=REPO,  # noqa: S603
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        committed = threading.Event()
        commit = threading.Thread(target=tables._retry_conflicts, args=(committed.set, "videos", path))
        commit.start()
        assert not committed.wait(1.0)  # held by the other process: no commit meanwhile
        beside = str(tmp_path / "tables" / "quarantine")
        other = threading.Thread(target=tables._retry_conflicts, args=(lambda: None, "quarantine", beside))
        other.start()
        other.join(10)
        assert not other.is_alive()  # another table's commits do not wait
    finally:
        holder.kill()
        holder.wait()
    assert committed.wait(10)
    commit.join(10)


@pytest.mark.spark
def test_concurrent_first_writes_to_one_new_table_all_land(spark, tmp_path) -> None:
    """Four writers create one table at once (as two runs on a new OUTPUT do): every row lands once."""
    from jobs.tables import Layout, Lineage, read, write

    layout = Layout(str(tmp_path))
    paths = [f"/in/{i}.mp4" for i in range(4)]

    def write_one(path: str) -> None:
        row = {"source_path": path, "reason_code": "corrupt", "message": f"{path}: bad", "size_bytes": 1,
               "content_sha256": None, "duplicate_of": None}  # fmt: skip
        lineage = Lineage(run_id=f"run-{path}", stage_version="1", config_hash="h")
        write(spark.createDataFrame([row], QUARANTINE.spark), layout, QUARANTINE, [path], lineage)

    with ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(write_one, paths))
    got = sorted(r.source_path for r in read(spark, layout, QUARANTINE).collect())
    assert got == paths


@pytest.mark.spark
def test_a_table_stored_with_other_columns_is_refused_by_name(spark, tmp_path) -> None:
    """An OUTPUT from before a column rename: the write names the table and columns and changes nothing."""
    from pyspark.sql import functions as F

    from jobs.tables import Layout, Lineage, TableColumnsChangedError, read, write

    layout = Layout(str(tmp_path))
    row = {"source_path": "/in/a.mp4", "reason_code": "corrupt", "message": "bad", "size_bytes": 1,
           "content_sha256": None, "duplicate_of": None}  # fmt: skip
    lineage = Lineage(run_id="run-1", stage_version="1", config_hash="h")
    write(spark.createDataFrame([row], QUARANTINE.spark), layout, QUARANTINE, ["/in/a.mp4"], lineage)
    old = read(spark, layout, QUARANTINE).withColumnRenamed("message", "msg")
    renamed = old.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    renamed.save(layout.table(QUARANTINE.name))

    with pytest.raises(TableColumnsChangedError, match=r"quarantine at .*\['msg'\].*\['message'\]"):
        write(spark.createDataFrame([row], QUARANTINE.spark), layout, QUARANTINE, ["/in/a.mp4"], lineage)
    stored = read(spark, layout, QUARANTINE)
    assert stored.columns.count("msg") == 1 and stored.filter(F.col("msg") == "bad").count() == 1


def test_without_file_locks_commits_go_ahead_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mounted file system without `flock` (ENOLCK) must not stop the run: commits go on, warned once."""
    pytest.importorskip("delta")
    import errno

    from jobs import tables

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(tables.fcntl, "flock", no_locks)
    commits = []
    for _ in range(3):
        tables._retry_conflicts(lambda: commits.append(1), "videos", str(tmp_path / "nolocks" / "videos"))
    assert len(commits) == 3
    warned = [r for r in caplog.records if "commit locks not taken" in r.getMessage()]
    assert len(warned) == 1 and "No locks available" in warned[0].getMessage()
