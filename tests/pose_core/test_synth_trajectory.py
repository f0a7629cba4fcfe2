"""Head trajectory: analytic derivatives, smoothness, and the motion envelope the brief asks for."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pose_core.synth.smooth import SmoothSignal
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

DURATION_S = 20.0


@pytest.fixture(scope="module")
def trajectory():
    return make_head_trajectory(DURATION_S, TrajectoryOptions(), np.random.default_rng(7))


class TestSmoothSignal:
    def test_derivatives_match_finite_differences(self):
        sig = SmoothSignal(0.3, ((0.2, 0.7, 0.1),), ((0.5, 0.4, 1.2), (1.1, 0.3, -0.5)))
        ts = np.linspace(0.0, 2.0, 401)
        h = 1e-5
        v, d1, d2 = sig.evaluate(ts)
        vp, vm = sig.evaluate(ts + h)[0], sig.evaluate(ts - h)[0]
        np.testing.assert_allclose(d1, (vp - vm) / (2 * h), atol=1e-6)
        # d2 has kinks at step ends (C2, not C3): the central difference is off by O(h) there.
        h2 = 1e-6
        np.testing.assert_allclose(
            d2, (sig.evaluate(ts + h2)[1] - sig.evaluate(ts - h2)[1]) / (2 * h2), atol=1e-3
        )
        # A quintic step adds exactly its delta once finished.
        assert sig.evaluate(np.array([10.0]))[0][0] - sig.evaluate(np.array([-10.0]))[0][0] == pytest.approx(
            1.2 - 0.5 + 0.2 * (np.sin(2 * np.pi * 0.7 * 10 + 0.1) - np.sin(-2 * np.pi * 0.7 * 10 + 0.1))
        )


class TestHeadTrajectory:
    def test_gyro_matches_rotation_finite_difference(self, trajectory):
        ts = np.linspace(0.0, DURATION_S, 2001)
        h = 1e-5
        r_plus = trajectory.sample(ts + h).world_from_cam[:, :3, :3]
        r_minus = trajectory.sample(ts - h).world_from_cam[:, :3, :3]
        omega_fd = Rotation.from_matrix(np.swapaxes(r_minus, 1, 2) @ r_plus).as_rotvec() / (2 * h)
        np.testing.assert_allclose(trajectory.sample(ts).gyro_cam, omega_fd, atol=1e-6)

    def test_velocity_and_acceleration_match_positions(self, trajectory):
        ts = np.linspace(0.0, DURATION_S, 2001)
        h = 1e-4
        p = [trajectory.sample(ts + k * h).world_from_cam[:, :3, 3] for k in (-1, 0, 1)]
        s = trajectory.sample(ts)
        np.testing.assert_allclose(s.velocity_world, (p[2] - p[0]) / (2 * h), atol=1e-6)
        np.testing.assert_allclose(s.accel_world, (p[2] - 2 * p[1] + p[0]) / h**2, atol=1e-3)

    def test_acceleration_is_continuous(self, trajectory):
        """C2: at 1 kHz, neither acceleration nor angular velocity jumps."""
        s = trajectory.sample(np.arange(0.0, DURATION_S, 1e-3))
        assert np.abs(np.diff(s.accel_world, axis=0)).max() < 0.05  # m/s^2 per ms
        assert np.abs(np.diff(s.gyro_cam, axis=0)).max() < 0.05  # rad/s per ms

    def test_rotations_are_proper(self, trajectory):
        r = trajectory.sample(np.linspace(0, DURATION_S, 301)).world_from_cam[:, :3, :3]
        np.testing.assert_allclose(np.swapaxes(r, 1, 2) @ r, np.broadcast_to(np.eye(3), r.shape), atol=1e-12)
        np.testing.assert_allclose(np.linalg.det(r), 1.0, atol=1e-12)

    def test_motion_envelope(self, trajectory):
        ts = np.arange(0.0, DURATION_S, 1.0 / 30.0)
        pose = trajectory.sample(ts).world_from_cam
        fwd = pose[:, :3, 2]
        pitch_down = np.degrees(np.arcsin(-fwd[:, 2]))
        heading = np.unwrap(np.arctan2(fwd[:, 1], fwd[:, 0]))
        yaw_rate = np.degrees(np.abs(np.diff(heading))) * 30.0
        height = pose[:, 2, 3]
        walk = np.ptp(pose[:, 0, 3])
        mean_pitch = np.degrees(TrajectoryOptions().pitch_down_rad)
        assert pitch_down.min() >= mean_pitch - 10.0 and pitch_down.max() <= mean_pitch + 12.0, (
            pitch_down.min(),
            pitch_down.max(),
        )
        assert yaw_rate.max() >= 150.0, yaw_rate.max()  # fast head turns, seen at the video rate
        assert yaw_rate.max() <= 230.0
        assert np.mean(yaw_rate > 100.0) < 0.2  # ... in short bursts only
        mean_height = TrajectoryOptions().head_position_m[2]
        assert abs(height.mean() - mean_height) < 0.02 and 0.01 < np.ptp(height) < 0.06  # head bob
        assert 0.3 <= walk <= 1.0, walk

    def test_shoulders_below_and_behind_head(self, trajectory):
        ts = np.linspace(0, DURATION_S, 50)
        head = trajectory.sample(ts).world_from_cam[:, :3, 3]
        shoulders = trajectory.shoulders_world(ts)
        drop = head[:, None, 2] - shoulders[..., 2]
        assert np.all((drop > 0.2) & (drop < 0.3))
        width = np.linalg.norm(shoulders[:, 1] - shoulders[:, 0], axis=1)
        np.testing.assert_allclose(width, 0.36, atol=1e-9)
        # Wearer-right shoulder is on the right of the torso (+x at yaw 0, the torso only sways).
        assert np.all(shoulders[:, 1, 0] > shoulders[:, 0, 0])

    def test_rejects_bad_duration(self):
        with pytest.raises(ValueError, match="duration_s"):
            make_head_trajectory(0.0, TrajectoryOptions(), np.random.default_rng(0))
