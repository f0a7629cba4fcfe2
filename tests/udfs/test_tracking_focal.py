"""The ba unit refines an uncalibrated focal and completion uses it (pandas, without Spark).

Tracks of the synthetic head motion (`tests.pose_core.camera_poses.synth_tracks`, true focal 500 px)
go through tracking -> ba -> completion as one shard of `feature_view` rows: without a calibration sidecar the
camera is the 70-degree prior (457 px, 8.6 % short), with one it is calibrated.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.camera_poses.self_calibration import SelfCalibrationOptions
from schemas.tables import FRAMES
from tests.pose_core.camera_poses.synth_tracks import FOCAL_PX, FPS, HEIGHT, WIDTH, synthetic_tracks
from udfs.camera_tables import world_from_cam_from_columns
from udfs.ingest import calibration_to_json
from udfs.media.sidecars import Calibration
from udfs.multi_output import split_tables, stack_tables
from udfs.options import CameraTrackingOptions
from udfs.tracking import (
    BA_INPUTS,
    BA_OUTPUTS,
    COMPLETION_INPUTS,
    TRACKING_OUTPUTS,
    ba_unit,
    completion_unit,
    tracking_unit,
)

N_FRAMES = 150


@pytest.fixture(scope="module")
def tracks():
    return synthetic_tracks(N_FRAMES, seed=0)


def _run(feats, calibration_json: str | None, copts: CompletionOptions, self_calibration: bool = True
         ) -> tuple[dict, pd.DataFrame]:
    """tracking -> ba -> completion of one episode; returns the ba tables and the `camera_poses` rows."""
    view = pd.DataFrame({
        "episode_id": "ep",
        "shard_idx": np.int32(0),
        "frame_idx": np.arange(len(feats), dtype=np.int64),
        "owned": True,
        "track_ids": [f.track_ids for f in feats],
        "uv_px": [f.uv_px.reshape(-1) for f in feats],
        "descriptors": None,
        "calibration_json": calibration_json,
        "width": np.int32(WIDTH),
        "height": np.int32(HEIGHT),
        "hand_boxes_px": None,
    })  # fmt: skip
    frames = pd.DataFrame(dict.fromkeys(FRAMES.columns, 0), index=range(len(feats))).assign(
        episode_id="ep", frame_idx=np.arange(len(feats)), ts_s=np.arange(len(feats)) / FPS
    )
    opts = CameraTrackingOptions(self_calibration=SelfCalibrationOptions(enabled=self_calibration))
    tables = split_tables(tracking_unit(view, opts), TRACKING_OUTPUTS)
    tables |= split_tables(ba_unit(stack_tables([(s, tables[s.name]) for s in BA_INPUTS]), copts), BA_OUTPUTS)
    tables |= {"frames": frames, "feature_view": view}
    poses = completion_unit(stack_tables([(s, tables[s.name]) for s in COMPLETION_INPUTS]), copts, opts)
    return tables, poses


def _ate_pct(poses: pd.DataFrame, gt: np.ndarray) -> float:
    est = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    return evaluate_trajectory(est, gt).ate_pct_of_path


def test_prior_focal_refined_and_used_by_completion(tracks):
    """Tracking with the prior, ba refining it: the ba stage's estimate reaches completion."""
    feats, gt = tracks
    tables, poses = _run(feats, None, CompletionOptions(), self_calibration=False)
    cam = tables["ba_cameras"].iloc[0]
    assert tables["cameras"]["intrinsics_source"].tolist() == ["prior"]
    assert cam.intrinsics_source == "estimated" and cam.focal_status == "refined"
    assert cam.focal_prior_px == pytest.approx(0.5 * WIDTH / np.tan(np.radians(35.0)))
    assert abs(cam.fx / FOCAL_PX - 1) < 0.01 and cam.fy == cam.fx and 0 < cam.focal_std_px < 5.0
    _, poses_prior = _run(feats, None, CompletionOptions(refine_focal=False), self_calibration=False)
    ate, ate_prior = _ate_pct(poses, gt), _ate_pct(poses_prior, gt)
    assert ate < 0.5 * ate_prior, (ate, ate_prior)


def test_tracking_estimates_the_camera_and_tracks_again(tracks):
    """With self-calibration the tracking stage itself tracks with the estimated camera."""
    feats, gt = tracks
    tables, poses = _run(feats, None, CompletionOptions())
    tracked_with = tables["cameras"].iloc[0]
    assert tracked_with.intrinsics_source == "estimated" and abs(tracked_with.fx / FOCAL_PX - 1) < 0.01
    assert abs(tables["ba_cameras"].iloc[0].fx / FOCAL_PX - 1) < 0.01
    _, poses_plain = _run(feats, None, CompletionOptions(refine_focal=False), self_calibration=False)
    assert _ate_pct(poses, gt) < 0.5 * _ate_pct(poses_plain, gt)


def test_calibrated_camera_unchanged(tracks):
    feats, _ = tracks
    c = (WIDTH - 1) / 2, (HEIGHT - 1) / 2
    calib = calibration_to_json(Calibration(FOCAL_PX, FOCAL_PX, *c, WIDTH, HEIGHT, "none", ()))
    tables, _ = _run(feats, calib, CompletionOptions())
    cam = tables["ba_cameras"].iloc[0]
    before = tables["cameras"].iloc[0]
    assert cam.intrinsics_source == "sidecar" and cam.focal_status == "fixed" and pd.isna(cam.focal_std_px)
    assert (cam.fx, cam.fy, cam.cx, cam.cy) == (before.fx, before.fy, before.cx, before.cy)
