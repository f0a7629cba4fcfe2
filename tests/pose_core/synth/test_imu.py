"""IMU synthesis: strapdown integration of the samples reproduces the trajectory."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pose_core.synth.imu import GRAVITY_M_S2, ImuOptions, synthesize_imu
from pose_core.synth.presets import SYNTH_PRESETS
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

DURATION_S = 3.0


@pytest.fixture(scope="module")
def trajectory():
    return make_head_trajectory(DURATION_S, TrajectoryOptions(), np.random.default_rng(5))


@pytest.fixture(scope="module")
def imu(trajectory):
    return synthesize_imu(trajectory, DURATION_S, ImuOptions(), np.random.default_rng(0))


class TestSynthesizeImu:
    def test_rate_and_span(self, imu):
        assert imu.ts_s[0] == 0.0 and imu.ts_s[-1] >= DURATION_S
        np.testing.assert_allclose(np.diff(imu.ts_s), 1.0 / 200.0, atol=1e-12)
        assert imu.accel.shape == imu.gyro.shape == (len(imu.ts_s), 3)

    def test_strapdown_integration_recovers_pose(self, trajectory, imu):
        """Integrate gyro and accelerometer from the true initial state; compare along the way."""
        rot_err, pos_err = _strapdown_errors(trajectory, imu, 0, len(imu.ts_s))
        # 3 s with fast head turns (up to ~180 deg/s): second-order integration error only.
        assert max(rot_err) < 0.05, max(rot_err)  # degrees
        assert max(pos_err) < 0.005, max(pos_err)  # metres

    def test_strapdown_through_a_walk_away_from_the_table(self):
        """The `hard` preset: body turn, 2.2 m walk at ~1 m/s and ~205 deg/s head turns on top."""
        duration_s = 20.0
        walking = make_head_trajectory(duration_s, SYNTH_PRESETS["hard"].trajectory, np.random.default_rng(5))
        imu = synthesize_imu(walking, duration_s, ImuOptions(), np.random.default_rng(0))
        start = int(np.searchsorted(imu.ts_s, walking.excursions[0][0]))
        rot_err, pos_err = _strapdown_errors(walking, imu, start, start + 1000)  # 5 s
        assert max(rot_err) < 0.05, max(rot_err)  # degrees
        assert max(pos_err) < 0.005, max(pos_err)  # metres

    def test_gravity_dominates_specific_force(self, imu):
        norm = np.linalg.norm(imu.accel, axis=1)
        assert abs(np.median(norm) - GRAVITY_M_S2) < 0.5
        # Camera pitched ~50 deg down: gravity's reaction (world up) has a negative camera-y (up in image)
        # and a negative camera-z component (the camera looks down).
        mean = imu.accel.mean(axis=0) / GRAVITY_M_S2
        assert mean[1] < -0.5 and mean[2] < -0.5

    def test_noise_is_added_when_asked(self, trajectory, imu):
        noisy = synthesize_imu(
            trajectory,
            DURATION_S,
            ImuOptions(accel_noise_std=0.1, gyro_noise_std=0.01),
            np.random.default_rng(1),
        )
        assert np.std(noisy.accel - imu.accel) == pytest.approx(0.1, rel=0.1)
        assert np.std(noisy.gyro - imu.gyro) == pytest.approx(0.01, rel=0.1)

    def test_rejects_bad_rate(self, trajectory):
        with pytest.raises(ValueError, match="rate"):
            synthesize_imu(trajectory, DURATION_S, ImuOptions(rate_hz=0.0), np.random.default_rng(0))


def _strapdown_errors(trajectory, imu, first, stop):
    """Rotation (deg) and position (m) errors of IMU integration over samples `first..stop-1`."""
    truth = trajectory.sample(imu.ts_s)
    rot = truth.world_from_cam[first, :3, :3].copy()
    pos = truth.world_from_cam[first, :3, 3].copy()
    vel = truth.velocity_world[first].copy()
    g = np.array([0.0, 0.0, -GRAVITY_M_S2])
    rot_err, pos_err = [], []
    for k in range(first, stop - 1):
        dt = imu.ts_s[k + 1] - imu.ts_s[k]
        acc_k = rot @ imu.accel[k] + g
        # Midpoint rotation over the step (gyro linear in time), then the end-of-step acceleration.
        rot_next = rot @ Rotation.from_rotvec(0.5 * (imu.gyro[k] + imu.gyro[k + 1]) * dt).as_matrix()
        acc_next = rot_next @ imu.accel[k + 1] + g
        pos = pos + vel * dt + (2.0 * acc_k + acc_next) / 6.0 * dt**2
        vel = vel + 0.5 * (acc_k + acc_next) * dt
        rot = rot_next
        rot_err.append(
            np.degrees(Rotation.from_matrix(rot.T @ truth.world_from_cam[k + 1, :3, :3]).magnitude())
        )
        pos_err.append(np.linalg.norm(pos - truth.world_from_cam[k + 1, :3, 3]))
    return rot_err, pos_err
