"""Ideal (optionally noisy) IMU samples from a smooth head trajectory.

Convention:
    The IMU frame is the camera frame (OpenCV: x right, y down, z forward); there is no lever arm
    and no time offset. The accelerometer measures specific force
    `R_cam_from_world (a_world - g_world)` with `g_world = (0, 0, -gravity)`, so a camera at rest
    reads `+gravity` along world up; the gyroscope measures the camera's angular velocity in its
    own frame. Units: m/s^2, rad/s, seconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.synth.trajectory import HeadTrajectory

__all__ = ["GRAVITY_M_S2", "ImuOptions", "ImuSamples", "synthesize_imu"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# Standard gravity, m/s^2; the synthetic world's gravity vector is (0, 0, -GRAVITY_M_S2).
GRAVITY_M_S2 = 9.81


@dataclass(frozen=True)
class ImuOptions:
    """IMU rate and noise."""

    # Sample rate, Hz.
    rate_hz: float = 200.0
    # White-noise standard deviation per sample: accelerometer (m/s^2) and gyroscope (rad/s); 0 = ideal.
    accel_noise_std: float = 0.0
    gyro_noise_std: float = 0.0


@dataclass(frozen=True)
class ImuSamples:
    """An IMU stream in the camera frame.

    Attributes:
        ts_s: sample times, seconds, `(M,)`.
        accel: specific force, m/s^2, camera frame, `(M, 3)`.
        gyro: angular velocity, rad/s, camera frame, `(M, 3)`.
    """

    ts_s: FloatArray
    accel: FloatArray
    gyro: FloatArray


def synthesize_imu(
    trajectory: HeadTrajectory, duration_s: float, opts: ImuOptions, rng: np.random.Generator
) -> ImuSamples:
    """Sample accelerometer and gyroscope from t = 0 at `opts.rate_hz` until `duration_s` is covered.

    Args:
        trajectory: the head (camera) motion.
        duration_s: time to cover, seconds; the last sample is at or just after it.
        opts: rate and noise.
        rng: noise source (unused when both noise levels are 0).

    Returns:
        The IMU samples.

    Raises:
        ValueError: if the rate or the duration is not positive.
    """
    if opts.rate_hz <= 0.0 or duration_s <= 0.0:
        raise ValueError(f"IMU rate and duration must be positive, got {opts.rate_hz} Hz and {duration_s} s")
    n = int(np.ceil(duration_s * opts.rate_hz - 1e-9)) + 1
    ts = np.arange(n) / opts.rate_hz
    motion = trajectory.sample(ts)
    rot = motion.world_from_cam[:, :3, :3]
    specific_force_world = motion.accel_world + np.array([0.0, 0.0, GRAVITY_M_S2])
    accel = np.einsum("nji,nj->ni", rot, specific_force_world)
    gyro = motion.gyro_cam.copy()
    if opts.accel_noise_std > 0.0:
        accel += rng.normal(0.0, opts.accel_noise_std, accel.shape)
    if opts.gyro_noise_std > 0.0:
        gyro += rng.normal(0.0, opts.gyro_noise_std, gyro.shape)
    return ImuSamples(ts, accel, gyro)
