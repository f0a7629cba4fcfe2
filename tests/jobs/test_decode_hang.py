"""A shard whose decode hangs inside a stage (issue 23 item 6): priors and hands, run by the framework on
local Spark, give that episode `failed` with the reason after `priors.decode.timeout_s`, and the other
episode of the batch its rows. The hang is real, not a fake in the test process (Spark's Python workers
would not see one): the shard's source is a FIFO without a writer, whose `open` blocks in the kernel, as a
stalled network mount does."""

from __future__ import annotations

import pytest

from tests.hangs import stalled_fifo

pytestmark = [pytest.mark.spark, pytest.mark.slow]

GOOD, HUNG = "600d000000000000", "4a96000000000000"
FRAMES = 40
TIMEOUT = "priors.decode.timeout_s=3"


@pytest.fixture(scope="module")
def output(spark, tmp_path_factory):
    """OUTPUT with two ingested episodes of one shard each: a real clip and a FIFO; (output, config)."""
    from tests.corpus import textured_frames
    from udfs.media.encode import write_video

    folder = tmp_path_factory.mktemp("inputs")
    write_video(folder / "good.mp4", textured_frames(7, FRAMES), 30)
    with stalled_fifo(folder / "stalled.mp4") as fifo:
        yield _ingested(spark, [str(folder / "good.mp4"), fifo], str(tmp_path_factory.mktemp("out")))


def _ingested(spark, paths: list[str], out: str):  # noqa: ANN001, ANN202
    """`paths` as two ingested episodes of one shard each under `out`: (output, config)."""
    import pandas as pd

    from jobs.config import load_config
    from jobs.stage import EpisodeOutcome, StageContext, now, record_runs
    from jobs.tables import Layout, Lineage, write
    from schemas.tables import SHARDS, VIDEOS

    lineage, layout = Lineage("r0", "1", "h"), Layout(out)
    videos = pd.DataFrame({c: [None] * 2 for c in VIDEOS.columns}).assign(
        episode_id=[GOOD, HUNG], source_path=paths, kind="video"
    )
    shards = pd.DataFrame(
        {"episode_id": [GOOD, HUNG], "shard_idx": 0, "source_path": paths, "kind": "video", "decoder": None,
         "frame_start": 0, "frame_stop": FRAMES, "own_start": 0, "own_stop": FRAMES}
    )  # fmt: skip
    write(spark.createDataFrame(videos, VIDEOS.spark), layout, VIDEOS, [GOOD, HUNG], lineage)
    write(spark.createDataFrame(shards, SHARDS.spark), layout, SHARDS, [GOOD, HUNG], lineage)
    cfg = load_config([], [TIMEOUT])
    ctx = StageContext(spark, cfg, layout, "r0")
    record_runs(
        ctx, "ingest", lineage, [EpisodeOutcome(e, "ok", 1, None, now(), now()) for e in (GOOD, HUNG)]
    )
    return out, cfg


def _run_stage(spark, out, cfg, stage, run_id):  # noqa: ANN001, ANN202
    from jobs.stage import StageContext, latest_runs, run_episode_stage
    from jobs.tables import Layout

    outcomes = {o.episode_id: o for o in run_episode_stage(
        StageContext(spark, cfg, Layout(out), run_id), stage, f"h-{run_id}", None, force=True
    )}  # fmt: skip
    latest = latest_runs(spark, Layout(out))
    recorded = latest[(latest["stage"] == stage.name) & (latest["run_id"] == run_id)]
    return outcomes, dict(zip(recorded["episode_id"], recorded["error"], strict=True))


def _assert_hung_failed(outcomes, errors, path: str) -> None:  # noqa: ANN001
    """The good episode ok, the hung one failed with the reason, in the outcomes and in `runs`."""
    assert outcomes[GOOD].status == "ok"
    assert outcomes[HUNG].status == "failed"
    assert errors[GOOD] is None
    assert errors[HUNG] == outcomes[HUNG].error
    assert errors[HUNG].startswith(f"InputError: {path}: decoding frames [")
    assert errors[HUNG].endswith("took longer than 3 s without a result and was stopped")


def test_priors_records_the_hung_shard_failed_and_writes_the_others(spark, output):
    from jobs import priors
    from tests.jobs.tables_util import table

    out, cfg = output
    outcomes, errors = _run_stage(spark, out, cfg, priors.STAGE, "r1")
    _assert_hung_failed(
        outcomes, errors, table(spark, out, "videos").set_index("episode_id").at[HUNG, "source_path"]
    )
    frames = table(spark, out, "frames")
    assert sorted(frames["frame_idx"]) == list(range(FRAMES)) and set(frames["episode_id"]) == {GOOD}


def test_hands_records_the_hung_shard_failed_and_writes_the_others(spark, output):
    """Hands decodes its shards itself, with priors' decode settings (the time limit too)."""
    pytest.importorskip("ai_edge_litert")
    from conf.models import model_path
    from jobs import hands
    from jobs.stage import EpisodeOutcome, StageContext, now, record_runs
    from jobs.tables import Layout, Lineage
    from tests.jobs.tables_util import table

    try:
        model_path("hand_landmark_full.tflite")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    out, cfg = output
    ok = [
        EpisodeOutcome(e, "ok", 1, None, now(), now()) for e in (GOOD, HUNG)
    ]  # as if priors had decoded both
    record_runs(StageContext(spark, cfg, Layout(out), "r2"), "priors", Lineage("r2", "2", "h"), ok)
    outcomes, errors = _run_stage(spark, out, cfg, hands.STAGE, "r3")
    _assert_hung_failed(
        outcomes, errors, table(spark, out, "videos").set_index("episode_id").at[HUNG, "source_path"]
    )
