"""Global BA of a long segment in overlapping windows of keyframes (issue 18): bounded problems, every
keyframe adjusted, and a trajectory as accurate as one problem over all keyframes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pose_core.camera_poses.completion import CompletionOptions, bundle_adjust_keyframes, complete_poses
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.camera_poses.tracking import track_episode
from pose_core.geometry.camera import Camera
from tests.pose_core.camera_poses.synth_tracks import FOCAL_PX, HEIGHT, WIDTH, synthetic_tracks

pytestmark = pytest.mark.slow

CAMERA = Camera(WIDTH, HEIGHT, FOCAL_PX, FOCAL_PX, (WIDTH - 1) / 2, (HEIGHT - 1) / 2)
# small windows, so a 300-frame clip has several
WINDOWED = CompletionOptions(ba_window_keyframes=24, ba_window_overlap=8, ba_window_anchors=8)
ONE_PROBLEM = CompletionOptions(ba_window_keyframes=0)


@pytest.fixture(scope="module")
def tracked():
    """300 frames of head motion (seed 2) through tracking; the true poses and the features."""
    feats, gt = synthetic_tracks(300, seed=2)
    return track_episode(feats, CAMERA), feats, gt


def _adjusted(tracked, opts):
    result, feats, gt = tracked
    result = copy.deepcopy(result)
    ba = bundle_adjust_keyframes(result, CAMERA, opts)
    done = complete_poses(result, feats, ba.camera, opts)
    return ba, result, evaluate_trajectory(done.world_from_cam, gt)


def test_a_long_segment_is_adjusted_in_bounded_windows_and_every_keyframe_moves(tracked):
    before = np.stack([k.cam_from_world for k in tracked[0].keyframes])
    assert len(before) > 2 * WINDOWED.ba_window_keyframes  # the clip needs several windows
    ba, result, _ = _adjusted(tracked, WINDOWED)
    cameras = [len(res.rotation) for res in ba.solves]
    assert len(cameras) >= 3
    assert max(cameras) <= WINDOWED.ba_window_keyframes + WINDOWED.ba_window_anchors
    after = np.stack([k.cam_from_world for k in result.keyframes])
    moved = np.linalg.norm(after[:, :3, 3] - before[:, :3, 3], axis=1) > 0
    assert moved[1:].all()  # all but the first (the gauge) were free in some window


def test_windows_are_as_accurate_as_one_problem(tracked):
    _, _, one = _adjusted(tracked, ONE_PROBLEM)
    _, _, windowed = _adjusted(tracked, WINDOWED)
    assert windowed.num_frames == one.num_frames == 300
    assert windowed.ate_pct_of_path <= 1.25 * one.ate_pct_of_path + 0.01, (windowed, one)


def test_a_short_segment_is_one_problem(tracked):
    ba, _, _ = _adjusted(tracked, CompletionOptions(ba_window_keyframes=10_000))
    assert len(ba.solves) == 1
