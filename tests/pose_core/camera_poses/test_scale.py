"""IMU metric scale of a monocular trajectory, against the synthetic head trajectory's exact poses and IMU.

The "tracking output" is the ground truth re-expressed in the first camera's frame, in map units of
`MPU` metres, with white position and rotation noise; the IMU gets white noise and a constant bias.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pytest

from pose_core.camera_poses.scale import ImuScaleOptions, estimate_time_offset, scale_from_imu
from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import invert_rigid_matrices, so3_exp
from pose_core.synth.imu import ImuOptions, ImuSamples, synthesize_imu
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

logger = logging.getLogger(__name__)

MPU = 2.5  # true metres per map unit
FRAMES = 300  # 10 s at 30 fps
ACCEL_BIAS = np.array([0.1, -0.1, 0.05])  # m/s^2, camera frame (a phone-grade bias)
IMU_NOISE = ImuOptions(accel_noise_std=0.03, gyro_noise_std=0.003)  # per 200 Hz sample
POS_NOISE_M, ROT_NOISE_DEG = 0.002, 0.1  # tracking noise, per frame
HELD_FRAMES = 60  # frames whose camera centre tracking held (before initialisation)
# Head still (no walk, bob or lean) but turning and swaying: rotation alone carries no scale.
STILL_HEAD = TrajectoryOptions(bob_amplitude_m=0.0, lean_amplitude_m=0.0, walk_step_range_m=(0.0, 0.0))


@dataclass(frozen=True)
class _Truth:
    """Exact camera motion and IMU of a synthetic head trajectory (no rendering needed)."""

    seed: int
    ts_s: np.ndarray
    world_from_cam: np.ndarray
    imu: ImuSamples


def _episode(seed: int, trajectory: TrajectoryOptions | None = None) -> _Truth:
    """A head trajectory and its IMU from the generators `pose_core.synth.generate_episode` uses, 30 fps."""
    ts = np.arange(FRAMES) / 30.0
    head = make_head_trajectory(ts[-1], trajectory or TrajectoryOptions(), np.random.default_rng(seed))
    imu = synthesize_imu(head, ts[-1], IMU_NOISE, np.random.default_rng(seed + 1))
    return _Truth(seed, ts, head.sample(ts).world_from_cam, imu)


def _tracked(ep, rng, pos_noise_m=POS_NOISE_M):
    """Monocular-like poses: world = first camera, translation in map units, per-frame noise."""
    world_from_cam = invert_rigid_matrices(ep.world_from_cam[0]) @ ep.world_from_cam
    world_from_cam[:, :3, :3] = (
        so3_exp(rng.normal(0, np.radians(ROT_NOISE_DEG), (FRAMES, 3))) @ world_from_cam[:, :3, :3]
    )
    world_from_cam[:, :3, 3] = (world_from_cam[:, :3, 3] + rng.normal(0, pos_noise_m, (FRAMES, 3))) / MPU
    return world_from_cam


def _gravity_error_deg(ep, gravity_world):
    truth = ep.world_from_cam[0, :3, :3].T @ np.array([0.0, 0.0, -1.0])
    return np.degrees(np.arccos(np.clip(truth @ gravity_world, -1.0, 1.0)))


@pytest.fixture(scope="module", params=[0, 1, 2])
def moving(request):
    return _episode(request.param)


class TestScaleFromImu:
    def test_recovers_scale_gravity_and_bias(self, moving):
        ep = moving
        rng = np.random.default_rng(ep.seed)
        r = scale_from_imu(ep.ts_s, _tracked(ep, rng), ep.imu.ts_s, ep.imu.accel + ACCEL_BIAS, ep.imu.gyro)
        assert r.reason is None, r.reason
        err = r.metres_per_unit / MPU - 1.0
        g_err = _gravity_error_deg(ep, r.gravity_world)
        logger.info(
            "seed %d: scale error %+.2f %% (rel std %.2f %%), gravity %.2f deg, bias %s, excitation %.2f",
            ep.seed, 100 * err, 100 * r.rel_std, g_err, np.round(r.accel_bias, 3), r.excitation_m_s2,
        )  # fmt: skip
        assert abs(err) <= 0.05
        assert abs(err) <= 3 * r.rel_std  # the reported uncertainty is not optimistic
        assert g_err <= 0.5
        np.testing.assert_allclose(r.accel_bias, ACCEL_BIAS, atol=0.03)
        assert r.frames_used >= FRAMES - 30 and abs(r.time_offset_s) < 0.002

    def test_imu_clock_offset_is_found(self, moving):
        ep = moving
        rng = np.random.default_rng(ep.seed)
        late = ep.imu.ts_s + 0.03  # the IMU clock runs 30 ms late
        r = scale_from_imu(ep.ts_s, _tracked(ep, rng), late, ep.imu.accel, ep.imu.gyro)
        assert r.time_offset_s == pytest.approx(-0.03, abs=0.002)
        assert r.metres_per_unit == pytest.approx(MPU, rel=0.05)

    def test_held_positions_are_left_out(self, moving):
        """Tracking holds the centre before it initialises (rotation_only): those frames must not count."""
        ep = moving
        tracked = _tracked(ep, np.random.default_rng(ep.seed))
        tracked[:HELD_FRAMES, :3, 3] = tracked[HELD_FRAMES, :3, 3]
        measured = np.arange(FRAMES) >= HELD_FRAMES
        args = (ep.ts_s, tracked, ep.imu.ts_s, ep.imu.accel, ep.imu.gyro)
        masked = scale_from_imu(*args, position_valid=measured)
        naive = scale_from_imu(*args, ImuScaleOptions(max_rel_std=1.0))
        err_masked, err_naive = masked.metres_per_unit / MPU - 1, naive.metres_per_unit / MPU - 1
        logger.info("held first %d frames: scale error %+.2f %% masked, %+.2f %% unmasked", HELD_FRAMES,
                    100 * err_masked, 100 * err_naive)  # fmt: skip
        assert abs(err_masked) <= 0.05 and masked.frames_used < FRAMES - HELD_FRAMES
        assert abs(err_naive) > abs(err_masked)

    def test_rotation_only_head_is_refused_not_invented(self):
        ep = _episode(0, STILL_HEAD)
        rng = np.random.default_rng(0)
        r = scale_from_imu(ep.ts_s, _tracked(ep, rng), ep.imu.ts_s, ep.imu.accel, ep.imu.gyro)
        logger.info("still head: excitation %.3f m/s^2, %s", r.excitation_m_s2, r.reason)
        assert r.metres_per_unit is None and "not exciting" in r.reason
        assert _gravity_error_deg(ep, r.gravity_world) <= 2.0  # gravity is still known

    def test_noisy_tracking_is_refused_not_wrong(self, moving):
        ep = moving
        r = scale_from_imu(ep.ts_s, _tracked(ep, np.random.default_rng(3), pos_noise_m=0.01), ep.imu.ts_s,
                           ep.imu.accel, ep.imu.gyro)  # fmt: skip
        assert r.metres_per_unit is None and "uncertain" in r.reason, r
        loose = scale_from_imu(ep.ts_s, _tracked(ep, np.random.default_rng(3), pos_noise_m=0.01), ep.imu.ts_s,
                               ep.imu.accel, ep.imu.gyro, ImuScaleOptions(max_rel_std=1.0))  # fmt: skip
        assert loose.rel_std > 0.025 and loose.metres_per_unit is not None

    def test_refusals_without_overlap_or_frames(self, moving):
        ep = moving
        tracked = _tracked(ep, np.random.default_rng(0))
        away = scale_from_imu(ep.ts_s, tracked, ep.imu.ts_s + 100.0, ep.imu.accel, ep.imu.gyro)
        assert away.metres_per_unit is None and "overlap" in away.reason
        few = scale_from_imu(ep.ts_s[:20], tracked[:20], ep.imu.ts_s, ep.imu.accel, ep.imu.gyro)
        assert few.metres_per_unit is None and "too few" in few.reason

    def test_exception(self, moving):
        ep = moving
        with pytest.raises(ShapeError):
            scale_from_imu(ep.ts_s, ep.world_from_cam[:-1], ep.imu.ts_s, ep.imu.accel, ep.imu.gyro)
        with pytest.raises(ShapeError):
            scale_from_imu(ep.ts_s, ep.world_from_cam, ep.imu.ts_s, ep.imu.accel[:, :2], ep.imu.gyro)
        with pytest.raises(ValueError, match="poly_order"):
            ImuScaleOptions(poly_order=1)


class TestEstimateTimeOffset:
    def test_zero_search_range_and_still_camera(self, moving):
        ep = moving
        rot = ep.world_from_cam[:, :3, :3]
        assert estimate_time_offset(ep.ts_s, rot, ep.imu.ts_s, ep.imu.gyro, 0.0) == 0.0
        still = np.tile(np.eye(3), (FRAMES, 1, 1))
        assert estimate_time_offset(ep.ts_s, still, ep.imu.ts_s, np.zeros_like(ep.imu.gyro), 0.1) == 0.0
