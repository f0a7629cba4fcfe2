"""The camera-pose unit functions on pandas frames, without Spark: priors -> tracking -> ba -> completion."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.camera_poses.features import FeatureOptions
from schemas.tables import FEATURES, FRAMES
from udfs.camera_tables import world_from_cam_from_columns
from udfs.guard import ERROR_KIND, run_unit
from udfs.ingest import calibration_to_json, plan_shards
from udfs.media.sidecars import read_calibration
from udfs.multi_output import split_tables, stack_tables
from udfs.options import CameraTrackingOptions, DecodeOptions
from udfs.priors import shard_outputs
from udfs.tracking import (
    BA_INPUTS,
    BA_OUTPUTS,
    COMPLETION_INPUTS,
    TRACKING_OUTPUTS,
    ba_unit,
    completion_unit,
    episode_features,
    tracking_unit,
)

N_FRAMES, SHARD_FRAMES, OVERLAP = 150, 100, 8


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from jobs.sample import SampleOptions, write_sample

    return write_sample(tmp_path_factory.mktemp("sample"), SampleOptions(frames=N_FRAMES))


@pytest.fixture(scope="module")
def priors(sample):
    parts = []
    for i, (start, stop, own_start, own_stop) in enumerate(plan_shards(N_FRAMES, SHARD_FRAMES, OVERLAP)):
        shard = pd.DataFrame(
            [
                {
                    "episode_id": "ep",
                    "shard_idx": i,
                    "source_path": sample["video"],
                    "kind": "video",
                    "decoder": "decord",
                    "frame_start": start,
                    "frame_stop": stop,
                    "own_start": own_start,
                    "own_stop": own_stop,
                }
            ]
        )
        parts.append(
            split_tables(shard_outputs(shard, DecodeOptions(), FeatureOptions()), [FRAMES, FEATURES])
        )
    frames = pd.concat([p["frames"] for p in parts], ignore_index=True)
    features = pd.concat([p["features"] for p in parts], ignore_index=True)
    return frames, features


def _view(sample, features, boxes=None):
    calib = calibration_to_json(read_calibration(sample["calib"]))
    return features.assign(
        calibration_json=calib,
        width=np.int32(640),
        height=np.int32(480),
        hand_boxes_px=[boxes] * len(features),
    )


def test_priors_rows_frames_once_features_with_overlap(priors):
    frames, features = priors
    assert frames["frame_idx"].tolist() == list(range(N_FRAMES))
    assert len(features) == N_FRAMES + 2 * OVERLAP  # one boundary: each side decodes the other's 8 frames
    assert features["owned"].sum() == N_FRAMES
    ids = features.groupby("shard_idx")["track_ids"].apply(lambda s: np.concatenate(list(s)).min())
    assert ids.tolist() == [0, 1 << 32]


def test_units_give_every_frame_a_pose_near_ground_truth(sample, priors):
    frames, features = priors
    opts, copts = CameraTrackingOptions(), CompletionOptions()
    view = _view(sample, features)
    tracked = split_tables(tracking_unit(view, opts), TRACKING_OUTPUTS)
    assert tracked["cameras"]["intrinsics_source"].tolist() == ["sidecar"]
    assert len(tracked["tracks"]) == N_FRAMES and tracked["keyframes"]["frame_idx"].is_monotonic_increasing
    ba = split_tables(ba_unit(stack_tables([(s, tracked[s.name]) for s in BA_INPUTS]), copts), BA_OUTPUTS)
    assert len(ba["ba_points"]) == len(tracked["map_points"])
    tables = {**tracked, **ba, "frames": frames, "feature_view": view}
    poses = completion_unit(stack_tables([(s, tables[s.name]) for s in COMPLETION_INPUTS]), copts, opts)
    est = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    assert np.isfinite(est).all()
    err = evaluate_trajectory(est, np.load(sample["world_from_cam"]))
    assert err.ate_pct_of_path <= 2.0, err  # measured: see the report of the camera stages
    assert np.allclose(poses["ts_s"], frames.sort_values("frame_idx")["ts_s"])


def test_hand_boxes_remove_features(sample, priors):
    _, features = priors
    left_half = [0.0, 0.0, 319.0, 479.0]
    feats = episode_features(_view(sample, features, left_half), 1.0, 0.0)
    plain = episode_features(_view(sample, features), 1.0, 0.0)
    assert all((f.uv_px[:, 0] > 319.0).all() for f in feats)
    assert sum(len(f.track_ids) for f in feats) < 0.7 * sum(len(f.track_ids) for f in plain)


def test_a_broken_episode_becomes_an_error_row(sample, priors):
    _, features = priors
    view = _view(sample, features[features["frame_idx"] != 40])  # a hole in the owned frames
    out = run_unit(lambda v: tracking_unit(v, CameraTrackingOptions()), view, ["episode_id", "frame_idx"])
    assert out["_row_kind"].tolist() == [ERROR_KIND]
    assert "no features for frame 40" in out["_error"].iat[0]
