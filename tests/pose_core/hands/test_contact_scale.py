"""Metric scale from the wearer's hands on a synthetic table episode: hands and map noisy as a pipeline's.

The episode's hands grasp on the table top (`pose_core.synth.hands`); the map and camera poses are
in units of `MPU` metres (`pose_core.synth.observe.simulated_map`); the hand fits are the true
keypoints in the camera frame with the fit's typical depth noise added per observation.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.hands.contact_scale import (
    HandScaleInputs,
    HandScaleOptions,
    fit_support_plane,
    scale_from_hand_contact,
)
from pose_core.synth import SynthOptions, generate_episode
from pose_core.synth.observe import simulated_map
from pose_core.synth.scene import SceneOptions

logger = logging.getLogger(__name__)

MPU = 0.37  # true metres per map unit
DEPTH_NOISE = 0.03  # per-observation relative depth noise of the hand fit (real photos: ~2.5 % median)


@pytest.fixture(scope="module")
def episode():
    coarse = SceneOptions(room_texel_m=0.02, table_texel_m=0.008)  # textures are not looked at here
    return generate_episode(SynthOptions(num_frames=450, seed=5, scene=coarse))


def _inputs(ep, sim, rng, scale_points=1.0) -> HandScaleInputs:
    """The wearer's visible hands, camera frame, each scaled about the camera by 1 + N(0, DEPTH_NOISE)."""
    cam_from_world = np.linalg.inv(ep.world_from_cam)
    in_cam = (
        np.einsum("fij,fhkj->fhki", cam_from_world[:, :3, :3], ep.hands_world)
        + cam_from_world[:, None, None, :3, 3]
    )
    frame, hand = np.nonzero(ep.hand_visible)
    depth = 1.0 + rng.normal(0.0, DEPTH_NOISE, len(frame))
    return HandScaleInputs(
        ts_s=ep.ts_s, world_from_cam=sim.world_from_cam, measured=np.ones(ep.num_frames, bool), camera_k=ep.K,
        points_world=sim.points * scale_points, frame_pos=frame,
        hand_id=np.array(["wearer_left", "wearer_right"])[hand],
        keypoints_cam=in_cam[frame, hand] * depth[:, None, None], keypoints_px=ep.hands_px[frame, hand],
    )  # fmt: skip


def test_the_hands_give_metres_per_unit_within_5_percent_with_a_covering_error(episode):
    rng = np.random.default_rng(0)
    sim = simulated_map(episode, MPU, rng)
    result = scale_from_hand_contact(_inputs(episode, sim, rng), HandScaleOptions())
    error = result.metres_per_unit / MPU - 1.0
    logger.info("hand scale %.4f m/unit (truth %.2f, %+.2f %%), fit error %.4f, %d of %d moments in contact",
                result.metres_per_unit, MPU, 100 * error, result.rel_std_fit, result.moments_in_contact,
                len(result.moments))  # fmt: skip
    assert result.reason is None and abs(error) < 0.05
    assert abs(np.log1p(error)) <= 1.96 * result.rel_std_fit
    assert 0.005 < result.rel_std_fit < 0.05  # the spread of the moments and the contact tolerance
    assert result.rel_std == pytest.approx(np.hypot(result.rel_std_fit, HandScaleOptions().hand_size_rel_std))
    assert result.moments_in_contact >= 8
    # Moments in contact lie where the hands touch the table: their true lowest keypoint within 2 cm.
    table_z = episode.renderer.scene.options.table_center_m[2]
    for m in result.moments:
        hand = 0 if m.hand_id == "wearer_left" else 1
        low = np.median(episode.hands_world[m.frame_pos, hand, :, 2].min(axis=1)) - table_z
        if m.in_contact:
            assert low < 0.02, (m.frame_pos[0], low)


