"""Stereo depth and scale against synthetic renders with exact depth (pose_core.synth, stereo).

Depth: the renderer's left depth is ground truth for the disparity depth, on the synthetic rig
(parallel cameras), and on a rig with a rotated, offset right camera and lens distortion (the
pinhole renders are warped into a radtan or fisheye camera, depth with them).
Scale: a "map" made from the exact depth at corners, in map units of `MPU` metres.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest

from pose_core.camera_poses.stereo import (
    DisparityOptions,
    StereoMatcher,
    StereoRig,
    StereoScaleOptions,
    StereoView,
    right_from_left_of_baseline,
    scale_from_depths,
    stereo_scale,
)
from pose_core.errors import InputError
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import invert_rigid_matrices, so3_exp
from pose_core.synth import SynthOptions, generate_episode

logger = logging.getLogger(__name__)

FRAMES = 240
MPU = 0.37  # true metres per map unit
PINHOLE = Camera(640, 480, 500.0, 500.0, 319.5, 239.5)
# Right camera of the "awkward" rig: turned 1.5 deg (yaw) and 0.5 deg (roll), centre 10 cm right,
# 4 mm down and 3 mm behind the left camera's.
RIGHT_CENTRE_IN_LEFT = np.array([0.1, 0.004, -0.003])
RIGHT_ROTATION = so3_exp(np.radians([0.0, 1.5, 0.5]))


@pytest.fixture(scope="module")
def episode():
    return generate_episode(SynthOptions(num_frames=FRAMES, stereo=True, seed=0))


@pytest.fixture(scope="module")
def matcher():
    return StereoMatcher(StereoRig(PINHOLE, PINHOLE, right_from_left_of_baseline(0.1)))


def _relative_errors(depth, truth):
    ok = np.isfinite(depth) & np.isfinite(truth) & (truth > 0)
    return np.abs(depth[ok] / truth[ok] - 1.0), ok.mean()


def _distort(image, camera, interpolation):
    """The pinhole render `image` as seen through the distorted `camera` (same K); NaN/0 outside."""
    rows, cols = np.mgrid[0 : camera.height, 0 : camera.width]
    xy = camera.cam_ray_from_img(np.column_stack([cols.ravel(), rows.ravel()]).astype(np.float64))
    maps = (xy * [PINHOLE.fx, PINHOLE.fy] + [PINHOLE.cx, PINHOLE.cy]).reshape(camera.height, camera.width, 2)
    fill = np.nan if image.dtype == np.float32 else 0
    return cv2.remap(image, maps.astype(np.float32), None, interpolation, borderValue=fill)


@pytest.mark.parametrize("i", [0, 120])
def test_disparity_depth_matches_the_rendered_depth(episode, matcher, i):
    frame = next(episode.frames(i, i + 1))
    depth = matcher.depth_map(matcher.disparity(frame.rgb, frame.rgb_right))
    rel, valid = _relative_errors(depth, frame.depth)
    p90 = np.percentile(rel, 90)
    logger.info("stereo depth frame %d: %.0f %% of pixels valid, median relative error %.2f %%, 90th "
                "percentile %.2f %%", i, 100 * valid, 100 * np.median(rel), 100 * p90)  # fmt: skip
    assert valid > 0.6
    assert np.median(rel) < 0.01
    assert np.mean(rel > 0.05) < 0.1


@pytest.mark.parametrize(
    ("model", "dist"), [("radtan", (-0.12, 0.03, 0.001, -0.001)), ("fisheye", (0.04, 0.01, 0.0, 0.0))]
)
def test_rectification_handles_a_rotated_right_camera_and_distortion(episode, model, dist):
    i = 60
    right_from_left = np.eye(4)
    right_from_left[:3, :3] = RIGHT_ROTATION.T
    right_from_left[:3, 3] = -RIGHT_ROTATION.T @ RIGHT_CENTRE_IN_LEFT
    world_from_right = episode.world_from_cam[i] @ invert_rigid_matrices(right_from_left)
    left = episode.renderer.render(episode.world_from_cam[i], episode.hands_world[i], episode.elbows_world[i])
    right = episode.renderer.render(world_from_right, episode.hands_world[i], episode.elbows_world[i])
    camera = Camera(640, 480, 500.0, 500.0, 319.5, 239.5, model, dist)
    matcher = StereoMatcher(StereoRig(camera, camera, right_from_left))
    left_rgb, right_rgb = (_distort(v.rgb, camera, cv2.INTER_LINEAR) for v in (left, right))
    truth = _distort(left.depth, camera, cv2.INTER_NEAREST)
    depth = matcher.depth_map(matcher.disparity(left_rgb, right_rgb))
    rel, valid = _relative_errors(depth, truth)
    logger.info("stereo depth %s rig (rotated right camera): %.0f %% valid, median relative error %.2f %%",
                model, 100 * valid, 100 * np.median(rel))  # fmt: skip
    assert matcher.baseline_m == pytest.approx(np.linalg.norm(RIGHT_CENTRE_IN_LEFT))
    assert valid > 0.5
    assert np.median(rel) < 0.01


def keyframe_map(episode, keyframes, rng, metres_per_unit=MPU):
    """A monocular-like map of `keyframes`: corners at their exact depth plus 3 mm noise, in map units.

    Returns:
        Per keyframe: (rendered frame, world_from_cam `(4, 4)` in map units, obs_xy `(N, 2)`,
        points `(N, 3)` in map units).
    """
    out = []
    for i in keyframes:
        frame = next(episode.frames(i, i + 1))
        grey = cv2.cvtColor(frame.rgb, cv2.COLOR_RGB2GRAY)
        corners = cv2.goodFeaturesToTrack(grey, 300, 0.01, 8).reshape(-1, 2)
        z = frame.depth[np.round(corners[:, 1]).astype(int), np.round(corners[:, 0]).astype(int)]
        keep = np.isfinite(z)
        xy = PINHOLE.cam_ray_from_img(corners[keep])
        x_cam = np.column_stack([xy, np.ones(len(xy))]) * z[keep, None]
        pose = episode.world_from_cam[i].copy()
        x_world = x_cam @ pose[:3, :3].T + pose[:3, 3] + rng.normal(0.0, 0.003, x_cam.shape)
        pose[:3, 3] /= metres_per_unit
        out.append((frame, pose, xy, x_world / metres_per_unit))
    return out


def _views(episode, keyframes, rng):
    return [
        StereoView(frame.rgb, frame.rgb_right, pose, xy, points)
        for frame, pose, xy, points in keyframe_map(episode, keyframes, rng)
    ]


def test_stereo_scale_of_a_map_is_within_two_percent(episode, matcher):
    views = _views(episode, range(0, FRAMES, 30), np.random.default_rng(1))
    result = stereo_scale(matcher, views, StereoScaleOptions())
    logger.info("stereo scale %.5f m/unit, truth %.5f (%+.2f %%), spread %.3f, %d points in %d keyframes",
                result.metres_per_unit, MPU, 100 * (result.metres_per_unit / MPU - 1), result.rel_spread,
                result.points_used, result.keyframes_used)  # fmt: skip
    assert result.reason is None
    assert result.metres_per_unit == pytest.approx(MPU, rel=0.02)
    assert result.keyframes_used == len(views) and result.points_used > 500


def test_stereo_scale_refuses_without_matches(episode, matcher):
    [view] = _views(episode, [90], np.random.default_rng(2))
    blank = StereoView(view.left_rgb, np.zeros_like(view.right_rgb), view.world_from_cam, view.obs_xy,
                       view.points_world)  # fmt: skip
    result = stereo_scale(matcher, [blank], StereoScaleOptions())
    assert result.metres_per_unit is None and "too few" in result.reason


def test_scale_from_depths_refuses_a_wide_spread():
    rng = np.random.default_rng(3)
    map_depth = rng.uniform(1.0, 3.0, 400)
    opts = StereoScaleOptions()
    good = scale_from_depths(2.0 * map_depth * rng.normal(1.0, 0.01, 400), map_depth, opts)
    assert good.metres_per_unit == pytest.approx(2.0, rel=0.005) and good.rel_spread < 0.02
    wide = scale_from_depths(2.0 * map_depth * rng.uniform(0.5, 1.5, 400), map_depth, opts)
    assert wide.metres_per_unit is None and "spread" in wide.reason


def test_rigs_that_are_not_side_by_side_are_refused():
    above = np.eye(4)
    above[1, 3] = -0.1  # right camera 10 cm below the left one
    with pytest.raises(InputError, match="vertical"):
        StereoMatcher(StereoRig(PINHOLE, PINHOLE, above))
    with pytest.raises(InputError, match="LEFT"):
        StereoMatcher(StereoRig(PINHOLE, PINHOLE, invert_rigid_matrices(right_from_left_of_baseline(0.1))))
    with pytest.raises(ValueError, match="multiple of 16"):
        DisparityOptions(num_disparities=100)
