"""Stage actions on local Spark + Delta: synthetic `videos`, `frames` and `hands_world` in, `actions` out.

The inputs are written directly (fusion marked ok in `runs`): an episode whose right hand goes through
known phases and that has a task sidecar, one without a sidecar and without any hand row, and one with
malformed keypoints (it must fail alone). One stage run is shared by the module's tests.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest

from tests.pose_core.training.phased_hand import phased_hand

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PHASED, NO_HANDS, BAD = "a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"
TASK = "put the cup on the shelf"


def _write(spark, out: str, schema, pdf: pd.DataFrame, lineage) -> None:  # noqa: ANN001 - test helper
    from jobs.tables import Layout, write

    pdf = pdf.reindex(columns=schema.columns).astype(object)
    pdf = pdf.where(pdf.notna(), None)
    write(spark.createDataFrame(pdf, schema.spark), Layout(out), schema, pdf["episode_id"].unique(), lineage)


@pytest.fixture(scope="module")
def inputs(spark, tmp_path_factory):
    """Output folder with videos, frames, hands_world and fusion=ok runs; the config; the pandas inputs."""
    from jobs.config import load_config
    from jobs.stage import EpisodeOutcome, StageContext, record_runs
    from jobs.tables import Layout, Lineage
    from schemas.tables import FRAMES, HANDS_WORLD, VIDEOS

    out = str(tmp_path_factory.mktemp("actions"))
    cfg = load_config([], ["actions.default_task_text=do the task"])
    kp, ts, truth = phased_hand()
    n = len(ts)
    episodes = (PHASED, NO_HANDS, BAD)
    videos = pd.DataFrame({"episode_id": episodes, "source_path": [f"/in/{e}.mp4" for e in episodes],
                           "kind": "video", "task_text": [TASK, None, None]})  # fmt: skip
    frames = pd.concat([pd.DataFrame({"episode_id": e, "frame_idx": np.arange(n), "ts_s": ts, "shard_idx": 0})
                        for e in episodes])  # fmt: skip
    hands = pd.DataFrame({"episode_id": PHASED, "frame_idx": np.arange(n), "identity": "wearer_right",
                          "ts_s": ts, "keypoints_world_m": [k.ravel().tolist() for k in kp], "filled": False})
    hands = hands[~hands["frame_idx"].between(170, 179)]  # ten frames without the hand (in the last idle)
    bad = hands.assign(episode_id=BAD, keypoints_world_m=[[0.0] * 5] * len(hands))
    lineage = Lineage("run-inputs", "1", "h")
    _write(spark, out, VIDEOS, videos, lineage)
    _write(spark, out, FRAMES, frames, lineage)
    _write(spark, out, HANDS_WORLD, pd.concat([hands, bad]), lineage)
    ctx = StageContext(spark, cfg, Layout(out), "run-inputs")
    t = datetime.now(timezone.utc)
    record_runs(ctx, "fusion", lineage, [EpisodeOutcome(e, "ok", n, None, t, t) for e in episodes])
    return out, cfg, frames.merge(videos[["episode_id", "task_text"]]), hands, truth


@pytest.fixture(scope="module")
def run(spark, inputs):
    from jobs import actions
    from jobs.pipeline import stage_hashes
    from jobs.stage import StageContext, run_episode_stage
    from jobs.tables import Layout
    from tests.jobs.tables_util import table

    out, cfg, *_ = inputs
    ctx = StageContext(spark, cfg, Layout(out), "run-actions")
    outcomes = run_episode_stage(ctx, actions.STAGE, stage_hashes(cfg)["actions"], None, force=True)
    return {o.episode_id: o for o in outcomes}, table(spark, out, "actions")


def test_outcomes_and_failure_isolation(run):
    outcomes, rows = run
    assert {e: o.status for e, o in outcomes.items()} == {PHASED: "ok", NO_HANDS: "ok", BAD: "failed"}
    assert "ValueError" in outcomes[BAD].error
    assert outcomes[PHASED].rows == (rows["episode_id"] == PHASED).sum()
    assert set(rows["episode_id"]) == {PHASED, NO_HANDS}
    assert (rows["run_id"] == "run-actions").all() and rows["config_hash"].nunique() == 1


def test_rows_are_the_udf_output(run, inputs):
    from schemas.tables import ACTIONS
    from udfs.actions import episode_actions

    _, rows = run
    _, cfg, frames, hands, _ = inputs
    expected = episode_actions(frames[frames["episode_id"] == PHASED], hands, cfg.actions)
    got = rows[rows["episode_id"] == PHASED].sort_values(["identity", "segment_idx"]).reset_index(drop=True)
    key = ["identity", "segment_idx", "label", "frame_start", "frame_stop", "task_text", "task_source"]
    assert got[key].values.tolist() == expected[key].values.tolist()
    speeds = got["mean_wrist_speed_mps"], expected["mean_wrist_speed_mps"]
    assert np.allclose(*speeds, rtol=1e-5, equal_nan=True)
    assert list(rows.columns[: len(ACTIONS.columns)]) == ACTIONS.columns


def test_timeline_and_task_per_episode(run, inputs):
    _, rows = run
    truth = inputs[4]
    n_frames = truth[-1][2]
    phased = rows[rows["episode_id"] == PHASED]
    right = phased[phased["identity"] == "wearer_right"].sort_values("segment_idx")
    labels = right["label"].tolist()
    # The phases in order, with the ten frames without a hand cut out of the last idle as `missing`.
    assert labels == [t[0] for t in truth][:-1] + ["idle", "missing", "idle"]
    assert right[right["label"] == "missing"][["frame_start", "frame_stop"]].values.tolist() == [[170, 180]]
    assert phased[["task_text", "task_source"]].drop_duplicates().values.tolist() == [[TASK, "sidecar"]]
    left = phased[phased["identity"] == "wearer_left"]
    assert left[["label", "frame_start", "frame_stop"]].values.tolist() == [["missing", 0, n_frames]]
    empty = rows[rows["episode_id"] == NO_HANDS]
    assert sorted(empty[["identity", "label", "frame_start", "frame_stop"]].values.tolist()) == [
        ["wearer_left", "missing", 0, n_frames], ["wearer_right", "missing", 0, n_frames],
    ]
    assert empty[["task_text", "task_source"]].drop_duplicates().values.tolist() == [["do the task", "conf"]]
