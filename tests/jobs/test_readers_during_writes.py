"""Readers while a stage writes (issue 23 item 2): what `egolake sql` and `egolake status` see between
every commit of a stage run by the framework (`run_episode_stage`: per-shard UDF, guarded rows, `frames`
written with `replaceWhere`, then its `runs` rows), without timing: a hook reads before and after each
Delta commit of the writer."""

from __future__ import annotations

import glob
import os
import shutil
import traceback
from functools import partial

import pandas as pd
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPISODES = ("aaaa000000000000", "bbbb000000000000")
STAGES = ["ingest", "writer"]


def _frames(shard: pd.DataFrame, generation: int, failing: str | None) -> pd.DataFrame:
    """A shard's `frames` rows of one generation: 3 + generation frames, times offset by the generation."""
    episode = shard["episode_id"].iat[0]
    if episode == failing:
        raise RuntimeError("decoder exploded")
    n = 3 + generation
    return pd.DataFrame(
        {"episode_id": episode, "frame_idx": range(n), "ts_s": [i / 30 + generation for i in range(n)],
         "shard_idx": 0, "width": 64, "height": 48, "brightness": 1.0, "sharpness": 1.0}
    )  # fmt: skip


def _writer(generation: int, failing: str | None = None):  # noqa: ANN202 - a Stage
    from jobs.stage import Stage, map_per_shard, write_guarded
    from schemas.tables import FRAMES

    def process(ctx, lineage, episodes):  # noqa: ANN001, ANN202
        units = ctx.spark.createDataFrame([(e, 0) for e in episodes], "episode_id string, shard_idx int")
        result = map_per_shard(
            ctx, units, partial(_frames, generation=generation, failing=failing), FRAMES.arrow
        )
        return write_guarded(ctx, lineage, episodes, result, FRAMES)

    return Stage("writer", "1", "ingest", (), (FRAMES,), process)


def _view(spark, name: str) -> pd.DataFrame:
    """A registered view's rows, sorted: comparable."""
    rows = spark.sql(f"SELECT * FROM {name}").toPandas()
    return rows.sort_values(list(rows.columns)).reset_index(drop=True)


def _check_consistent(spark, out: str, in_flight: str, failing: str | None) -> dict[str, str]:
    """What a reader registering the views now may rely on; returns {episode: writer status}.

    `in_flight`: the run writing; `failing`: the episode it fails. Delta has no commit across tables and
    a stage commits its rows before its `runs` rows, so rows may be newer than `runs` says, never older.
    """
    from jobs.stage import latest_runs
    from jobs.status import stage_status
    from jobs.tables import Layout, register_all

    names = register_all(spark, Layout(out))
    assert names[0] == "runs"
    frames = _view(spark, "frames") if "frames" in names else pd.DataFrame(columns=["episode_id", "run_id"])
    latest = latest_runs(spark, Layout(out))
    mine = latest[latest["stage"] == "writer"]
    status = dict(zip(mine["episode_id"], mine["status"], strict=True))
    recorded = dict(zip(mine["episode_id"], mine["run_id"], strict=True))
    assert not frames.duplicated(["episode_id", "frame_idx"]).any()
    for episode, rows in frames.groupby("episode_id"):
        (run,) = set(rows["run_id"])  # never half replaced: one run's rows per episode ...
        assert len(rows) == 3 + int(rows["ts_s"].min())  # ... and all of them
        assert run in (recorded.get(episode), in_flight)  # the recorded run's, or newer
    for episode, run in recorded.items():  # an ok never runs ahead of its rows ...
        if status[episode] == "ok" and episode not in set(frames["episode_id"]):
            assert (episode, run != in_flight) == (failing, True)  # ... but while a re-run fails it
    (ingest, writer) = stage_status(spark, out, STAGES).stages
    ok, failed = sum(s == "ok" for s in status.values()), sum(s == "failed" for s in status.values())
    assert (ingest.ok, writer.ok, writer.failed, writer.pending) == (2, ok, failed, 2 - ok - failed)
    return status


def test_readers_between_every_commit_see_one_committed_snapshot(spark, tmp_path, monkeypatch):
    """Before each commit a reader registers the views; after it, those views still show the rows from
    before (pinned), and views registered anew show the commit whole: no duplicates, no episode half
    replaced, no `ok` ahead of its rows, `status` counts agreeing with `runs`. Then a writer's files
    without their commit (a killed write) change nothing."""
    import jobs.tables
    from jobs.config import load_config
    from jobs.stage import EpisodeOutcome, StageContext, now, record_runs, run_episode_stage
    from jobs.tables import Layout, Lineage, delta_version, register_all, write
    from schemas.tables import FRAMES, VIDEOS

    out = str(tmp_path / "out")
    cfg = load_config([], ["batch_episodes=2"])
    videos = pd.DataFrame({c: [None] * 2 for c in VIDEOS.columns}).assign(
        episode_id=list(EPISODES), source_path="/nowhere.mp4", kind="video"
    )
    ingest = Lineage("r0", "1", "h")
    write(spark.createDataFrame(videos, VIDEOS.spark), Layout(out), VIDEOS, EPISODES, ingest)
    ctx = StageContext(spark, cfg, Layout(out), "r0")
    record_runs(ctx, "ingest", ingest, [EpisodeOutcome(e, "ok", 1, None, now(), now()) for e in EPISODES])

    commits: list[str] = []
    problems: list[str] = []  # the framework catches a failing episode's exceptions: collected here
    original, writing = jobs.tables._retry_conflicts, {"run": "", "failing": None}

    def read_around(commit, table, path):  # noqa: ANN001, ANN202 - the writer's every Delta commit
        before = {n: _view(spark, n) for n in register_all(spark, Layout(out)) if n in ("runs", "frames")}
        original(commit, table, path)
        commits.append(table)
        try:
            for name, rows in before.items():  # the views registered before the commit: unchanged
                pd.testing.assert_frame_equal(_view(spark, name), rows)
            _check_consistent(spark, out, writing["run"], writing["failing"])
        except AssertionError:
            problems.append(f"after commit {len(commits)} ({table}):\n{traceback.format_exc()}")

    monkeypatch.setattr(jobs.tables, "_retry_conflicts", read_around)
    for run, generation, failing in (("r1", 1, None), ("r2", 2, EPISODES[1])):
        writing.update(run=run, failing=failing)
        stage = _writer(generation, failing)
        run_episode_stage(StageContext(spark, cfg, Layout(out), run), stage, f"h{generation}", None, True)
    monkeypatch.undo()
    assert not problems, problems[0]
    assert commits == ["frames", "runs"] * 2  # one batch, twice
    assert _check_consistent(spark, out, "", None) == {EPISODES[0]: "ok", EPISODES[1]: "failed"}

    table = Layout(out).table(FRAMES.name)
    version, rows = delta_version(Layout(out), FRAMES), _view(spark, "frames")
    for i, part in enumerate(glob.glob(os.path.join(table, "*.parquet"))):  # data files never committed
        shutil.copy(part, os.path.join(table, f"part-uncommitted-{i}.parquet"))
    log = os.path.join(table, "_delta_log")
    shutil.copy(os.path.join(log, f"{version:020d}.json"), os.path.join(log, f".{version + 1:020d}.json.tmp"))
    register_all(spark, Layout(out))
    assert delta_version(Layout(out), FRAMES) == version
    pd.testing.assert_frame_equal(_view(spark, "frames"), rows)
