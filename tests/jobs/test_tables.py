"""Delta writes under concurrency: commits that conflict with another run's are retried, nothing lost."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from schemas.tables import QUARANTINE


def test_a_conflict_is_retried_and_other_errors_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("delta")
    from delta.exceptions import ProtocolChangedException
    from pyspark.errors import PySparkException

    from jobs import tables

    monkeypatch.setattr(tables, "_BACKOFF_S", 0.0)
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ProtocolChangedException(message="a concurrent writer created the table")

    tables._retry_conflicts(flaky, "t", "/out/tables/t")
    assert len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise ValueError("not a conflict")

    calls.clear()
    with pytest.raises(ValueError, match="not a conflict"):
        tables._retry_conflicts(broken, "t", "/out/tables/t")
    assert len(calls) == 1

    def always() -> None:
        raise ProtocolChangedException(message="still")

    with pytest.raises(ProtocolChangedException):
        tables._retry_conflicts(always, "t", "/out/tables/t")

    def full() -> None:
        calls.append(1)
        raise PySparkException(message="Task failed: java.io.IOException: No space left on device")

    calls.clear()
    with pytest.raises(OSError, match=r"no space left on device writing table t at /out/tables/t: nothing"):
        tables._retry_conflicts(full, "t", "/out/tables/t")
    assert len(calls) == 1  # not retried


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
