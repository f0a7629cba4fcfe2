"""Stage retarget on local Spark + Delta: `frames`, `hands_world` in; `robot_actions`, `robot_quality` out.

The inputs are written directly (fusion marked ok in `runs`): a 30-frame episode whose right hand follows
a reachable SO-101 trajectory, and one whose timestamps repeat (it must fail alone). One stage run is
shared by the module's tests.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest

from pose_core.synth.robot_hands import FPS, joint_trajectory, keypoints_at_wrists, tcp_poses

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N_FRAMES = 30
GOOD, BAD = "a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"


def _write(spark, out: str, schema, pdf: pd.DataFrame, lineage) -> None:  # noqa: ANN001 - test helper
    from jobs.tables import Layout, write

    pdf = pdf.reindex(columns=schema.columns).astype(object)
    pdf = pdf.where(pdf.notna(), None)
    write(spark.createDataFrame(pdf, schema.spark), Layout(out), schema, pdf["episode_id"].unique(), lineage)


@pytest.fixture(scope="module")
def inputs(spark, shared_data, tmp_path_factory):
    """Output folder with frames, hands_world and fusion=ok runs; the config; the true tool poses."""
    from jobs.config import load_config
    from jobs.stage import EpisodeOutcome, StageContext, record_runs
    from jobs.tables import Layout, Lineage
    from schemas.tables import FRAMES, HANDS_WORLD
    from udfs.retarget import load_embodiments

    out = str(tmp_path_factory.mktemp("retarget"))
    cfg = load_config([], ["embodiments=[so101]", f"retarget.robots_dir={shared_data / 'robots'}",
                           "retarget.base_placement=profile"])
    (emb,) = load_embodiments(cfg.embodiments, cfg.retarget)
    _, q = joint_trajectory(emb, N_FRAMES, 0)
    truth = tcp_poses(emb, q)
    from pose_core.retarget.placement import world_from_wrist_for_targets

    kp = keypoints_at_wrists(world_from_wrist_for_targets(emb, truth), True, np.full(N_FRAMES, 0.05))
    frames, hands = [], []
    for episode, ts in ((GOOD, np.arange(N_FRAMES) / FPS), (BAD, np.floor(np.arange(N_FRAMES) / 2) / FPS)):
        frames.append(pd.DataFrame({"episode_id": episode, "frame_idx": np.arange(N_FRAMES), "ts_s": ts,
                                    "shard_idx": 0}))
        hands.append(pd.DataFrame({"episode_id": episode, "frame_idx": np.arange(N_FRAMES),
                                   "identity": "wearer_right", "ts_s": ts, "scale_source": "imu",
                                   "keypoints_world_m": [k.ravel().tolist() for k in kp], "filled": False}))
    lineage = Lineage("run-inputs", "1", "h")
    _write(spark, out, FRAMES, pd.concat(frames), lineage)
    _write(spark, out, HANDS_WORLD, pd.concat(hands), lineage)
    ctx = StageContext(spark, cfg, Layout(out), "run-inputs")
    t = datetime.now(timezone.utc)
    record_runs(ctx, "fusion", lineage, [EpisodeOutcome(e, "ok", N_FRAMES, None, t, t) for e in (GOOD, BAD)])
    return out, cfg, emb, truth


def _run(spark, out: str, cfg, run_id: str):  # noqa: ANN001, ANN202 - test helper
    from jobs import retarget
    from jobs.pipeline import stage_hashes
    from jobs.stage import StageContext, run_episode_stage
    from jobs.tables import Layout

    ctx = StageContext(spark, cfg, Layout(out), run_id)
    outcomes = run_episode_stage(ctx, retarget.STAGE, stage_hashes(cfg)["retarget"], None, force=True)
    return {o.episode_id: o for o in outcomes}


@pytest.fixture(scope="module")
def first_run(spark, inputs):
    out, cfg, _, _ = inputs
    outcomes = _run(spark, out, cfg, "run-1")
    from tests.jobs.tables_util import table

    return outcomes, table(spark, out, "robot_actions"), table(spark, out, "robot_quality")


def test_rows_follow_the_hand_and_a_bad_episode_fails_alone(first_run, inputs) -> None:
    from pose_core.retarget.ik import pose_errors

    outcomes, rows, quality = first_run
    _, _, emb, truth = inputs
    assert outcomes[GOOD].status == "ok" and outcomes[GOOD].rows == N_FRAMES
    assert outcomes[BAD].status == "failed" and "increasing" in outcomes[BAD].error
    assert set(rows["episode_id"]) == {GOOD}
    rows = rows.sort_values("frame_idx")
    assert rows["embodiment"].unique().tolist() == ["so101"]
    assert rows["identity"].unique().tolist() == ["wearer_right"]
    assert rows["reachable"].all() and rows["run_id"].unique().tolist() == ["run-1"]
    q = np.stack(rows["joint_positions"].to_list())
    e_p, _ = pose_errors(tcp_poses(emb, q), truth)
    assert np.linalg.norm(e_p, axis=1).mean() <= 0.005
    assert list(rows["joint_names"].iat[0]) == list(emb.model.joint_names)
    assert set(rows["hand_state"]) == {"observed"}
    # The quality row: one per episode and embodiment, the bad episode has none (failed alone).
    assert quality["episode_id"].tolist() == [GOOD] and quality["embodiment"].tolist() == ["so101"]
    row = quality.iloc[0]
    assert row["passed"] and row["valid_steps"] == row["steps"] == N_FRAMES == row["reachable_steps"]
    assert row["run_id"] == "run-1" and row["position_error_p95_m"] <= 0.015


def test_no_embodiments_writes_nothing(spark, first_run, inputs) -> None:
    from jobs import retarget
    from jobs.config import load_config
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage

    out, cfg, _, _ = inputs
    ctx = StageContext(spark, replace(cfg, embodiments=()), Layout(out), "run-2")
    outcomes = retarget.process(ctx, Lineage("run-2", "1", "h"), [GOOD])
    assert [(o.status, o.rows) for o in outcomes] == [("ok", 0)]
    assert load_config().embodiments == ()


def test_missing_urdf_is_named_before_any_spark_job(spark, inputs, tmp_path, monkeypatch) -> None:
    import udfs.robots
    from jobs import retarget
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage
    from pose_core.errors import InputError

    out, cfg, _, _ = inputs
    cfg = replace(cfg, retarget=replace(cfg.retarget, robots_dir=str(tmp_path)))
    monkeypatch.setattr(udfs.robots, "packaged_robots_root", lambda: None)  # the installed models neither
    with pytest.raises(InputError, match=r"URDF not found; looked for .*so101\.urdf"):
        retarget.process(StageContext(spark, cfg, Layout(out), "run-3"), Lineage("run-3", "1", "h"), [GOOD])
