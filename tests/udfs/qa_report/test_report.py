"""The qa unit on a synthetic episode's tables: injected faults flagged with their reasons, the page
opened in headless Chromium (no console errors, every view drawn, the cursor moves all three)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from schemas.tables import QA
from tests.udfs.qa_report.qa_browser import VIEWS, changed_pixels, check_pages
from tests.udfs.qa_report.qa_tables import (
    EPISODE,
    inject_identity_switch,
    inject_scale_jump,
    inject_tracking_loss,
    synth_tables,
    write_qa_pages,
)
from udfs.qa_report.episode import episode_signals, episode_view

FRAMES = 60


def _verdict(tables):
    from pose_core.qa import QAThresholds, evaluate_episode

    view = episode_view(tables["frames"], tables["camera_poses"], tables["hands_world"])
    return evaluate_episode(episode_signals(view), QAThresholds())


@pytest.fixture(scope="module")
def clean():
    return synth_tables(None, FRAMES)


def _copy(tables):
    return {k: v.copy(deep=True) for k, v in tables.items()}


def test_clean_episode_passes(clean):
    tables, ep = clean
    result = _verdict(tables)
    assert result.passed, result.reasons
    assert result.metrics["hand_coverage"] == pytest.approx(ep.hand_visible.any(axis=1).mean())


@pytest.mark.parametrize(
    ("inject", "flag", "frames"),
    [
        (lambda t: inject_tracking_loss(t, 20, 30), "tracking_lost", list(range(20, 30))),
        (lambda t: inject_scale_jump(t, 30, 3.0), "scale_jump", [30]),
        (lambda t: inject_identity_switch(t, 30), "identity_switches", None),
    ],
    ids=["tracking_loss", "scale_jump", "identity_switch"],
)
def test_injected_fault_is_flagged_with_its_reason(clean, inject, flag, frames):
    tables = _copy(clean[0])
    inject(tables)
    result = _verdict(tables)
    assert result.flags == (flag,), result.reasons
    assert len(result.reasons) == 1 and "limit" in result.reasons[0]
    if frames is not None:
        assert np.flatnonzero(result.frame_flags[flag]).tolist() == frames


def test_thresholds_come_from_the_config(clean):
    from jobs.config import load_config
    from pose_core.qa import evaluate_episode

    tables = _copy(clean[0])
    inject_identity_switch(tables, 30)
    cfg = load_config([], ["qa.thresholds.max_identity_switches=2", "qa.thresholds.min_duration_s=3"])
    view = episode_view(tables["frames"], tables["camera_poses"], tables["hands_world"])
    result = evaluate_episode(episode_signals(view), cfg.qa.thresholds)
    assert result.flags == ("too_short",), result.reasons  # a swap (two switches) allowed; 2 s < 3 s


def test_all_three_faults_at_once_give_three_reasons(clean):
    tables = _copy(clean[0])
    inject_tracking_loss(tables, 10, 20)
    inject_scale_jump(tables, 40, 3.0)
    inject_identity_switch(tables, 30)
    assert _verdict(tables).flags == ("tracking_lost", "scale_jump", "identity_switches")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A faulty episode (scale jump) with its video, through `qa_unit`, plus the batch index.

    Its page steps over 20 of the 45 frames, as a long episode's does (the qa stage's tests open pages
    that hold every frame).
    """
    out = str(tmp_path_factory.mktemp("qa_pages"))
    return out, write_qa_pages(out, str(tmp_path_factory.mktemp("qa_video")), max_page_points=20)


def test_qa_unit_writes_the_row_and_the_evidence_files(written):
    out, row = written
    assert row.columns.tolist() == list(QA.columns) and len(row) == 1
    r = row.iloc[0]
    # 1.5 s is shorter than the default 2 s, so too_short fails too
    assert r["episode_id"] == EPISODE and not r["passed"] and r["flags"] == ["too_short", "scale_jump"]
    assert len(r["reasons"]) == 2
    assert r["frames"] == 45 and r["posed_fraction"] == 1.0
    folder = os.path.join(out, EPISODE)
    assert r["report_path"] == os.path.join(folder, "index.html")
    from udfs.media.decode import decode_frames

    overlay = decode_frames(os.path.join(folder, "overlay.mp4"))
    assert overlay.frames.shape[0] == 45
    size_mb = os.path.getsize(r["report_path"]) / 2**20
    assert size_mb < 12, size_mb  # plotly.js (~4.6 MB) + 45 JPEG frames


@pytest.mark.slow
def test_page_opens_in_chromium_and_the_cursor_moves_every_view(written):
    out, _ = written
    check = check_pages(os.path.join(out, EPISODE, "index.html"), os.path.join(out, "index.html"), 15)
    assert check.errors == []
    for view in VIEWS:
        assert check.before[view].std() > 5, view  # not blank
        assert changed_pixels(check.before[view], check.after[view]) > 20, view
    assert check.index_rows == 1


def test_scene_points_far_beyond_the_scene_leave_the_world_view():
    """A real clip's map had a few points ~7000 map units away while its camera path spanned ~1.5: the
    world view scaled to them and the path was a dot. Those points go; the scene around the path stays."""
    from udfs.qa_report.unit import near_path

    rng = np.random.default_rng(0)
    centres = rng.uniform(-0.5, 0.5, (100, 3))
    scene = rng.uniform(-3.0, 3.0, (500, 3))
    far = np.array([[-7359.0, 20.0, 4.0], [1930.0, -5707.0, 0.0], [0.0, 0.0, 300.0]])
    kept = near_path(np.vstack([scene, far]), centres, 4.0)
    assert len(kept) == len(scene) and np.abs(kept).max() <= 3.0
    assert len(near_path(np.empty((0, 3)), centres, 4.0)) == 0
