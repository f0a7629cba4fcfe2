"""The hands udf without Spark: intrinsics for decoded frames, rows from fits, a real-video shard."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pandas as pd
import pytest

from pose_core.errors import EgolakeError
from pose_core.hands import HandObservation
from pose_core.synth.episode import SynthOptions, generate_episode
from schemas.tables import HANDS_CAM
from udfs.hands import camera_for_frames, hand_rows, hands_for_shard, load_estimator
from udfs.options import DecodeOptions, EstimatorOptions, HandsOptions

logger = logging.getLogger(__name__)

CALIB = {"fx": 1000.0, "fy": 1000.0, "cx": 639.5, "cy": 359.5, "width": 1280, "height": 720,
         "distortion_model": "none", "distortion": []}  # fmt: skip


def test_rows_are_metric_fits_and_frames_without_hands_have_none():
    ep = generate_episode(SynthOptions(num_frames=30, seed=3))
    cam_from_world = np.linalg.inv(ep.world_from_cam)
    camera = camera_for_frames(json.dumps(dict(CALIB, fx=500.0, fy=500.0, cx=319.5, cy=239.5, width=640,
                                               height=480)), 640, 480)  # fmt: skip
    frames, found, truth = [], [], []
    for f in range(ep.num_frames):
        hands = []
        for h in range(2):
            in_cam = ep.hands_world[f, h] @ cam_from_world[f, :3, :3].T + cam_from_world[f, :3, 3]
            if ep.hand_visible[f, h] and f % 5:  # every fifth frame: no hand found
                hands.append(HandObservation(ep.hands_px[f, h], 0.9, ("left", "right")[h], 0.8, in_cam))
                truth.append(in_cam)
        frames.append(f), found.append(hands)
    rows = hand_rows("ep", frames, found, camera, HandsOptions())
    assert list(rows.columns) == HANDS_CAM.columns
    assert set(rows["frame_idx"]) == {f for f, hands in zip(frames, found, strict=True) if hands}
    kp = np.stack(rows["keypoints_cam_m"].map(np.asarray)).reshape(-1, 21, 3)
    err = np.linalg.norm(kp - np.array(truth), axis=-1).mean(axis=-1)
    assert rows["fit_valid"].all() and err.max() < 0.005  # only the 0.4 % prior/true size difference
    assert (rows["fit_residual_px"] < 0.5).all() and (rows["depth_source"] == "hand_size_prior").all()
    box = np.stack(rows["box_px"].map(np.asarray))
    px = np.stack(rows["keypoints_px"].map(np.asarray)).reshape(-1, 21, 2)
    assert (box[:, :2] <= px.min(axis=1)).all() and (box[:, 2:] >= px.max(axis=1)).all()


def test_unknown_estimator_names_the_fix():
    with pytest.raises(EgolakeError, match="egolake.hand_estimators"):
        load_estimator(EstimatorOptions(kind="no_such_model"))


def test_estimator_is_built_for_the_tasks_device(monkeypatch):
    """A task placed on a GPU gets the networks there (torch under "auto"); one estimator per device."""
    import udfs.hands
    import udfs.models
    from udfs.device import TaskDevice

    built = []
    monkeypatch.setattr(udfs.models, "hand_estimator", lambda opts, device: built.append(device) or object())
    monkeypatch.setattr(udfs.hands, "_ESTIMATORS", {})
    opts = EstimatorOptions()
    for device in (TaskDevice("cuda", 1, 4), TaskDevice("cpu", None, 4), TaskDevice("cuda", 1, 4)):
        monkeypatch.setattr(udfs.hands, "current", lambda device=device: device)
        load_estimator(opts)
    assert built == ["cuda:1", "cpu"]


@pytest.fixture(scope="module")
def real_video(shared_data):
    pytest.importorskip("ai_edge_litert")
    return shared_data / "hands_dexretargeting" / "human_hand_video.mp4"


def test_real_video_shard_finds_the_hand_in_95_percent_of_frames(real_video):
    """The real clip shows one right hand in every frame; 90 frames of one shard at 640 px."""
    from conf.models import model_path

    try:
        model_path("hand_landmark_full.tflite")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    shard = pd.DataFrame([{"episode_id": "real", "shard_idx": 1, "source_path": str(real_video),
                           "own_start": 100, "own_stop": 190, "calibration_json": None}])  # fmt: skip
    opts = HandsOptions()
    start = time.perf_counter()
    rows = hands_for_shard(shard, opts, DecodeOptions())
    elapsed = time.perf_counter() - start
    coverage = rows["frame_idx"].nunique() / 90
    logger.info("real shard: hand in %.1f %% of 90 frames, %.1f frames/s (incl. model load), %d rows",
                100 * coverage, 90 / elapsed, len(rows))  # fmt: skip
    assert coverage >= 0.95 and rows["frame_idx"].between(100, 189).all()
    assert (rows["image_width"] == 640).all() and (rows["image_height"] == 360).all()
    assert (rows["intrinsics_source"] == "prior").all()
    main = rows[rows["hand_slot"] == 0]
    assert (main["handedness"] == "right").mean() > 0.9 and main["fit_valid"].mean() > 0.9
    wrist_depth = np.stack(main["keypoints_cam_m"].map(np.asarray))[:, 2]
    assert 0.1 < np.nanmedian(wrist_depth) < 1.5  # a webcam hand at arm's length, metres
    assert load_estimator(opts.estimator) is load_estimator(opts.estimator)  # loaded once per worker


def _counted(fn, calls: list[int]):
    """`fn(chunks, ...)` that also records how many streams each call advanced."""

    def counted(chunks, *args):
        calls.append(len(chunks))
        return fn(chunks, *args)

    return counted


def test_shards_in_lockstep_give_each_shards_own_rows_and_a_bad_shard_fails_alone(real_video, monkeypatch):
    """On a GPU task, shards of the real clip stepped together give the rows each gives alone (here the
    LiteRT estimator stands in for the GPU's: identical rows); a shard whose file is missing comes back
    as its error while the others finish."""
    import udfs.hands
    from udfs.device import TaskDevice
    from udfs.hands import hands_for_shards

    def shard(idx: int, start: int, path: str = str(real_video)) -> pd.DataFrame:
        row = {"episode_id": "real", "shard_idx": idx, "source_path": path, "own_start": start,
               "own_stop": start + 40, "calibration_json": None}  # fmt: skip
        return pd.DataFrame([row])

    opts = HandsOptions(estimator=EstimatorOptions(batch_frames=16))
    shards = [shard(0, 100), shard(1, 300), shard(2, 0, "/no/such/clip.mp4")]
    estimator = load_estimator(opts.estimator)
    steps = []
    monkeypatch.setattr(udfs.hands, "current", lambda: TaskDevice("cuda", 0, 1))
    monkeypatch.setattr(udfs.hands, "load_estimator", lambda _: estimator)
    monkeypatch.setattr(estimator, "estimate_streams", _counted(estimator.estimate_streams, steps))
    together = hands_for_shards(shards, opts, DecodeOptions())
    assert steps == [2, 2, 2]  # 40 frames in chunks of 16: both shards in each call
    monkeypatch.undo()
    for one, rows in zip(shards[:2], together[:2], strict=True):
        alone = hands_for_shard(one, opts, DecodeOptions())
        assert isinstance(rows, pd.DataFrame) and rows["frame_idx"].nunique() >= 38
        pd.testing.assert_frame_equal(rows, alone)
    assert isinstance(together[2], Exception) and "/no/such/clip.mp4" in str(together[2])
