"""The Spine end to end on local Spark + Delta: a corpus of good, bad and awkward inputs.

The tests of this module share a copy of the session's pipeline run over the corpus (`corpus_run` in
tests/conftest.py, also test_resume_after_kill's reference). The runs stop after `priors`: these tests
are about the framework and the stages that every later stage builds on; later stages have their own
stage tests.
"""

from __future__ import annotations

import pytest

from tests.jobs.tables_util import DATA_TABLES, copy_output
from tests.jobs.tables_util import table as _table

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

UNTIL = "priors"


@pytest.fixture(scope="module")
def first_run(corpus_run, tmp_path_factory):
    """A copy of the session's corpus run (ingest..priors, `batch_episodes=8`): these tests re-run stages."""
    src, cfg, summary = corpus_run
    return copy_output(src, tmp_path_factory.mktemp("spine") / "out"), cfg, summary


def _counts(spark, out):
    return {name: len(_table(spark, out, name)) for name in DATA_TABLES}


def test_every_input_is_an_episode_or_a_quarantine_row_with_its_reason(spark, corpus, first_run):
    _, expected = corpus
    out, _, summary = first_run
    videos = _table(spark, out, "videos")
    quarantine = _table(spark, out, "quarantine")
    got = dict.fromkeys(videos["source_path"], "episode")
    got.update(dict(zip(quarantine["source_path"], quarantine["reason_code"], strict=True)))
    assert got == expected
    assert len(videos) + len(quarantine) == len(expected)
    assert summary.quarantined == len(quarantine)
    assert summary.counts["ingest"]["ok"] == len(videos)
    # Every message names the file and says what is wrong.
    for row in quarantine.itertuples():
        assert row.message and len(row.message) > 10, row
    dups = quarantine[quarantine["reason_code"].str.startswith("duplicate")]
    assert len(dups) >= 2
    assert dups["duplicate_of"].isin(videos["source_path"]).all()


def test_frames_cover_every_frame_once_with_pts_times(spark, first_run):
    out, _, summary = first_run
    videos = _table(spark, out, "videos").set_index("episode_id")
    frames = _table(spark, out, "frames")
    assert summary.counts["priors"] == {"ok": len(videos), "failed": 0, "skipped": 0}
    per_episode = frames.groupby("episode_id")["frame_idx"].agg(["count", "min", "max", "nunique"])
    for episode, row in per_episode.iterrows():
        n = videos.at[episode, "frame_count"]
        assert (row["count"], row["min"], row["max"], row["nunique"]) == (n, 0, n - 1, n), episode
    for _, group in frames.groupby("episode_id"):
        ts = group.sort_values("frame_idx")["ts_s"].to_numpy()
        assert (ts[1:] > ts[:-1]).all()
    vfr = videos[videos["variable_frame_rate"]]
    assert len(vfr) >= 1
    vfr_ts = frames[frames["episode_id"] == vfr.index[0]].sort_values("frame_idx")["ts_s"].diff().dropna()
    assert vfr_ts.std() > 0.01  # real presentation times, not idx / fps


def test_rerunning_any_stage_leaves_row_counts_unchanged(spark, corpus, first_run):
    """Ingest and priors again; priors alone again is `--from-stage priors` in the next test (each re-run
    of priors over the corpus costs ~20 s)."""
    from jobs.pipeline import run_pipeline

    root, _ = corpus
    out, cfg, _ = first_run
    before = _counts(spark, out)
    runs_before = len(_table(spark, out, "runs"))
    again = run_pipeline(spark, cfg, str(root), out, until_stage=UNTIL)
    assert again.counts["ingest"]["ok"] == again.counts["priors"]["ok"] == before["videos"]
    assert _counts(spark, out) == before
    # The runs log records each re-run, one row per episode and stage.
    expected_new = sum(sum(c.values()) for c in again.counts.values())
    assert len(_table(spark, out, "runs")) == runs_before + expected_new


def test_resume_skips_what_is_done_and_from_stage_recomputes(spark, corpus, first_run):
    from jobs.pipeline import run_pipeline

    root, _ = corpus
    out, cfg, _ = first_run
    n = len(_table(spark, out, "videos"))
    before = _counts(spark, out)
    runs_before = len(_table(spark, out, "runs"))
    resumed = run_pipeline(spark, cfg, str(root), out, resume=True, until_stage=UNTIL)
    assert resumed.counts["ingest"] == {"ok": 0, "failed": 0, "skipped": n}
    assert resumed.counts["priors"] == {"ok": 0, "failed": 0, "skipped": n}
    again = run_pipeline(spark, cfg, str(root), out, resume=True, from_stage="priors", until_stage=UNTIL)
    assert again.counts["ingest"]["skipped"] == n
    assert again.counts["priors"]["ok"] == n
    # Re-running priors alone leaves row counts unchanged; the runs log has a row per episode and stage.
    assert _counts(spark, out) == before
    expected_new = sum(sum(c.values()) for s in (resumed, again) for c in s.counts.values())
    assert len(_table(spark, out, "runs")) == runs_before + expected_new
    # A config change of one stage invalidates that stage (and downstream) only.
    from jobs.config import load_config

    changed = load_config([], ["batch_episodes=8", "priors.decode.max_long_side_px=96"])
    third = run_pipeline(spark, changed, str(root), out, resume=True, until_stage=UNTIL)
    assert third.counts["ingest"]["skipped"] == n
    assert third.counts["priors"]["ok"] == n
    assert (_table(spark, out, "frames")["width"] <= 96).all()


def test_status_and_sql_see_every_table(spark, first_run):
    from jobs.status import episode_matrix, format_status, stage_status
    from jobs.tables import Layout, register_all

    out, _, _ = first_run
    status = stage_status(spark, out, ["ingest", "priors"])
    n = len(_table(spark, out, "videos"))
    assert [(s.stage, s.ok, s.failed, s.pending) for s in status.stages] == [
        ("ingest", n, 0, 0),
        ("priors", n, 0, 0),
    ]
    assert f"quarantined inputs: {status.quarantined}" in format_status(status.stages, status.quarantined)
    matrix = episode_matrix(status.latest, status.episodes, ["ingest", "priors"]).splitlines()
    assert len(matrix) == n + 2 and all(line.split()[1:] == ["ok", "ok"] for line in matrix[2:])
    assert set(register_all(spark, Layout(out))) >= {"videos", "shards", "quarantine", "frames", "runs"}
    row = spark.sql("SELECT count(*) AS n FROM frames f JOIN videos v USING (episode_id)").collect()[0]
    assert row["n"] == len(_table(spark, out, "frames"))
