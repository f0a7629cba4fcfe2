"""C2-smooth scalar signals with analytic first and second derivatives.

A `SmoothSignal` is `offset + sum of sinusoids + sum of quintic steps`. Quintic steps
(`10x^3 - 15x^4 + 6x^5`) start and end with zero velocity and zero acceleration, so any sum of
them is twice continuously differentiable: the synthetic trajectories built from them give a
well-defined accelerometer and gyroscope signal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["SmoothSignal", "quintic_step"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]


def quintic_step(x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Quintic smooth step and its derivatives with respect to `x`.

    Args:
        x: any shape; values are clipped to [0, 1].

    Returns:
        `(s, ds/dx, d2s/dx2)`, each the shape of `x`; `s` goes from 0 at `x <= 0` to 1 at `x >= 1`.
    """
    x = np.clip(x, 0.0, 1.0)
    s = x**3 * (10.0 - 15.0 * x + 6.0 * x**2)
    ds = 30.0 * x**2 * (1.0 - x) ** 2
    d2s = 60.0 * x * (1.0 - x) * (1.0 - 2.0 * x)
    return s, ds, d2s


@dataclass(frozen=True)
class SmoothSignal:
    """A scalar function of time: offset + sinusoids + quintic steps.

    Attributes:
        offset: value at t = -inf when there are no sinusoids.
        sines: `(amplitude, frequency_hz, phase_rad)` per term: `a * sin(2 pi f t + phase)`.
        steps: `(t_start_s, duration_s, delta)` per term: a quintic ramp adding `delta` over
            `[t_start_s, t_start_s + duration_s]`.
    """

    offset: float = 0.0
    sines: tuple[tuple[float, float, float], ...] = ()
    steps: tuple[tuple[float, float, float], ...] = ()

    def evaluate(self, ts_s: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Value and first two time derivatives.

        Args:
            ts_s: times, seconds, shape `(N,)`.

        Returns:
            `(value, d/dt, d2/dt2)`, each `(N,)`, in the signal's unit per second^k.
        """
        t = np.asarray(ts_s, dtype=np.float64)
        value = np.full(t.shape, self.offset)
        d1 = np.zeros(t.shape)
        d2 = np.zeros(t.shape)
        if self.sines:
            amp, freq, phase = (np.asarray(col)[:, None] for col in zip(*self.sines, strict=True))
            omega = 2.0 * np.pi * freq
            arg = omega * t[None, :] + phase
            value += np.sum(amp * np.sin(arg), axis=0)
            d1 += np.sum(amp * omega * np.cos(arg), axis=0)
            d2 -= np.sum(amp * omega**2 * np.sin(arg), axis=0)
        if self.steps:
            start, duration, delta = (np.asarray(col)[:, None] for col in zip(*self.steps, strict=True))
            s, ds, d2s = quintic_step((t[None, :] - start) / duration)
            value += np.sum(delta * s, axis=0)
            d1 += np.sum(delta * ds / duration, axis=0)
            d2 += np.sum(delta * d2s / duration**2, axis=0)
        return value, d1, d2
