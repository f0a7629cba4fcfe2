"""Hand model: metric bone lengths, anatomy (left/right), reach, grasp cycles on the table."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.synth.hands import FINGER_BONES, HandOptions, make_hand_motion
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
    return np.stack(
        [np.linalg.norm(kp[..., c, :] - kp[..., p, :], axis=-1) for p, c in FINGER_BONES], axis=-1
    )


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
