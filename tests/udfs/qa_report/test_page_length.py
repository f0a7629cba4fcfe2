"""An episode page stays the same size however long the episode: the cursor steps over at most
`max_points` frames and the timelines keep each stretch's extremes (a 10-minute page was 67 MB)."""

from __future__ import annotations

import base64
import json
import re

import cv2
import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs

from pose_core.qa import QAThresholds, evaluate_episode
from tests.udfs.qa_report.qa_tables import synth_tables
from udfs.qa_report.episode import episode_signals, episode_view
from udfs.qa_report.page import PageMedia, episode_page, spread

FRAMES = 60


@pytest.fixture(scope="module")
def clean():
    tables, _ = synth_tables(None, FRAMES)
    return tables


def _repeated(tables: dict[str, pd.DataFrame], times: int) -> dict[str, pd.DataFrame]:
    """The episode's per-frame tables `times` over, one after the other (frame_idx and ts_s shifted)."""
    out = dict(tables)
    for name in ("frames", "camera_poses", "hands_world", "hands_cam"):
        parts = []
        for k in range(times):
            part = tables[name].copy()
            part["frame_idx"] = part["frame_idx"] + k * FRAMES
            if "ts_s" in part:
                part["ts_s"] = part["ts_s"] + k * FRAMES / 30.0
            parts.append(part)
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def _page(tables: dict[str, pd.DataFrame], max_points: int) -> tuple[str, dict]:
    """The page of `tables` (one embedded frame, no camera) and its cursor data."""
    view = episode_view(tables["frames"], tables["camera_poses"], tables["hands_world"])
    result = evaluate_episode(episode_signals(view), QAThresholds())
    jpeg = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    media = PageMedia([jpeg], np.array([0]), np.empty((0, 3)), None, tables["actions"])
    page = episode_page(view, result, media, frustum_every=15, size=0.1, horizon=30, max_points=max_points)
    data = re.search(r"<script type='application/json' id='qa-data'>(.*?)</script>", page, re.S)
    assert data is not None
    return page, json.loads(data.group(1))


def _array(values: list | dict) -> np.ndarray:
    """A plotly trace's array: a list, or plotly's typed array ({"dtype", "bdata": base64})."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), np.dtype(values["dtype"]))
    return np.asarray(values)


def test_spread_keeps_first_and_last_and_every_frame_when_short():
    assert spread(5, 10).tolist() == [0, 1, 2, 3, 4]
    picked = spread(1000, 30)
    assert len(picked) == 30 and picked[0] == 0 and picked[-1] == 999
    assert np.all(np.diff(picked) > 0)


def test_a_short_episode_page_holds_every_frame(clean):
    _, data = _page(clean, 3000)
    assert data["n"] == FRAMES and data["frame_idx"] == list(range(FRAMES))
    assert data["horizon"] == 30


def test_a_long_episode_page_is_as_large_as_a_short_one_and_keeps_the_spikes(clean):
    long = _repeated(clean, 20)  # 1,200 frames
    at = 737
    long["camera_poses"].loc[long["camera_poses"]["frame_idx"] == at, "reproj_error_px"] = 50.0
    short_page, _ = _page(clean, FRAMES)
    page, data = _page(long, FRAMES)
    full_page, _ = _page(long, 20 * FRAMES)
    assert data["n"] == FRAMES and data["frame_idx"][0] == 0 and data["frame_idx"][-1] == 20 * FRAMES - 1
    assert data["horizon"] == 1  # 30 frames are 1.5 steps of ~20 frames
    assert len(data["hands"]["wearer_left"]) == FRAMES
    assert f"max={FRAMES - 1} " in page  # the slider
    assert "the views step over 60 of them" in page
    # the page's own data (plotly.js aside) grows with max_points, not with the frames
    own = [len(p) - len(get_plotlyjs()) for p in (short_page, page, full_page)]
    assert own[1] < 1.2 * own[0] and own[2] > 5 * own[1], own
    # the spike is drawn: the reprojection trace holds 50 at frame 737
    figure = json.loads(re.search(r'Plotly.newPlot\(\s*"timeline",\s*(\[.*?\]),\s*\{', page, re.S).group(1))
    spike = next(t for t in figure if t.get("name") == "reprojection error")
    x, y = _array(spike["x"]), _array(spike["y"])
    assert len(y) <= FRAMES and y.max() == 50.0 and x[np.argmax(y)] == at
