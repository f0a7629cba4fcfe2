"""The constant-velocity (white-noise acceleration) motion model of a point in 3-D, for Kalman smoothers.

The state is position then velocity, `(6,)`; one step of `dt` maps it through `A` and adds process
noise `Q` whose acceleration spectral density `q` (length^2 / time^3) says how much the velocity may
wander: over a second, by about `sqrt(q)`. The hands' motion model (`pose_core.hands.temporal`) and
the camera path's (`pose_core.camera_poses.path_smoothing`) both use it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["THIRD_DIFF_GAIN", "constant_velocity_step", "position_block"]

FloatArray = NDArray[np.float64]

#: Std of the third difference of unit white noise, sqrt(1 + 9 + 9 + 1): a noise estimate that a
#: smooth motion (small jerk) barely disturbs.
THIRD_DIFF_GAIN = float(np.sqrt(20.0))


def constant_velocity_step(dt: float, q: float) -> tuple[FloatArray, FloatArray]:
    """Transition `A` `(6, 6)` and process noise `Q` `(6, 6)` over `dt` with acceleration density `q`."""
    a = np.array([[1.0, dt], [0.0, 1.0]])
    noise = q * np.array([[dt**3 / 3.0, dt**2 / 2.0], [dt**2 / 2.0, dt]])
    eye = np.eye(3)
    return np.asarray(np.kron(a, eye), np.float64), np.asarray(np.kron(noise, eye), np.float64)


def position_block() -> FloatArray:
    """The observation matrix `H` `(3, 6)` of a measured position."""
    return np.hstack([np.eye(3), np.zeros((3, 3))])
