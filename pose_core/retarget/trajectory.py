"""The whole joint trajectory fitted to the tool targets within joint, speed and acceleration limits.

The per-step IK (`pose_core.retarget.arm`) follows each target as it comes, within the speed box of
the step before; what it cannot see is the acceleration a robot needs to follow a target that jitters,
and which of several nearby joint motions costs the tool least. This module fits all steps at once:

    min_q  sum_k rho(|S_k e_k(q_k)|) + eps |q_k - q_ik,k|^2
    s.t.   lower <= q_k <= upper,  |q_k+1 - q_k| <= v dt,  |q_k+1 - 2 q_k + q_k-1| <= a dt^2

with ``e_k`` the tool's pose error against its (kept) target (`pose_core.retarget.orientation`) and
``S_k`` its weights (position over the profile's position tolerance, orientation rows over the
approach tolerance times the profile's row weights); steps without a hand have ``S_k = 0`` and the arm
crosses them smoothly. ``rho`` is Cauchy's loss ``c^2 log(1 + (r / c)^2)`` (``c = robust_scale``
tolerances): a step whose target is far out of reach weighs little, so the arm does not leave the steps
it can reach early to head for it (with squares it did, seconds ahead). Levenberg-Marquardt with
iteratively reweighted rows: each outer iteration linearises ``e_k`` at the current
joints and solves the convex QP (plus a damping term on the step) by ADMM (over-relaxed, warm-started
from the last accepted QP, its penalty adapted to the residuals as OSQP does) on the block-banded system
of all steps (time-major variables, bandwidth 2J: no QP library); a step that lowers the true cost is
taken and the damping divided by 3, else the damping is multiplied by 4. The tool rows are far stiffer
than the limits: with one fixed penalty the QP ended well outside them (0.4 rad on a Panda folded at its
elbow) and the projection below, which does not see the tool, lost it. What ADMM leaves is then
projected onto the limits joint by joint (`project_to_limits`: the nearest
joints in the least-squares sense, a well-conditioned QP the same ADMM solves to the margin in a few
hundred iterations); last, each step is clipped in time order into its speed and acceleration boxes
and a braking box (it can still stop before its joint limits), which moves it by about the
projection's residual (the fit keeps inside a margin, ``margin``, of the limits).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.linalg import cho_solve_banded, cholesky_banded

from pose_core.errors import ShapeError

__all__ = ["TrajectoryOptions", "fit_trajectory", "limit_rows", "project_to_limits"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
#: ``joints (F, J) -> (weighted residuals (F, R), their Jacobians (F, R, J))``: ``S_k e_k`` and its Jacobian
#: (a residual falls as the joints move along ``-J``; `fit_trajectory` linearises ``r(q + d) = r - J d``).
Residuals = Callable[[FloatArray], tuple[FloatArray, FloatArray]]

_RELAXATION = 1.6  # ADMM over-relaxation (1.5-1.8 is the usual range)
_PROJECTION_ROUNDS = 5  # rounds of `projection_iterations` at most, while the limits are not met
_RHO_CHECK = 25  # ADMM iterations between penalty updates
_RHO_CHANGE = 5.0  # the penalty changes when the residuals call for more than this factor either way


@dataclass(frozen=True)
class TrajectoryOptions:
    """Knobs of the trajectory fit."""

    # Levenberg-Marquardt iterations (each one QP over all steps).
    outer_iterations: int = 8
    # Initial damping of a step, relative to the mean diagonal of the linearised tool rows.
    initial_damping: float = 0.01
    # ADMM iterations per QP of the fit.
    admm_iterations: int = 300
    # ADMM iterations of the last projection onto the limits.
    projection_iterations: int = 400
    # Weight of staying at the IK's joints, per rad^2, against a squared weighted tool error of 1 (a
    # position error of one position tolerance): small, it only fixes what the tool does not see.
    joint_weight: float = 1e-2
    # Scale of the Cauchy loss on a step's weighted tool error, in tolerances: errors well beyond it count
    # little (an unreachable target does not pull the arm off the reachable ones).
    robust_scale: float = 3.0
    # The fit aims this fraction inside the speed and acceleration limits, so that ADMM's residual
    # stays within the limits once speeds are clipped exactly.
    margin: float = 0.03

    def __post_init__(self) -> None:
        iterations = (self.outer_iterations, self.admm_iterations, self.projection_iterations)
        if min(iterations) < 1 or self.joint_weight <= 0 or self.robust_scale <= 0:
            raise ValueError("retarget trajectory: iterations >= 1 and joint_weight > 0")
        if not 0.0 <= self.margin < 0.5:
            raise ValueError(f"retarget trajectory: margin must be in [0, 0.5), got {self.margin}")


def limit_rows(frames: int, joints: int, step: FloatArray, accel: FloatArray) -> sparse.csr_matrix:
    """Constraint rows ``A`` over time-major joints ``x[k * J + j]``: positions, steps, second steps.

    Args:
        frames: steps ``F``.
        joints: joints ``J``.
        step: largest step per joint, ``(J,)`` (speed limit times dt).
        accel: largest second step per joint, ``(J,)`` (acceleration limit times dt^2).

    Returns:
        ``(F J + (F-1) J + (F-2) J, F J)``; every step and second-step row has bounds ``[-1, 1]``.
    """
    n = frames * joints
    eye = sparse.identity(n, format="csr")
    d1 = sparse.diags([-1.0, 1.0], [0, joints], shape=((frames - 1) * joints, n))
    d2 = sparse.diags([1.0, -2.0, 1.0], [0, joints, 2 * joints], shape=((frames - 2) * joints, n))
    s1 = sparse.diags(np.tile(1.0 / step, frames - 1))
    s2 = sparse.diags(np.tile(1.0 / accel, frames - 2))
    return sparse.vstack([eye, s1 @ d1, s2 @ d2], format="csr")


def _banded(matrix: sparse.spmatrix, bandwidth: int) -> FloatArray:
    """Upper banded storage ``(bandwidth + 1, n)`` of a symmetric sparse matrix."""
    dia = matrix.todia()
    n = matrix.shape[0]
    out = np.zeros((bandwidth + 1, n))
    for k in range(bandwidth + 1):
        out[bandwidth - k, k:] = dia.diagonal(k)
    return out


def _admm(  # noqa: PLR0913, PLR0917 - the QP, its start and the solver's settings
    hessian: sparse.spmatrix,
    gradient: FloatArray,
    a_mat: sparse.csr_matrix,
    bounds: tuple[FloatArray, FloatArray],
    x0: FloatArray,
    bandwidth: int,
    iterations: int,
    rho: float,
    warm: tuple[FloatArray, FloatArray] | None = None,
) -> tuple[FloatArray, tuple[FloatArray, FloatArray], float]:
    """``min 1/2 x^T H x - g^T x`` s.t. ``lo <= A x <= hi`` by ADMM from penalty ``rho``.

    The penalty adapts as OSQP's does: every `_RHO_CHECK` iterations it is scaled by the square root of
    the ratio of the relative primal to dual residuals (when that is off by more than `_RHO_CHANGE`),
    and the banded factor is rebuilt. With one fixed penalty, a QP whose objective rows are far stiffer
    than its limit rows (the tool rows against the joint limits) ends its iterations well outside the
    limits; the adapted one holds them to about ADMM's tolerance in the same iterations.

    Returns:
        ``x``, the ADMM state ``(z, y)`` (constraint values and their multipliers), which warm-starts a
        QP with the same constraints, and the last penalty.
    """
    lo, hi = bounds
    ata = (a_mat.T @ a_mat).tocsr()
    chol = cholesky_banded(_banded(hessian + rho * ata, bandwidth))
    x = x0.copy()
    if warm is None:
        z, u = np.clip(a_mat @ x, lo, hi), np.zeros(a_mat.shape[0])
    else:
        z, u = warm[0].copy(), warm[1] / rho
    for it in range(1, iterations + 1):
        x = cho_solve_banded((chol, False), gradient + rho * (a_mat.T @ (z - u)))
        ax = a_mat @ x
        relaxed = _RELAXATION * ax + (1.0 - _RELAXATION) * z
        z = np.clip(relaxed + u, lo, hi)
        u += relaxed - z
        if it % _RHO_CHECK or it == iterations:
            continue
        hx, aty = hessian @ x, rho * (a_mat.T @ u)
        primal = np.max(np.abs(ax - z)) / max(np.max(np.abs(ax)), np.max(np.abs(z)), 1e-12)
        dual = np.max(np.abs(hx - gradient + aty)) / max(np.max(np.abs(hx)), np.max(np.abs(aty)),
                                                         np.max(np.abs(gradient)), 1e-12)
        scale = float(np.sqrt(primal / max(dual, 1e-12)))
        if not 1.0 / _RHO_CHANGE <= scale <= _RHO_CHANGE:
            new_rho = float(np.clip(rho * scale, 1e-6, 1e6))
            u *= rho / new_rho
            rho = new_rho
            chol = cholesky_banded(_banded(hessian + rho * ata, bandwidth))
    return x, (z, rho * u), rho


def project_to_limits(  # noqa: PLR0913 - the joints and their limits
    q: FloatArray, dt: float, bounds: tuple[FloatArray, FloatArray], velocity: FloatArray,
    acceleration: FloatArray, opts: TrajectoryOptions,
) -> FloatArray:
    """The joints nearest to ``q (F, J)`` (least squares, joint by joint) within the limits.

    ADMM holds the limits up to its residual, inside ``opts.margin`` (another round of
    ``projection_iterations`` runs, warm, while a joint still breaks its limits, at most 5); last, each
    step is clipped in time order into its speed and acceleration boxes and a braking box that keeps it
    able to stop before its joint limits, so all three limits hold exactly.

    Args:
        q: joints ``(F, J)``.
        dt: step period, seconds.
        bounds: ``(lower, upper)`` joint limits, each ``(J,)``.
        velocity: speed limits ``(J,)``.
        acceleration: acceleration limits ``(J,)`` (``inf``: none).
        opts: margin and iterations.

    Returns:
        ``(F, J)`` within the joint, speed and acceleration limits exactly.
    """
    q = np.asarray(q, np.float64)
    frames, joints = q.shape
    lower, upper = (np.asarray(b, np.float64) for b in bounds)
    if frames >= 3:
        shrink = 1.0 - opts.margin
        accel = np.where(np.isfinite(acceleration), acceleration, 1e6)
        columns = []
        for j in range(joints):
            a_mat = limit_rows(frames, 1, shrink * velocity[j:j + 1] * dt, shrink * accel[j:j + 1] * dt * dt)
            ones = np.ones(2 * frames - 3)
            limits = (np.concatenate([np.full(frames, lower[j]), -ones]),
                      np.concatenate([np.full(frames, upper[j]), ones]))
            x, state, rho = q[:, j], None, 1.0
            for _ in range(_PROJECTION_ROUNDS):  # more rounds, warm-started, while a limit is still broken
                x, state, rho = _admm(sparse.identity(frames, format="csr"), q[:, j], a_mat, limits, x, 2,
                                      opts.projection_iterations, rho, state)
                if np.all(np.abs(a_mat[frames:] @ x) <= 1.0 / shrink):
                    break
            columns.append(x)
        q = np.stack(columns, axis=1)
    return _clip_forward(np.clip(q, lower, upper), dt, (lower, upper), velocity, acceleration)


def _braking_step(room: FloatArray, turn: FloatArray) -> FloatArray:
    """The largest step ``s`` towards a limit ``room`` away after which the joint can still stop before it.

    Braking by at most ``turn`` per step, the steps ``s, s - turn, s - 2 turn, ...`` (while positive)
    must add up to no more than ``room``: with ``n`` whole decrements that sum is
    ``(n + 1) s - turn n (n + 1) / 2``, so ``n`` is the largest with ``turn n (n + 1) / 2 <= room`` and
    ``s = room / (n + 1) + turn n / 2``.
    All arrays ``(J,)``; ``turn`` inf (no acceleration limit) gives ``room``.
    """
    room = np.maximum(room, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.floor((np.sqrt(1.0 + 8.0 * room / turn) - 1.0) / 2.0)
        step = room / (n + 1.0) + turn * n / 2.0
    return np.where(np.isfinite(turn), step, room)


def _clip_forward(q: FloatArray, dt: float, bounds: tuple[FloatArray, FloatArray], velocity: FloatArray,
                  acceleration: FloatArray) -> FloatArray:
    """Each step ``(F, J)`` clipped, in time order, into its speed, acceleration and braking boxes.

    A no-op where ADMM converged inside the margin; elsewhere it moves a step by about ADMM's residual.
    The braking box keeps every step one from which the joint can stop before its limits
    (`_braking_step`), so the acceleration box (around the constant-velocity prediction) always meets
    it: joint, speed and acceleration limits all hold exactly.
    """
    q = q.copy()
    lower, upper = bounds
    step, turn = velocity * dt, np.where(np.isfinite(acceleration), acceleration, np.inf) * dt * dt
    for k in range(1, len(q)):
        lo = np.maximum(q[k - 1] - step, q[k - 1] - _braking_step(q[k - 1] - lower, turn))
        hi = np.minimum(q[k - 1] + step, q[k - 1] + _braking_step(upper - q[k - 1], turn))
        if k >= 2:
            predicted = 2.0 * q[k - 1] - q[k - 2]
            lo, hi = np.maximum(lo, predicted - turn), np.minimum(hi, predicted + turn)
        q[k] = np.clip(np.clip(q[k], lo, np.maximum(lo, hi)), lower, upper)  # the last: rounding at a limit
    return q


def _cost(residuals: Residuals, q: FloatArray, q_ik: FloatArray, opts: TrajectoryOptions) -> float:
    r, _ = residuals(q)
    c2 = opts.robust_scale**2
    tool = c2 * np.sum(np.log1p(np.sum(r * r, axis=1) / c2))
    return float(tool + opts.joint_weight * np.sum((q - q_ik) ** 2))


def fit_trajectory(  # noqa: PLR0913 - the residuals, the start and the limits
    residuals: Residuals,
    q_ik: FloatArray,
    dt: float,
    bounds: tuple[FloatArray, FloatArray],
    velocity: FloatArray,
    acceleration: FloatArray,
    opts: TrajectoryOptions,
) -> FloatArray:
    """Joints of all steps fitted to the tool targets within the limits (see the module's docstring).

    Args:
        residuals: weighted tool residuals and their Jacobians at given joints.
        q_ik: the per-step IK's joints ``(F, J)``, within the joint limits: the start and the regulariser.
        dt: step period, seconds.
        bounds: ``(lower, upper)`` joint limits, each ``(J,)``.
        velocity: speed limits, units/s, ``(J,)``.
        acceleration: acceleration limits, units/s^2, ``(J,)`` (``inf``: none).
        opts: iterations, weights and margin.

    Returns:
        ``q (F, J)``: within the joint, speed and acceleration limits exactly (`project_to_limits`).

    Raises:
        ShapeError: if ``q_ik`` is not ``(F, J)`` with ``J`` the limits' length.
    """
    q_ik = np.asarray(q_ik, np.float64)
    lower, upper = (np.asarray(b, np.float64) for b in bounds)
    if q_ik.ndim != 2 or q_ik.shape[1] != len(lower):
        raise ShapeError("q_ik", q_ik.shape, f"(F, {len(lower)})")
    frames, joints = q_ik.shape
    if frames < 3:
        return np.clip(q_ik, lower, upper)
    shrink = 1.0 - opts.margin
    step = shrink * velocity * dt
    accel = shrink * np.where(np.isfinite(acceleration), acceleration, 1e6) * dt * dt
    a_mat = limit_rows(frames, joints, step, accel)
    ones = np.ones((frames - 1) * joints + (frames - 2) * joints)
    lo = np.concatenate([np.tile(lower, frames), -ones])
    hi = np.concatenate([np.tile(upper, frames), ones])
    bandwidth = 2 * joints
    q = np.clip(q_ik, lower, upper)
    cost, damping = np.inf, None  # the first QP's solution is taken as it is (the IK's may break limits)
    rho, warm = None, None
    for _ in range(opts.outer_iterations):
        r, jac = residuals(q)  # (F, R), (F, R, J)
        root = np.sqrt(1.0 / (1.0 + np.sum(r * r, axis=1) / opts.robust_scale**2))  # IRLS weights of Cauchy
        r, jac = r * root[:, None], jac * root[:, None, None]
        blocks = np.einsum("frj,frk->fjk", jac, jac)
        if damping is None:
            damping = opts.initial_damping * float(np.mean(np.trace(blocks, axis1=1, axis2=2))) / joints
        step_weight = opts.joint_weight + (0.0 if np.isinf(cost) else damping)
        gradient = (np.einsum("frj,fr->fj", jac, r + np.einsum("frj,fj->fr", jac, q))
                    + opts.joint_weight * q_ik + (step_weight - opts.joint_weight) * q).ravel()
        hessian = sparse.block_diag(list(blocks + step_weight * np.eye(joints)), format="csr")
        if rho is None:  # the first penalty; then each QP starts from the last one's penalty and state
            rho = float(np.mean(hessian.diagonal()) / np.mean((a_mat.T @ a_mat).diagonal()))
        x, state, new_rho = _admm(hessian, gradient, a_mat, (lo, hi), q.ravel(), bandwidth,
                                  opts.admm_iterations, rho, warm)
        candidate = x.reshape(frames, joints)
        new_cost = _cost(residuals, candidate, q_ik, opts)
        if new_cost < cost:  # Levenberg-Marquardt: accept and trust the linearisation more
            q, cost, warm, rho, damping = candidate, new_cost, state, new_rho, damping / 3.0
        else:
            damping *= 4.0
    return project_to_limits(q, dt, bounds, velocity, acceleration, opts)