@pytest.mark.slow
def test_the_answer_follows_the_maps_units(episode):
    """The same map in units a third as large: a third of the metres per unit, same relative error."""
    rng = np.random.default_rng(0)
    sim = simulated_map(episode, MPU, rng)
    base = scale_from_hand_contact(_inputs(episode, sim, np.random.default_rng(1)), HandScaleOptions())
    poses = sim.world_from_cam.copy()
    poses[:, :3, 3] *= 3.0
    small = replace(sim, world_from_cam=poses, metres_per_unit=MPU / 3.0)
    tripled = scale_from_hand_contact(
        _inputs(episode, small, np.random.default_rng(1), 3.0), HandScaleOptions()
    )
    assert tripled.metres_per_unit == pytest.approx(base.metres_per_unit / 3.0, rel=1e-9)
    assert tripled.rel_std == pytest.approx(base.rel_std, rel=1e-9)


def test_without_mapped_surfaces_near_the_hands_it_is_refused_with_the_reason(episode):
    rng = np.random.default_rng(0)
    sim = simulated_map(episode, MPU, rng)
    # A bare table and floor: only the walls and the ceiling are mapped, facing the palms edge on.
    walls = sim.points[sim.points[:, 2] * MPU > 1.2]
    inputs = _inputs(episode, sim, rng)
    bare = replace(inputs, points_world=walls)
    result = scale_from_hand_contact(bare, HandScaleOptions())
    assert result.metres_per_unit is None and result.rel_std == float("inf")
    assert "touching a mapped surface" in result.reason or "no surface near the hands" in result.reason
    still = replace(inputs, measured=np.zeros(episode.num_frames, bool))
    assert "have a support plane" in scale_from_hand_contact(still, HandScaleOptions()).reason


@pytest.mark.slow
def test_hands_that_never_rest_are_refused(episode):
    """A speed limit below any hand's speed: no moment, no scale (not a guess from moving hands)."""
    rng = np.random.default_rng(0)
    sim = simulated_map(episode, MPU, rng)
    result = scale_from_hand_contact(_inputs(episode, sim, rng), HandScaleOptions(max_hand_speed_mps=1e-4))
    assert result.metres_per_unit is None and result.moments == ()
    assert result.reason.startswith("0 moments of a slow hand touching a mapped surface")


def test_a_support_plane_is_found_among_outliers_and_a_line_is_not_a_plane():
    rng = np.random.default_rng(3)
    normal = np.array([0.0, 0.8, 0.6])
    basis = np.linalg.svd(normal[None])[2][1:]
    on_plane = 2.0 * normal + rng.uniform(-1, 1, (60, 2)) @ basis + rng.normal(0, 0.005, (60, 3))
    points = np.concatenate([on_plane, rng.uniform([-1, -1, 1], [1, 1, 4], (20, 3))])
    plane = fit_support_plane(points, HandScaleOptions(), rng)
    assert plane is not None and plane.distance == pytest.approx(2.0, abs=0.01)
    assert np.degrees(np.arccos(plane.normal @ normal)) < 1.0
    assert plane.inliers[:60].mean() > 0.95 and plane.inliers[60:].mean() < 0.3
    line = 2.0 * normal + np.linspace(-1, 1, 40)[:, None] * basis[0] + rng.normal(0, 0.002, (40, 3))
    assert fit_support_plane(line, HandScaleOptions(), rng) is None


def test_inputs_and_options_are_checked(episode):
    with pytest.raises(ShapeError, match="HandScaleInputs"):
        HandScaleInputs(
            episode.ts_s, episode.world_from_cam, np.ones(3, bool), episode.K, np.zeros((0, 3)),
            np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 21, 3)), np.zeros((0, 21, 2)),
        )  # fmt: skip
    with pytest.raises(ValueError, match="contact_tol_m"):
        HandScaleOptions(contact_tol_m=0.0)
    with pytest.raises(ValueError, match="max_incidence_deg"):
        HandScaleOptions(max_incidence_deg=90.0)
