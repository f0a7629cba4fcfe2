from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from jobs.stage import Stage, select_episodes

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _stage(name="b", upstream="a"):
    return Stage(name=name, version="1", upstream=upstream, config_sections=(), outputs=(), process=None)


def _latest(rows):
    return pd.DataFrame(rows, columns=["stage", "episode_id", "status", "config_hash", "finished"])


LATEST = _latest(
    [
        ("a", "e1", "ok", "ha", T0),
        ("a", "e2", "ok", "ha", T0),
        ("a", "e3", "failed", "ha", T0),
        ("a", "e4", "ok", "ha", T0 + timedelta(hours=2)),  # upstream re-ran after b
        ("a", "e5", "ok", "ha", T0),
        ("b", "e1", "ok", "hb", T0 + timedelta(hours=1)),
        ("b", "e2", "failed", "hb", T0 + timedelta(hours=1)),
        ("b", "e4", "ok", "hb", T0 + timedelta(hours=1)),
        ("b", "e5", "ok", "OLD", T0 + timedelta(hours=1)),
    ]
)


def test_force_runs_every_episode_whose_upstream_is_ok():
    run, skip = select_episodes(_stage(), LATEST, None, "hb", force=True)
    assert run == ["e1", "e2", "e4", "e5"]
    assert skip == []


def test_resume_skips_only_ok_same_hash_newer_than_upstream():
    run, skip = select_episodes(_stage(), LATEST, None, "hb", force=False)
    assert skip == ["e1"]
    assert run == ["e2", "e4", "e5"]  # failed, upstream newer, config changed


def test_scope_limits_candidates():
    run, skip = select_episodes(_stage(), LATEST, ["e2", "e3"], "hb", force=True)
    assert (run, skip) == (["e2"], [])


@pytest.mark.spark
def test_write_guarded_isolates_a_failing_episode(spark, tmp_path):
    import pyarrow as pa
    from pyspark.sql import functions as F

    from jobs.config import PipelineConfig
    from jobs.stage import StageContext, write_guarded
    from jobs.tables import Layout, Lineage, read
    from schemas.base import TableSchema, spark_schema
    from udfs.guard import guarded_map, guarded_schema

    schema = TableSchema("toy", "1", ("episode_id", "i"), "episode_id",
                         pa.schema([pa.field("episode_id", pa.string(), False), pa.field("i", pa.int64())]))

    def per_episode(unit: pd.DataFrame) -> pd.DataFrame:
        if unit["episode_id"].iat[0] == "bad":
            raise RuntimeError("decoder exploded")
        return pd.DataFrame({"episode_id": unit["episode_id"].iat[0], "i": range(int(unit["n"].iat[0]))})

    ctx = StageContext(spark, PipelineConfig(), Layout(str(tmp_path)), "run1")
    src = spark.createDataFrame(pd.DataFrame({"episode_id": ["a", "bad", "c"], "n": [3, 2, 4]}))
    fn = guarded_map(per_episode, schema.columns, ["episode_id"])
    result = src.repartition(3).mapInPandas(fn, spark_schema(guarded_schema(schema.arrow)))
    outcomes = write_guarded(ctx, Lineage("run1", "1", "h"), ["a", "bad", "c"], result, schema)
    by_id = {o.episode_id: o for o in outcomes}
    assert (by_id["a"].status, by_id["a"].rows) == ("ok", 3)
    assert (by_id["c"].status, by_id["c"].rows) == ("ok", 4)
    assert by_id["bad"].status == "failed"
    assert by_id["bad"].error == "RuntimeError: decoder exploded"
    table = read(spark, ctx.layout, schema)
    assert table.count() == 7
    # Re-running replaces, never duplicates.
    result2 = src.mapInPandas(fn, spark_schema(guarded_schema(schema.arrow)))
    write_guarded(ctx, Lineage("run2", "1", "h"), ["a", "bad", "c"], result2, schema)
    table = read(spark, ctx.layout, schema)
    assert table.count() == 7
    assert table.where(F.col("run_id") == "run2").count() == 7


