"""Hand model: metric bone lengths, anatomy (left/right), reach, grasp cycles on the table."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.hands.skeleton import BONES
from pose_core.synth.hands import HandOptions, make_hand_motion
from pose_core.synth.presets import SYNTH_PRESETS
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

DURATION_S = 20.0
FPS = 30.0


@pytest.fixture(scope="module")
def motion():
    rng = np.random.default_rng(3)
    traj = make_head_trajectory(DURATION_S, TrajectoryOptions(), rng)
    return make_hand_motion(DURATION_S, traj, SceneOptions(), HandOptions(), rng)


@pytest.fixture(scope="module")
def sampled(motion):
    ts = np.arange(0.0, DURATION_S, 1.0 / FPS)
    return ts, motion.keypoints_world(ts), motion.grip_curl(ts)


def _bone_lengths(kp):
    return np.stack([np.linalg.norm(kp[..., c, :] - kp[..., p, :], axis=-1) for p, c in BONES], axis=-1)


class TestHandMotion:
    def test_shapes(self, sampled):
        ts, kp, curl = sampled
        assert kp.shape == (len(ts), 2, 21, 3) and curl.shape == (len(ts), 2)
        assert np.isfinite(kp).all()

    def test_bone_lengths_rigid_and_adult_sized(self, sampled):
        lengths = _bone_lengths(sampled[1])
        assert lengths.std(axis=0).max() < 1e-12  # rigid bones through every pose
        middle_chain = lengths[0, 0, 8:12].sum()  # wrist->MCP->PIP->DIP->TIP of the middle finger
        assert middle_chain == pytest.approx(0.19, abs=0.005)
        assert lengths.min() > 0.015 and lengths.max() < 0.1

    def test_anatomical_handedness(self, sampled):
        """Fingers curl towards the palm: the palm side is on opposite sides of the mirrored frames."""
        _, kp, curl = sampled
        fwd = kp[:, :, 9] - kp[:, :, 0]  # wrist -> middle MCP
        thumbward = kp[:, :, 5] - kp[:, :, 17]  # pinky MCP -> index MCP
        n = np.cross(fwd, thumbward)
        curl_dir = kp[:, :, 12] - kp[:, :, 10]  # middle PIP -> TIP
        side = np.sign(np.sum(n * curl_dir, axis=-1))
        closed = curl > 0.4
        assert closed[:, 0].sum() > 10 and closed[:, 1].sum() > 10
        # Right hand: fwd x thumbward points out of the back, the fingers curl the other way.
        assert np.all(side[closed[:, 1], 1] < 0)
        assert np.all(side[closed[:, 0], 0] > 0)

    def test_wrists_within_reach_of_shoulders(self, motion, sampled):
        ts, kp, _ = sampled
        reach = np.linalg.norm(kp[:, :, 0] - motion.trajectory.shoulders_world(ts), axis=-1)
        assert reach.max() <= HandOptions().arm_reach_m + 1e-9
        assert reach.min() > 0.25

    def test_grasp_cycles_on_the_table(self, sampled):
        _, kp, curl = sampled
        table = SceneOptions()
        top = table.table_center_m[2]
        for hand in (0, 1):
            assert curl[:, hand].min() == pytest.approx(HandOptions().curl_open)
            assert curl[:, hand].max() > 0.45
            grasping = curl[:, hand] > 0.4
            wrist = kp[grasping, hand, 0]
            # While grasping the wrist is just above the table top, over the table.
            assert np.all((wrist[:, 2] - top > 0.06) & (wrist[:, 2] - top < 0.2))
            assert np.all(np.abs(wrist[:, 0] - table.table_center_m[0]) < table.table_size_m[0] / 2)
            assert np.all(np.abs(wrist[:, 1] - table.table_center_m[1]) < table.table_size_m[1] / 2)
            # The grip closes: thumb-index aperture shrinks as the curl grows.
            aperture = np.linalg.norm(kp[:, hand, 4] - kp[:, hand, 8], axis=-1)
            assert np.corrcoef(aperture, curl[:, hand])[0, 1] < -0.9
            assert aperture.max() - aperture.min() > 0.04

    def test_deterministic(self):
        def make():
            rng = np.random.default_rng(11)
            traj = make_head_trajectory(5.0, TrajectoryOptions(), rng)
            return make_hand_motion(5.0, traj, SceneOptions(), HandOptions(), rng).keypoints_world(
                np.arange(0, 5, 0.1)
            )

        np.testing.assert_array_equal(make(), make())


@pytest.fixture(scope="module")
def visiting():
    """Hands of the `hard` preset: they visit the lens while the wearer also walks away and back."""
    preset = SYNTH_PRESETS["hard"]
    rng = np.random.default_rng(3)
    traj = make_head_trajectory(DURATION_S, preset.trajectory, rng)
    return make_hand_motion(DURATION_S, traj, preset.scene, preset.hands, rng)


class TestLensVisits:
    def test_default_hands_never_visit(self, motion):
        assert all(not signal.steps for signal in motion.lens)

    def test_hands_take_turns_and_rest_from_the_table(self, visiting):
        ts = np.arange(0.0, DURATION_S, 1.0 / FPS)
        at_lens = np.stack([visiting.lens[h].evaluate(ts)[0] > 1e-9 for h in (0, 1)], axis=1)
        working = np.stack([visiting.engagement[h].evaluate(ts)[0] > 1e-9 for h in (0, 1)], axis=1)
        assert at_lens[:, 0].any() and at_lens[:, 1].any()  # each hand goes once
        assert not np.any(at_lens[:, 0] & at_lens[:, 1])  # never both
        assert not np.any(at_lens & working)  # no reaching to the table from the lens
        assert working.any(axis=0).all()  # both hands still work at the table
        for start, end in visiting.trajectory.excursions:  # nor while the wearer is away
            assert not working[(ts >= start) & (ts <= end)].any()

    def test_hand_at_the_lens_faces_the_camera_up_close(self, visiting):
        ts = np.arange(0.0, DURATION_S, 1.0 / FPS)
        weight = np.stack([visiting.lens[h].evaluate(ts)[0] for h in (0, 1)], axis=1)
        frame, hand = np.unravel_index(np.argmax(weight), weight.shape)
        world_from_cam = visiting.trajectory.sample(ts[frame : frame + 1]).world_from_cam[0]
        kp = visiting.keypoints_world(ts[frame : frame + 1])[0, hand]
        in_cam = (kp - world_from_cam[:3, 3]) @ world_from_cam[:3, :3]
        assert np.all((in_cam[:, 2] > 0.1) & (in_cam[:, 2] < 0.35)), in_cam[:, 2]
        # The hand is turned to the lens (its back faces it): the palm normal is within 50 deg of the axis.
        normal = np.cross(in_cam[5] - in_cam[0], in_cam[17] - in_cam[0])
        assert abs(normal[2]) / np.linalg.norm(normal) > np.cos(np.radians(50.0))
        lengths = _bone_lengths(visiting.keypoints_world(ts))
        assert lengths.std(axis=0).max() < 1e-12  # still a rigid hand


@pytest.mark.parametrize("preset", sorted(SYNTH_PRESETS))
def test_periodic_hands_end_where_they_began(preset):
    """With a periodic head, periodic hands finish every cycle and lens visit within the period: their
    keypoints at the period's end are those at 0, and they still grasp in between."""
    opts, period = SYNTH_PRESETS[preset], 30.0
    rng = np.random.default_rng(3)
    traj = make_head_trajectory(period, opts.trajectory, rng, periodic=True)
    motion = make_hand_motion(period, traj, opts.scene, opts.hands, rng, periodic=True)
    ends = motion.keypoints_world(np.array([0.0, period]))
    np.testing.assert_allclose(ends[1], ends[0], atol=1e-12)
    curl = motion.grip_curl(np.array([0.0, period]))
    np.testing.assert_allclose(curl[1], curl[0], atol=1e-12)
    assert (motion.grip_curl(np.arange(0.0, period, 0.1)) > 0.4).any(axis=0).all()  # both hands grasp
