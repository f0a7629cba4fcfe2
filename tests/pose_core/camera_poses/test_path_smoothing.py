"""The camera path's motion model: a still head stays still, a move is followed, a one-frame jump is not."""

from __future__ import annotations

import numpy as np

from pose_core.camera_poses.completion import PoseQuality, _place_unmeasured_centres
from pose_core.camera_poses.path_smoothing import PathSmoothingOptions, smooth_camera_path

SIGMA = 0.005  # per-axis noise of a motion-only centre, map units


def _head_path(n: int = 240) -> np.ndarray:
    """Still for 80 frames, a smooth 0.5-unit move over 60 frames, still again: `(n, 3)`."""
    t = np.clip((np.arange(n) - 80) / 60.0, 0.0, 1.0)
    ease = 3 * t**2 - 2 * t**3
    return np.stack([0.5 * ease, 0.1 * ease, np.zeros(n)], axis=1)


def _observed(truth: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    measured = truth + rng.normal(0.0, SIGMA, truth.shape)
    outliers = np.array([40, 110, 200])[: len(truth) // 100 + 1]  # at rest, mid-move, at rest again
    measured[outliers] += np.array([[0.25, 0, 0], [0, -0.2, 0], [0, 0, 0.15]])[: len(outliers)]  # 30-50 stds
    return measured, outliers


def test_noise_is_reduced_outliers_rejected_and_the_move_followed() -> None:
    truth = _head_path()
    measured, outliers = _observed(truth)
    n = len(truth)
    smoothed = smooth_camera_path(measured, np.ones(n, bool), np.zeros(n, np.int32), PathSmoothingOptions())
    err = np.linalg.norm(smoothed - truth, axis=1)
    raw = np.linalg.norm(measured - truth, axis=1)
    clean = np.setdiff1d(np.arange(n), outliers)
    rest = np.r_[5:75, 150:235]
    assert np.sqrt(np.mean(err[rest] ** 2)) < np.sqrt(np.mean(raw[np.intersect1d(rest, clean)] ** 2)) / 3
    assert err[outliers].max() < 4 * SIGMA, err[outliers]  # raw: 0.15-0.25 units
    assert err[80:140].max() < 4 * SIGMA, err[80:140].max()  # the move is not flattened


def test_maps_are_smoothed_apart_and_unposed_frames_left_alone() -> None:
    truth = _head_path(120)
    measured, _ = _observed(truth, seed=1)
    measured[60:] += 3.0  # a second map starts at frame 60, in its own frame
    segment = np.r_[np.zeros(60), np.ones(60)].astype(np.int32)
    posed = np.ones(120, bool)
    posed[[10, 11, 90]] = False
    smoothed = smooth_camera_path(measured, posed, segment, PathSmoothingOptions())
    np.testing.assert_array_equal(smoothed[~posed], measured[~posed])
    assert np.abs(smoothed[55:60] - truth[55:60]).max() < 0.05  # not pulled towards the other map
    assert np.abs(smoothed[60:65] - truth[60:65] - 3.0).max() < 0.05
    off = smooth_camera_path(measured, posed, segment, PathSmoothingOptions(enabled=False))
    np.testing.assert_array_equal(off, measured)


def test_a_path_too_short_for_its_noise_estimate_is_kept() -> None:
    measured = np.random.default_rng(2).normal(0, SIGMA, (6, 3))
    out = smooth_camera_path(measured, np.ones(6, bool), np.zeros(6, np.int32), PathSmoothingOptions())
    np.testing.assert_array_equal(out, measured)


def test_still_frames_before_the_map_take_its_first_centre_and_turns_between_are_interpolated() -> None:
    """Tracking holds a still head at the origin until a map exists; the map may put it elsewhere."""
    n = 10
    wfc = np.tile(np.eye(4), (n, 1, 1))
    quality = np.full(n, PoseQuality.ROTATION_ONLY, np.int8)
    quality[[3, 4, 7]] = PoseQuality.MOTION_ONLY
    wfc[3, :3, 3], wfc[4, :3, 3], wfc[7, :3, 3] = [0.5, 0, 0.4], [0.6, 0, 0.4], [0.9, 0, 0.4]
    segment = np.zeros(n, np.int32)
    _place_unmeasured_centres(wfc, quality, segment)
    np.testing.assert_allclose(wfc[:3, :3, 3], [[0.5, 0, 0.4]] * 3)  # held at the map's first centre
    np.testing.assert_allclose(wfc[5, :3, 3], [0.7, 0, 0.4])  # on the line between frames 4 and 7
    np.testing.assert_allclose(wfc[8:, :3, 3], [[0.9, 0, 0.4]] * 2)  # held after the last
    np.testing.assert_array_equal(wfc[:, :3, :3], np.tile(np.eye(3), (n, 1, 1)))  # rotations untouched


def test_a_fast_sustained_move_beyond_the_gate_is_followed() -> None:
    """A camera that speeds up faster than the still part's model expects (a sweep at the end of a
    rendered clip: 0.5 units a frame) is followed, not gated out as a run of outliers."""
    n = 200
    t = np.arange(n, dtype=float)
    x = np.where(t < 150, 0.0, 0.5 * 0.02 * (t - 150) ** 2)  # still, then accelerating to 1 unit a frame
    truth = np.stack([x, np.zeros(n), np.zeros(n)], axis=1)
    measured = truth + np.random.default_rng(3).normal(0.0, SIGMA, truth.shape)
    smoothed = smooth_camera_path(measured, np.ones(n, bool), np.zeros(n, np.int32), PathSmoothingOptions())
    assert np.linalg.norm(smoothed - truth, axis=1).max() < 4 * SIGMA