@pytest.mark.spark
def test_a_task_past_its_memory_bound_fails_its_episode_alone(spark):
    """Real Python workers: the episode that reserves 6 GiB under a 3 GiB bound fails, naming the bound."""
    import numpy as np
    import pyarrow as pa

    from jobs.stage import Placement, apply_per_episode, guarded_status
    from schemas.base import TableSchema

    fields = [pa.field("episode_id", pa.string(), False), pa.field("gib", pa.float64())]
    table = TableSchema("toy", "1", ("episode_id", "gib"), "episode_id", pa.schema(fields))

    def reserve(unit: pd.DataFrame) -> pd.DataFrame:
        np.empty(int(unit["gib"].iat[0] * (1 << 30)), dtype=np.uint8)  # counted, never touched: no RAM used
        return unit[["episode_id", "gib"]]

    episodes = spark.createDataFrame(pd.DataFrame({"episode_id": ["big", "small"], "gib": [6.0, 0.25]}))
    result = apply_per_episode(episodes, ["big", "small"], reserve, [table], Placement(memory_mb=3072))
    status = guarded_status(result)
    assert list(status.failures) == ["big"]
    assert status.failures["big"].startswith("MemoryError: Unable to allocate 6.00 GiB")
    assert "memory bound of 3072 MiB" in status.failures["big"]
    ok = result.where("_row_kind = 'row'").toPandas()
    assert ok["episode_id"].tolist() == ["small"]
    # Unbounded, the same reservation succeeds: the bound, not the machine, failed it.
    unbounded = guarded_status(apply_per_episode(episodes, ["big", "small"], reserve, [table], Placement()))
    assert unbounded.failures == {}


@pytest.mark.spark
def test_the_runs_ledger_answers_as_the_table_and_reads_it_after_others_commit(spark, tmp_path, monkeypatch):
    """A run's own appends keep its copy of `latest_runs` current; another writer's commit makes it read."""
    import jobs.stage as stage_module
    from jobs.config import PipelineConfig
    from jobs.stage import EpisodeOutcome, StageContext, latest_runs, record_runs
    from jobs.tables import Layout, Lineage

    reads = []
    real = stage_module.latest_runs
    monkeypatch.setattr(stage_module, "latest_runs", lambda s, lay: reads.append(1) or real(s, lay))
    layout = Layout(str(tmp_path))
    mine = StageContext(spark, PipelineConfig(), layout, "run-a")
    other = StageContext(spark, PipelineConfig(), layout, "run-b")

    def outcome(episode, status, hours, error=None):
        return EpisodeOutcome(episode, status, 1, error, T0, T0 + timedelta(hours=hours), 0.5, 0.4)

    def same_as_table():
        got = mine.latest_runs().sort_values(["stage", "episode_id"]).reset_index(drop=True)
        want = latest_runs(spark, layout).sort_values(["stage", "episode_id"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want)

    lineage = Lineage("run-a", "1", "h")
    record_runs(mine, "a", lineage, [outcome("e1", "ok", 1), outcome("e2", "failed", 1, "x")])
    mine.latest_runs()
    assert len(reads) == 1  # the table's first commit: read once
    record_runs(mine, "b", lineage, [outcome("e1", "ok", 2), outcome("e2", "skipped", 2)])
    record_runs(mine, "a", lineage, [outcome("e2", "ok", 3)])  # e2 again, later
    same_as_table()  # (the reference read is not counted: `latest_runs` imported before the patch)
    assert len(reads) == 1  # own appends merged, not read
    assert mine.latest_runs().set_index(["stage", "episode_id"]).at[("a", "e2"), "status"] == "ok"
    record_runs(other, "b", Lineage("run-b", "1", "h"), [outcome("e1", "failed", 4, "y")])
    same_as_table()
    assert len(reads) == 2  # someone else committed: the ledger read the table again
    assert mine.latest_runs().set_index(["stage", "episode_id"]).at[("b", "e1"), "status"] == "failed"
