"""The actions UDF on pandas frames: timelines per wearer hand over every frame, task text, guard."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import pytest

from schemas.tables import ACTIONS
from tests.pose_core.training.phased_hand import CLOSED_M, phased_hand
from udfs.actions import episode_actions
from udfs.guard import guarded_pair
from udfs.options import ActionsOptions

FIRST_FRAME = 100  # frame numbers need not start at 0


@pytest.fixture(scope="module")
def episode():
    """Frames and hands_world rows of one episode: the right hand does the phases, the left is never seen."""
    kp, ts, truth = phased_hand()
    frame_idx = FIRST_FRAME + np.arange(len(ts))
    frames = pd.DataFrame({"episode_id": "e1", "frame_idx": frame_idx, "ts_s": ts + 5.0, "task_text": None})
    hands = pd.DataFrame({
        "episode_id": "e1", "frame_idx": frame_idx, "identity": "wearer_right",
        "keypoints_world_m": [k.ravel().astype(np.float32) for k in kp],
    })  # fmt: skip
    return frames, hands, truth


def test_segments_per_wearer_hand(episode):
    frames, hands, truth = episode
    out = episode_actions(frames.sample(frac=1.0, random_state=0), hands, ActionsOptions())
    assert list(out.columns) == ACTIONS.columns
    left = out[out["identity"] == "wearer_left"]
    assert left[["label", "frame_start", "frame_stop"]].values.tolist() == [
        ["missing", FIRST_FRAME, FIRST_FRAME + len(frames)]
    ]
    right = out[out["identity"] == "wearer_right"]
    assert right["segment_idx"].tolist() == list(range(len(truth)))
    assert right["label"].tolist() == [t[0] for t in truth]
    starts = right["frame_start"].to_numpy() - FIRST_FRAME
    assert np.abs(starts - [t[1] for t in truth]).max() <= 3
    assert (right["frame_stop"].to_numpy()[:-1] == right["frame_start"].to_numpy()[1:]).all()
    first = right.iloc[0]
    assert first["ts_start_s"] == pytest.approx(5.0) and first["frame_start"] == FIRST_FRAME
    last = right.iloc[-1]
    assert last["ts_stop_s"] == pytest.approx(frames["ts_s"].max())
    manip = right[right["label"] == "manipulate"].iloc[0]
    assert manip["mean_grip_aperture_m"] == pytest.approx(CLOSED_M, abs=0.005)
    idle = right[right["label"] == "idle"]["mean_wrist_speed_mps"]
    reach = right[right["label"] == "reach"]["mean_wrist_speed_mps"]
    assert idle.max() < 0.05 < reach.min()
    assert np.isnan(left["mean_wrist_speed_mps"]).all()


def test_task_text_from_sidecar_else_conf(episode):
    frames, hands, _ = episode
    opts = ActionsOptions(default_task_text="stack the blocks")
    from_conf = episode_actions(frames, hands, opts)
    pairs = from_conf[["task_text", "task_source"]].drop_duplicates().values.tolist()
    assert pairs == [["stack the blocks", "conf"]]
    with_sidecar = episode_actions(frames.assign(task_text="  pour the water\n"), hands, opts)
    pairs = with_sidecar[["task_text", "task_source"]].drop_duplicates().values.tolist()
    assert pairs == [["pour the water", "sidecar"]]


def test_frames_without_a_row_are_missing(episode):
    frames, hands, _ = episode
    gap = hands["frame_idx"].between(FIRST_FRAME + 10, FIRST_FRAME + 19)
    out = episode_actions(frames, hands[~gap], ActionsOptions())
    right = out[out["identity"] == "wearer_right"]
    missing = right[right["label"] == "missing"]
    assert missing[["frame_start", "frame_stop"]].values.tolist() == [[FIRST_FRAME + 10, FIRST_FRAME + 20]]


def test_a_bad_episode_becomes_its_error_row(episode):
    frames, hands, _ = episode
    broken = hands.assign(keypoints_world_m=[np.zeros(5)] * len(hands))
    guarded_actions = guarded_pair(partial(episode_actions, opts=ActionsOptions()), ACTIONS.columns)
    out = guarded_actions(frames, broken)
    assert out["_row_kind"].tolist() == ["error"] and out["episode_id"].tolist() == ["e1"]
    assert "ValueError" in out["_error"].iat[0]
    ok = guarded_actions(frames, hands)
    assert (ok["_row_kind"] == "row").all() and len(ok) > 2
