"""Metric scale of a monocular camera trajectory from an IMU.

Monocular tracking gives camera positions in arbitrary map units; an accelerometer measures metric
specific force. Over a window both sides see the same motion: with `k` map units per metre,

    A(t) = k * (R(t) (f(t) - b) + g)''-filtered,

where `A` is the visual acceleration (second derivative of the camera positions, units/s^2), `R`
the camera's `world_from_cam` rotation, `f` the specific force in the camera frame, `g` gravity in
the (visual) world frame and `b` the accelerometer's bias in the camera frame (measured = true + b).

How (`scale_from_imu`):

1. **Clock.** IMU times are on the video's clock (docs/INPUTS.md); a residual offset up to
   `max_time_offset_s` is found by correlating the gyroscope's rotation per frame interval with the
   camera poses' (rotation is scale free), refined to sub-sample precision, and applied.
2. **Matched filtering.** The world-frame specific force `R f` (rotations slerped from the camera
   poses at the IMU times) is integrated twice into a pseudo-position `q(t)`; the camera positions
   `p` and `q` are sampled at the same frame times and both get the same Savitzky-Golay second
   derivative. The filter removes constant and linear terms, so `q`'s unknown initial velocity and
   position drop out, and both sides see exactly the same band of the motion.
3. **Linear solve.** `A = k B + c - D'' (k b)` (`B = q''`, `D` the double integral of `R`, `c = k g`),
   least squares with the visual side as the noisy one: regressing the noisy visual acceleration on
   the clean IMU side keeps the scale unbiased (the other way round, position noise would shrink it).
4. **|g| refinement.** `g = gravity_m_s2 * unit vector`, nonlinear least squares over `k`, the
   gravity direction and (optionally, with a Gaussian prior) the bias.
5. **Refusal.** No answer (``metres_per_unit = None`` with a reason) when the motion is not exciting
   enough (RMS filtered metric acceleration below `min_excitation_m_s2`: a static or purely
   rotating camera), when the scale's relative standard error is above `max_rel_std`, or when too
   few frames remain. The standard error is inflated by the filter window (neighbouring residuals
   are correlated), so it is conservative.

Not modelled: the IMU-camera lever arm (the IMU is taken at the camera centre; a few cm add
`w x (w x r)` terms during fast turns), accelerometer scale-factor errors and a time-varying bias.

Convention:
    `world_from_cam` `(F, 4, 4)` maps camera coordinates to world coordinates, translation in map
    units; the IMU frame is the camera frame (OpenCV: x right, y down, z forward). Specific force is
    `R_cam_from_world (a_world - g_world)`, so a camera at rest reads `+|g|` along world up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.integrate import cumulative_trapezoid
from scipy.optimize import least_squares
from scipy.signal import savgol_coeffs

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import so3_exp, so3_log

__all__ = ["ImuScale", "ImuScaleOptions", "estimate_time_offset", "scale_from_imu"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# Below this gyro/camera rotation-rate correlation the clock offset is not trusted (left at 0).
_MIN_OFFSET_CORRELATION = 0.5


@dataclass(frozen=True)
class ImuScaleOptions:
    """Settings of the IMU scale estimate."""

    # Use the IMU sidecar, when an episode has one, as a metric scale source.
    enabled: bool = True
    # Savitzky-Golay window of the (matched) second derivative, seconds (longer: less tracking noise,
    # less motion seen; 0.8 s keeps walking and head sway).
    window_s: float = 0.8
    # Polynomial order of that filter (>= 2).
    poly_order: int = 2
    # Largest IMU-to-video clock offset searched by gyro/camera rotation correlation, seconds (0: none).
    max_time_offset_s: float = 0.1
    # Prior standard deviation of a constant accelerometer bias (camera frame), m/s^2; 0: no bias estimated.
    accel_bias_prior_m_s2: float = 0.2
    # Gravity magnitude, m/s^2.
    gravity_m_s2: float = 9.81
    # Refuse when the RMS filtered metric acceleration is below this, m/s^2 (static or rotating camera).
    min_excitation_m_s2: float = 0.15
    # Refuse when the scale's relative standard error (conservative, see module doc) is above this.
    max_rel_std: float = 0.025
    # Refuse with fewer frames than this after the filter's edges are dropped.
    min_frames: int = 30
    # A frame interval longer than this multiple of the median interval splits the trajectory.
    max_gap_factor: float = 1.5

    def __post_init__(self) -> None:
        problems = []
        if self.window_s <= 0 or self.poly_order < 2:
            problems.append(
                f"window_s must be > 0 and poly_order >= 2, got {self.window_s}, {self.poly_order}"
            )
        if self.max_time_offset_s < 0 or self.accel_bias_prior_m_s2 < 0 or self.gravity_m_s2 <= 0:
            problems.append("max_time_offset_s and accel_bias_prior_m_s2 must be >= 0, gravity_m_s2 > 0")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class ImuScale:
    """The IMU's answer for one trajectory.

    Attributes:
        metres_per_unit: metres per map unit; None when refused (see `reason`).
        gravity_world: unit vector of gravity (pointing down) in the world frame, `(3,)`; None when
            not estimated. Known also when the scale is refused for weak motion.
        accel_bias: estimated accelerometer bias, camera frame, m/s^2, `(3,)` (zeros when not estimated).
        time_offset_s: offset added to the IMU times to put them on the camera clock, seconds.
        excitation_m_s2: RMS of the filtered metric acceleration, m/s^2.
        rel_std: conservative relative standard error of the scale.
        residual_rms_m_s2: RMS of the fit residual, m/s^2.
        frames_used: frames that gave equations.
        reason: why the scale was refused; None when it was not.
    """

    metres_per_unit: float | None
    gravity_world: FloatArray | None
    accel_bias: FloatArray
    time_offset_s: float
    excitation_m_s2: float
    rel_std: float
    residual_rms_m_s2: float
    frames_used: int
    reason: str | None


def _refused(
    reason: str, offset: float = 0.0, frames: int = 0, gravity_world: FloatArray | None = None,
    excitation_m_s2: float = 0.0,
) -> ImuScale:  # fmt: skip
    """A refusal before the fit: no scale and no bias; gravity where the mean force already gives it."""
    logger.info("IMU scale refused: %s", reason)
    return ImuScale(
        metres_per_unit=None, gravity_world=gravity_world, accel_bias=np.zeros(3), time_offset_s=offset,
        excitation_m_s2=excitation_m_s2, rel_std=float("inf"), residual_rms_m_s2=float("nan"),
        frames_used=frames, reason=reason,
    )  # fmt: skip


def _slerp_rotations(ts_cam: FloatArray, rot: FloatArray, ts: FloatArray) -> FloatArray:
    """Camera rotations `(F, 3, 3)` at times `ts` `(M,)` inside `[ts_cam[0], ts_cam[-1]]`, `(M, 3, 3)`."""
    k = np.clip(np.searchsorted(ts_cam, ts, side="right") - 1, 0, len(ts_cam) - 2)
    alpha = (ts - ts_cam[k]) / (ts_cam[k + 1] - ts_cam[k])
    delta = so3_log(rot[1:] @ np.swapaxes(rot[:-1], 1, 2))
    return so3_exp(alpha[:, None] * delta[k]) @ rot[k]


def estimate_time_offset(
    ts_cam: FloatArray, rot: FloatArray, imu_ts: FloatArray, gyro: FloatArray, max_offset_s: float
) -> float:
    """Offset to add to IMU times so the gyroscope's rotation matches the camera poses'.

    The rotation angle between consecutive frames (camera poses) is compared with the gyroscope's
    integrated rotation over the same interval at each candidate offset; the offset with the highest
    correlation wins, refined by a parabola through its neighbours.

    Args:
        ts_cam: frame times, seconds, `(F,)` increasing.
        rot: `world_from_cam` rotations, `(F, 3, 3)`.
        imu_ts: IMU times, seconds, `(M,)` increasing.
        gyro: angular velocity, camera frame, rad/s, `(M, 3)`.
        max_offset_s: search range +-, seconds; 0 returns 0.

    Returns:
        The offset, seconds (0 when the rotation rates correlate less than 0.5 at every offset, e.g.
        a camera that barely rotates: nothing to align).
    """
    if max_offset_s <= 0 or len(ts_cam) < 3:
        return 0.0
    dt = np.diff(ts_cam)
    visual = np.linalg.norm(so3_log(np.swapaxes(rot[:-1], 1, 2) @ rot[1:]), axis=1) / dt
    if np.std(visual) < 1e-3:
        return 0.0
    integral = cumulative_trapezoid(gyro, imu_ts, axis=0, initial=0.0)
    step = max(float(np.median(np.diff(imu_ts))) / 2.0, 1e-4)
    offsets = np.arange(-max_offset_s, max_offset_s + step / 2, step)
    corr = np.full(len(offsets), -np.inf)
    for i, off in enumerate(offsets):
        t0, t1 = ts_cam[:-1] - off, ts_cam[1:] - off
        inside = (t0 >= imu_ts[0]) & (t1 <= imu_ts[-1])
        if inside.sum() < 3:
            continue
        moved = np.stack(
            [np.interp(t1[inside], imu_ts, c) - np.interp(t0[inside], imu_ts, c) for c in integral.T]
        )
        rate = np.linalg.norm(moved, axis=0) / dt[inside]
        if np.std(rate) > 0:
            corr[i] = np.corrcoef(rate, visual[inside])[0, 1]
    best = int(np.argmax(corr))
    if not corr[best] >= _MIN_OFFSET_CORRELATION:
        return 0.0
    offset = float(offsets[best])
    if 0 < best < len(offsets) - 1 and np.isfinite(corr[best - 1 : best + 2]).all():
        lo, mid, hi = corr[best - 1 : best + 2]
        curvature = lo - 2 * mid + hi
        if curvature < 0:
            offset += step * 0.5 * (lo - hi) / curvature
    return offset


def _segments(ts_cam: FloatArray, valid: NDArray[np.bool_], max_gap_factor: float) -> list[NDArray[np.intp]]:
    """Frame indices of each run of valid frames with no gap over `max_gap_factor` median intervals."""
    h = np.median(np.diff(ts_cam))
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return []
    cuts = np.flatnonzero((np.diff(idx) > 1) | (np.diff(ts_cam[idx]) > max_gap_factor * h)) + 1
    return np.split(idx, cuts)


def _filtered_rows(
    ts_cam: FloatArray,
    pos: FloatArray,
    valid: NDArray[np.bool_],
    imu_t: FloatArray,
    q: FloatArray,
    opts: ImuScaleOptions,
) -> tuple[FloatArray, FloatArray, int]:
    """Matched second derivatives of the camera positions and the IMU pseudo-positions.

    Args:
        ts_cam: frame times, seconds, `(F,)`.
        pos: camera positions, map units, `(F, 3)`.
        valid: frames whose position was measured, `(F,)` bool.
        imu_t: IMU times on the camera clock, seconds, `(M,)`.
        q: doubly integrated IMU quantities, `(M, C)`.
        opts: filter window and order, gap rule.

    Returns:
        (visual accelerations `(N, 3)`, filtered `q` `(N, C)`, N) over frames whose whole window lies
        inside one segment and inside the IMU's span.
    """
    h = float(np.median(np.diff(ts_cam)))
    half = max(int(round(opts.window_s / h / 2.0)), (opts.poly_order + 1) // 2)
    coeffs = savgol_coeffs(2 * half + 1, opts.poly_order, deriv=2, delta=h, use="dot")
    vis, imu = [], []
    for seg in _segments(ts_cam, valid, opts.max_gap_factor):
        t = ts_cam[seg]
        if len(t) < 2 * half + 1:
            continue
        grid = t[0] + h * np.arange(int(round((t[-1] - t[0]) / h)) + 1)
        grid = grid[(grid >= imu_t[0]) & (grid <= imu_t[-1])]
        if len(grid) < 2 * half + 1:
            continue
        p = np.stack([np.interp(grid, t, c) for c in pos[seg].T], axis=1)
        qq = np.stack([np.interp(grid, imu_t, c) for c in q.T], axis=1)
        windows = np.lib.stride_tricks.sliding_window_view(np.arange(len(grid)), 2 * half + 1)
        vis.append(np.einsum("w,nwc->nc", coeffs, p[windows]))
        imu.append(np.einsum("w,nwc->nc", coeffs, qq[windows]))
    if not vis:
        return np.zeros((0, 3)), np.zeros((0, q.shape[1])), 2 * half + 1
    return np.concatenate(vis), np.concatenate(imu), 2 * half + 1


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _tangent_basis(u: FloatArray) -> FloatArray:
    """Two unit vectors orthogonal to unit `u` and each other, `(2, 3)`."""
    helper = np.eye(3)[int(np.argmin(np.abs(u)))]
    e1 = _unit(np.cross(u, helper))
    return np.stack([e1, np.cross(u, e1)])


def scale_from_imu(
    ts_cam: FloatArray,
    world_from_cam: FloatArray,
    imu_ts: FloatArray,
    accel: FloatArray,
    gyro: FloatArray,
    opts: ImuScaleOptions | None = None,
    position_valid: NDArray[np.bool_] | None = None,
) -> ImuScale:
    """Metres per map unit of a monocular trajectory, gravity in its world frame, from an IMU.

    Args:
        ts_cam: frame times, seconds, `(F,)` strictly increasing.
        world_from_cam: camera poses, translation in map units, `(F, 4, 4)`.
        imu_ts: IMU sample times on the video's clock, seconds, `(M,)` strictly increasing.
        accel: specific force, camera frame, m/s^2, `(M, 3)`.
        gyro: angular velocity, camera frame, rad/s, `(M, 3)` (used to align the clocks).
        opts: settings.
        position_valid: frames whose camera position was measured, `(F,)` bool; None: all. Frames
            with a held or interpolated centre (pose quality rotation_only / interpolated) must be
            left out: their zero acceleration contradicts the IMU and biases the scale (on the
            synthetic sample, 60 static-held frames of 240 made it 10-24 % too large).

    Returns:
        The estimate; `metres_per_unit` is None with a `reason` when it is refused.

    Raises:
        ShapeError: if the arrays do not have the documented shapes.

    Example:
        >>> r = scale_from_imu(np.arange(3.0), np.tile(np.eye(4), (3, 1, 1)), np.arange(3.0),
        ...                    np.zeros((3, 3)), np.zeros((3, 3)))
        >>> r.metres_per_unit is None
        True
    """
    opts = opts or ImuScaleOptions()
    n, m = len(ts_cam), len(imu_ts)
    if ts_cam.shape != (n,) or world_from_cam.shape != (n, 4, 4):
        raise ShapeError("ts_cam / world_from_cam", world_from_cam.shape, f"({n},) and ({n}, 4, 4)")
    if imu_ts.shape != (m,) or accel.shape != (m, 3) or gyro.shape != (m, 3):
        raise ShapeError("imu_ts / accel / gyro", accel.shape, f"({m},), ({m}, 3), ({m}, 3)")
    if not (np.isfinite(ts_cam).all() and np.isfinite(world_from_cam).all() and np.isfinite(accel).all()):
        return _refused("non-finite frame times, camera poses or accelerometer samples")
    valid = np.ones(n, bool) if position_valid is None else np.asarray(position_valid, bool)
    if valid.shape != (n,):
        raise ShapeError("position_valid", valid.shape, f"({n},)")
    if n < opts.min_frames or m < 2:
        return _refused(f"{n} frames and {m} IMU samples are too few (need {opts.min_frames} frames)")
    rot, pos = world_from_cam[:, :3, :3], world_from_cam[:, :3, 3]
    offset = estimate_time_offset(ts_cam, rot, imu_ts, gyro, opts.max_time_offset_s)
    imu_t = imu_ts + offset
    inside = (imu_t >= ts_cam[0]) & (imu_t <= ts_cam[-1])
    if inside.sum() < 2:
        return _refused("the IMU does not overlap the video's frame times", offset)
    imu_t = imu_t[inside]
    rot_imu = _slerp_rotations(ts_cam, rot, imu_t)
    # Doubly integrated world specific force (3) and rotation (9, for the bias term).
    signal = np.concatenate([np.einsum("mij,mj->mi", rot_imu, accel[inside]), rot_imu.reshape(-1, 9)], axis=1)
    q = cumulative_trapezoid(
        cumulative_trapezoid(signal, imu_t, axis=0, initial=0.0), imu_t, axis=0, initial=0.0
    )
    vis, filt, window = _filtered_rows(ts_cam, pos, valid, imu_t, q, opts)
    if len(vis) < opts.min_frames:
        return _refused(
            f"only {len(vis)} frames have a full {window}-frame window inside the IMU's span", offset
        )
    return _solve(vis, filt[:, :3], filt[:, 3:].reshape(-1, 3, 3), offset, window, opts)


def _solve(
    vis: FloatArray, force: FloatArray, rot_dd: FloatArray, offset: float, window: int, opts: ImuScaleOptions
) -> ImuScale:
    """Fit `vis = k (force + g - rot_dd b)` with |g| fixed; see the module doc (steps 3-5).

    Args:
        vis: visual accelerations, units/s^2, `(N, 3)`.
        force: filtered world specific force, m/s^2, `(N, 3)`.
        rot_dd: filtered doubly integrated rotations (the bias's coefficients), `(N, 3, 3)`.
        offset: the clock offset used, seconds (reported).
        window: filter length, frames (inflates the standard error for correlated residuals).
        opts: thresholds, gravity, bias prior.
    """
    n = len(vis)
    # Motion acceleration seen by the IMU alone (world frame, gravity is the constant part): k-free.
    excitation = float(np.sqrt(np.mean(np.sum((force - force.mean(axis=0)) ** 2, axis=1))))
    if excitation < opts.min_excitation_m_s2:
        return _refused(
            f"motion not exciting enough: RMS acceleration {excitation:.3f} m/s^2 < "
            f"{opts.min_excitation_m_s2} m/s^2", offset, n, gravity_world=_unit(-force.mean(axis=0)),
            excitation_m_s2=excitation,
        )  # fmt: skip
    with_bias = opts.accel_bias_prior_m_s2 > 0
    # Linear: vis = k force + c (- rot_dd d), unknowns k, c = k g (, d = k b).
    design = [force.reshape(-1, 1), np.tile(np.eye(3), (n, 1))]
    if with_bias:
        design.append(-rot_dd.reshape(-1, 3))
    x, *_ = np.linalg.lstsq(np.concatenate(design, axis=1), vis.ravel(), rcond=None)
    k0 = float(x[0])
    gravity0 = x[1:4] / k0 if k0 != 0 else -force.mean(axis=0)
    if not np.isfinite(gravity0).all() or np.linalg.norm(gravity0) == 0:
        gravity0 = -force.mean(axis=0)
    u0 = _unit(gravity0)
    basis = _tangent_basis(u0)
    sigma = max(float(np.sqrt(np.mean((np.concatenate(design, axis=1) @ x - vis.ravel()) ** 2))), 1e-12)

    def unpack(p: FloatArray) -> tuple[float, FloatArray, FloatArray]:
        g = opts.gravity_m_s2 * _unit(u0 + p[1:3] @ basis)
        return float(p[0]), g, (p[3:6] if with_bias else np.zeros(3))

    def residual(p: FloatArray) -> FloatArray:
        k, g, b = unpack(p)
        pred = k * (force + g - rot_dd @ b)
        res = ((pred - vis) / sigma).ravel()
        return np.concatenate([res, b / opts.accel_bias_prior_m_s2]) if with_bias else res

    bias0 = (x[4:7] / k0 if k0 != 0 else np.zeros(3)) if with_bias else np.zeros(0)
    start = np.concatenate([[abs(k0) if k0 != 0 else 1.0], [0.0, 0.0], bias0])
    fit = least_squares(residual, start, method="lm" if len(start) <= 3 * n else "trf")
    k, g, b = unpack(fit.x)
    data = fit.fun[: 3 * n] * sigma
    noise = max(float(np.sqrt(np.sum(data**2) / max(3 * n - len(fit.x), 1))), 1e-12)
    # Information of the data rows (whitened by the fitted noise, divided by the window: residuals are
    # correlated over it, so this is conservative) plus that of the bias prior rows.
    jac_data, jac_prior = fit.jac[: 3 * n] * sigma / noise, fit.jac[3 * n :]
    cov = np.linalg.pinv(jac_data.T @ jac_data / window + jac_prior.T @ jac_prior)
    rel_std = float(np.sqrt(max(cov[0, 0], 0.0)) / abs(k)) if k != 0 else float("inf")
    fitted = ImuScale(
        metres_per_unit=None, gravity_world=_unit(g), accel_bias=b, time_offset_s=offset,
        excitation_m_s2=excitation, rel_std=rel_std,
        residual_rms_m_s2=float(np.sqrt(np.mean(data**2)) / abs(k)) if k else float("inf"), frames_used=n,
        reason=None,
    )  # fmt: skip
    logger.debug("IMU scale fit: k=%.4g units/m, %s", k, fitted)
    if k <= 0 or rel_std > opts.max_rel_std:
        reason = f"scale uncertain: {k:.4g} units/m, relative std {rel_std:.3f} > {opts.max_rel_std}"
        logger.info("IMU scale refused: %s", reason)
        return replace(fitted, reason=reason)
    return replace(fitted, metres_per_unit=1.0 / k)
