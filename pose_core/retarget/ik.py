"""Batched damped-least-squares inverse kinematics with box bounds and a position-first priority.

Convention:
    Targets are ``base_from_target (B, 4, 4)`` in the robot base frame, metres. The pose error of a
    link is ``e_p = p_target - p_link`` (metres, base frame) and ``e_r = log(R_target @ R_link^T)``
    (radians, rotation vector in the base frame), matching the Jacobian rows of
    `pose_core.retarget.kinematics`. Position is the primary task; orientation is solved in the
    null space of the position task, so an arm with fewer than 6 joints (SO-100/101: 5) follows
    the position and gets the closest orientation it can, in the least-squares sense of ``e_r``.
    Bounds ``lower <= q <= upper`` are per batch row: joint limits intersected with a velocity box.
    Each step solves the position task first, clamping the joints that would cross a bound and
    re-solving for the rest (a small active-set loop); the orientation task then moves only the joints
    left free, in the position task's null space, dropping any it would push out of the box (so it
    never takes a joint the position needs), then the step is scaled to ``max_step``; the result
    never leaves the box. With an ``orientation`` task (`OrientationTask`) the rotation error is taken
    against the *kept* target of each iteration (what the profile keeps of the hand's orientation,
    `pose_core.retarget.orientation`) and its rows are weighted per axis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import skew
from pose_core.retarget.kinematics import KinematicModel

__all__ = [
    "IKOptions",
    "IKSolution",
    "OrientationTask",
    "bounded_dls_step",
    "pose_errors",
    "solve_pose_ik",
    "tool_pose_and_jacobian",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
#: ``(poses of the model's frames (B, L, 4, 4), tool poses (B, 4, 4), targets (B, 4, 4)) ->
#: (kept targets (B, 4, 4), orientation row weights (B, 3, 3))``.
OrientationTask = Callable[[FloatArray, FloatArray, FloatArray], tuple[FloatArray, FloatArray]]

_SIN_EPS = 1e-9  # below this |sin(angle)| the rotation axis comes from R + I instead


@dataclass(frozen=True)
class IKOptions:
    """Knobs of the DLS solver."""

    # Most DLS iterations per solve.
    max_iters: int = 40
    # Damping of the position task, metres (Tikhonov lambda); small: targets are mostly reachable.
    position_damping_m: float = 1e-3
    # Damping of the orientation task, radians; larger, because a 5-DoF arm has a null direction there.
    orientation_damping_rad: float = 1e-2
    # Largest change of any joint in one iteration, rad or m (a trust region).
    max_step: float = 0.3
    # A solve stops when every row is within this position error and orientation_tol_rad (or has
    # stopped moving, see step_tol), metres.
    position_tol_m: float = 1e-4
    # The orientation error a solve stops within, radians.
    orientation_tol_rad: float = 1e-3
    # A row whose largest joint step falls below this counts as settled (orientation out of reach).
    step_tol: float = 1e-6
    # A row also counts as settled when an iteration brought neither its position error down by this
    # fraction of position_tol_m nor its orientation error by this fraction of orientation_tol_rad: a
    # target out of reach, or an orientation a 5-DoF arm cannot take. Its tasks settle within a few
    # iterations; the rest only drift in their null space (the posture pull) at the full iteration cost.
    # 0: off. Not with a `toward` task, whose progress is in the null space.
    stall_fraction: float = 0.1
    # Largest change of any joint per iteration from the secondary (orientation) task, rad or m: its
    # null-space motion keeps the position only to first order, so long strides make the two tasks
    # take turns (a limit cycle) instead of converging.
    max_secondary_step: float = 0.05
    # Re-solves per step after clamping joints that would cross a bound.
    active_set_passes: int = 3
    # Fraction of the way to the posture (home) taken per iteration in the null space of both tasks;
    # it keeps a redundant arm's elbow sensible and moves a stretched-out arm off its singularity.
    posture_gain: float = 0.05


@dataclass(frozen=True)
class IKSolution:
    """Result of a batched IK solve.

    Attributes:
        joint_positions: solution, rad or m, ``(B, J)``; always inside the bounds.
        position_error_m: distance to the target position, ``(B,)``.
        orientation_error_rad: geodesic angle to the (kept) target rotation, ``(B,)``.
        iterations: iterations run.
        converged: rows within both tolerances, ``(B,)``.
        base_from_tool: the tool poses reached, ``(B, 4, 4)``.
        base_from_kept: the targets as kept by the orientation task (the targets without one), ``(B, 4, 4)``.
    """

    joint_positions: FloatArray
    position_error_m: FloatArray
    orientation_error_rad: FloatArray
    iterations: int
    converged: BoolArray
    base_from_tool: FloatArray
    base_from_kept: FloatArray


def pose_errors(base_from_link: FloatArray, base_from_target: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Position and rotation errors that take a link to its target.

    Args:
        base_from_link: current poses, ``(..., 4, 4)``.
        base_from_target: target poses, ``(..., 4, 4)``.

    Returns:
        ``e_p`` metres ``(..., 3)`` and ``e_r`` rotation vector, radians ``(..., 3)``, both in the base frame;
        ``|e_r|`` is the geodesic angle in ``[0, pi]``.
    """
    e_p = base_from_target[..., :3, 3] - base_from_link[..., :3, 3]
    r = base_from_target[..., :3, :3] @ np.swapaxes(base_from_link[..., :3, :3], -1, -2)
    vee = 0.5 * np.stack([r[..., 2, 1] - r[..., 1, 2], r[..., 0, 2] - r[..., 2, 0],
                          r[..., 1, 0] - r[..., 0, 1]], axis=-1)
    sin_a = np.linalg.norm(vee, axis=-1)
    cos_a = 0.5 * (np.trace(r, axis1=-2, axis2=-1) - 1.0)
    angle = np.arctan2(sin_a, cos_a)
    axis = vee / np.maximum(sin_a, _SIN_EPS)[..., None]
    near_pi = (sin_a < _SIN_EPS) & (cos_a < 0.0)
    if np.any(near_pi):
        sym = r[near_pi] + np.eye(3)
        cols = np.take_along_axis(sym, np.argmax(np.linalg.norm(sym, axis=-2), axis=-1)[:, None, None]
                                  .repeat(3, axis=-2), axis=-1)[..., 0]
        axis[near_pi] = cols / np.linalg.norm(cols, axis=-1, keepdims=True)
    small = sin_a < _SIN_EPS
    e_r = np.where(small[..., None] & ~near_pi[..., None], vee, axis * angle[..., None])
    return e_p, e_r


def _damped_pinv(jac: FloatArray, damping: float) -> FloatArray:
    """``J^T (J J^T + lambda^2 I)^-1``, ``(B, J, M)`` for ``jac (B, M, J)``."""
    gram = jac @ np.swapaxes(jac, -1, -2) + damping**2 * np.eye(jac.shape[-2])
    solved = _solve_spd3(gram, jac) if gram.shape[-1] == 3 else np.linalg.solve(gram, jac)
    return np.swapaxes(solved, -1, -2)


def _solve_spd3(gram: FloatArray, rhs: FloatArray) -> FloatArray:
    """``gram^-1 rhs`` for symmetric positive definite ``gram (B, 3, 3)`` and ``rhs (B, 3, K)``.

    The adjugate over the determinant: the position task's Gram matrices (most of IK's solves) in closed
    form, about 6x faster than `np.linalg.solve`'s per-matrix LU on a batch.
    """
    a, b, c = gram[:, 0, 0], gram[:, 0, 1], gram[:, 0, 2]
    d, e, f = gram[:, 1, 1], gram[:, 1, 2], gram[:, 2, 2]
    c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
    c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
    det = a * c00 + b * c01 + c * c02
    adjugate = np.stack([c00, c01, c02, c01, c11, c12, c02, c12, c22], axis=-1).reshape(-1, 3, 3)
    result: FloatArray = (adjugate / det[:, None, None]) @ rhs
    return result


def _inside(q: FloatArray, dq: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """Largest ``a`` in ``[0, 1]`` per row with ``lower <= q + a dq <= upper``, ``(B, 1)`` (``q`` inside)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(dq > 0, (upper - q) / dq, np.where(dq < 0, (lower - q) / dq, np.inf))
    return np.clip(np.min(room, axis=1, keepdims=True), 0.0, 1.0)


def _primary_step(jac: FloatArray, err: FloatArray, q: FloatArray, bounds: tuple[FloatArray, FloatArray],
                  opts: IKOptions) -> tuple[FloatArray, NDArray[np.bool_]]:
    """DLS step of the primary task with an active set: ``(dq (B, J), joints left free (B, J))``."""
    lower, upper = bounds
    free = np.ones(q.shape, dtype=bool)
    fixed = np.zeros_like(q)
    dq = fixed
    for _ in range(opts.active_set_passes + 1):
        jp = jac * free[:, None, :]
        dq = np.where(free, np.einsum("bjm,bm->bj", _damped_pinv(jp, opts.position_damping_m),
                                      err - np.einsum("bmj,bj->bm", jac, fixed)), fixed)
        over = free & ((q + dq < lower) | (q + dq > upper))
        if not np.any(over):
            break
        fixed = np.where(over, np.clip(q + dq, lower, upper) - q, fixed)
        free &= ~over
    return np.clip(q + dq, lower, upper) - q, free


def _null_step(tasks: FloatArray, jac: FloatArray, err: FloatArray, q: FloatArray,
               bounds: tuple[FloatArray, FloatArray], free: NDArray[np.bool_], opts: IKOptions) -> FloatArray:
    """A step of a lower task ``(jac (B, S, J), err (B, S))`` in the null space of ``tasks (B, M, J)``.

    Only joints in ``free`` move; a joint the step would push out of the box leaves the free set and the step
    is recomputed, so the higher tasks keep their joints; what still crosses is scaled back into the box.
    The step is at most ``max_secondary_step`` per joint.
    """
    lower, upper = bounds
    eye = np.eye(q.shape[1])
    free = free.copy()
    ds = np.zeros_like(q)
    for _ in range(opts.active_set_passes + 1):
        mask = free[:, None, :]
        jt = tasks * mask
        null = (eye - _damped_pinv(jt, opts.position_damping_m) @ jt) * mask * np.swapaxes(mask, -1, -2)
        ds = np.einsum("bij,bj->bi", null, np.einsum("bjs,bs->bj", _damped_pinv(
            (jac * mask) @ null, opts.orientation_damping_rad), err))
        largest = np.max(np.abs(ds), axis=1, keepdims=True)
        ds = ds * np.minimum(1.0, opts.max_secondary_step / np.maximum(largest, 1e-300))
        over = free & ((q + ds < lower) | (q + ds > upper))
        if not np.any(over):
            break
        free &= ~over
    return ds * _inside(q, ds, lower, upper)


def bounded_dls_step(  # noqa: PLR0913 - two tasks and a box are the interface
    jac_primary: FloatArray,
    err_primary: FloatArray,
    jac_secondary: FloatArray | None,
    err_secondary: FloatArray | None,
    q: FloatArray,
    bounds: tuple[FloatArray, FloatArray],
    opts: IKOptions,
    posture: FloatArray | None = None,
) -> FloatArray:
    """One prioritised DLS step that stays inside a box.

    The primary task is solved first, its own active set holding the joints that would cross a bound;
    the secondary task then moves only joints the primary left free, in its null space, and never pushes a
    joint out of the box (such joints are taken out of its free set): a secondary task cannot take the
    joints the primary needs, as clamping the joint sum would. The posture task moves in the null space of
    both, the same way.

    Args:
        jac_primary: primary task Jacobian, ``(B, M, J)`` (metres per joint unit).
        err_primary: primary task error, ``(B, M)``.
        jac_secondary: optional secondary task Jacobian ``(B, S, J)``, solved in the primary's null space.
        err_secondary: its error ``(B, S)``.
        q: current joints, inside the bounds, ``(B, J)``.
        bounds: ``(lower, upper)``, each ``(B, J)``.
        opts: damping, step size, active-set passes and posture gain.
        posture: optional rest joints ``(B, J)`` pulled towards in the null space of both tasks.

    Returns:
        The step ``dq (B, J)`` with ``lower <= q + dq <= upper``.
    """
    lower, upper = bounds
    dq, free = _primary_step(jac_primary, err_primary, q, bounds, opts)
    tasks = jac_primary
    if jac_secondary is not None and err_secondary is not None:
        err = err_secondary - np.einsum("bsj,bj->bs", jac_secondary, dq)
        dq = dq + _null_step(tasks, jac_secondary, err, q + dq, bounds, free, opts)
        tasks = np.concatenate([jac_primary, jac_secondary], axis=1)
    if posture is not None:
        eye = np.broadcast_to(np.eye(q.shape[1]), tasks.shape[:1] + (q.shape[1], q.shape[1]))
        dq = dq + _null_step(tasks, eye, opts.posture_gain * (posture - q - dq), q + dq, bounds, free, opts)
    largest = np.max(np.abs(dq), axis=1, keepdims=True)
    dq = dq * np.minimum(1.0, opts.max_step / np.maximum(largest, 1e-300))
    return np.clip(q + dq, lower, upper) - q


def tool_pose_and_jacobian(pose: FloatArray, jac: FloatArray,
                           tool: FloatArray | None) -> tuple[FloatArray, FloatArray]:
    """Pose ``(B, 4, 4)`` and Jacobian ``(B, 6, J)`` of a link moved to ``link @ tool``.

    The tool point moves with ``v + w x r``, ``r`` the link-to-tool offset in the base frame.
    """
    if tool is None:
        return pose, jac
    offset = pose[:, :3, :3] @ tool[:3, 3]
    linear = jac[:, :3] - skew(offset) @ jac[:, 3:]
    return pose @ tool, np.concatenate([linear, jac[:, 3:]], axis=1)


def _check_inputs(model: KinematicModel, base_from_target: FloatArray, seed: FloatArray) -> None:
    if base_from_target.ndim != 3 or base_from_target.shape[1:] != (4, 4):
        raise ShapeError("base_from_target", base_from_target.shape, "(B, 4, 4)")
    if seed.shape != (base_from_target.shape[0], model.num_joints):
        raise ShapeError("seed joints", seed.shape, f"({base_from_target.shape[0]}, {model.num_joints})")


def solve_pose_ik(  # noqa: PLR0913, PLR0917 - model, target, seed, bounds, options and tasks
    model: KinematicModel,
    frame_index: int,
    base_from_target: FloatArray,
    seed: FloatArray,
    bounds: tuple[FloatArray, FloatArray],
    opts: IKOptions,
    posture: FloatArray | None = None,
    tool: FloatArray | None = None,
    toward: FloatArray | None = None,
    orientation: OrientationTask | None = None,
) -> IKSolution:
    """Batched IK of one link (or a tool rigidly attached to it) to pose targets.

    Args:
        model: kinematics; ``frame_index`` picks the link among ``model.frames``.
        frame_index: index of the controlled link.
        base_from_target: targets, base frame, metres, ``(B, 4, 4)``.
        seed: starting joints, ``(B, J)``; clipped into the bounds first.
        bounds: ``(lower, upper)`` joint bounds, ``(B, J)`` each, ``lower <= upper``.
        opts: solver knobs.
        posture: optional rest joints ``(J,)`` for the null-space posture task.
        tool: optional ``link_from_tool (4, 4)``: the controlled pose is ``link @ tool``. Not the same as
            solving for ``target @ tool^-1`` when the orientation is not reached (a 5-DoF arm): the
            position task then holds the tool point, not the link origin.
        toward: optional joints ``(B, J)`` to move towards in the position task's null space, in place of
            the orientation task: the arm changes its configuration (IK branch) while the tool point
            stays on target; the orientation is whatever that configuration gives.
        orientation: optional task giving, per iteration, the kept targets and the weights of the
            orientation rows (see the module's Convention); default: the full target rotation, unweighted.

    Returns:
        The solution; rows that did not converge keep their best-effort joints with their errors.

    Raises:
        ShapeError: on mismatched shapes.
    """
    base_from_target = np.asarray(base_from_target, dtype=np.float64)
    seed = np.asarray(seed, dtype=np.float64)
    _check_inputs(model, base_from_target, seed)
    lower, upper = bounds
    q = np.clip(seed, lower, upper)
    active = np.ones(len(q), dtype=bool)
    tolerances = np.array([opts.position_tol_m, opts.orientation_tol_rad])
    last_errors = np.full((len(q), 2), np.inf)  # position, orientation error of each row's last iteration
    iterations = 0
    for iterations in range(1, opts.max_iters + 1):  # noqa: B007 - the count is reported
        poses, jacs = model.forward_with_jacobians(q[active])
        pose, jac = tool_pose_and_jacobian(poses[:, frame_index], jacs[:, frame_index], tool)
        target = base_from_target[active]
        weights = None
        if orientation is not None:
            target, weights = orientation(poses, pose, target)
        e_p, e_r = pose_errors(pose, target)
        rest = None if posture is None else np.broadcast_to(posture, q[active].shape)
        if toward is None:
            secondary, err_secondary = jac[:, 3:], e_r
            if weights is not None:
                secondary, err_secondary = weights @ secondary, np.einsum("bij,bj->bi", weights, e_r)
        else:
            secondary = np.broadcast_to(np.eye(q.shape[1]), (len(e_p), q.shape[1], q.shape[1]))
            err_secondary = np.broadcast_to(toward, q.shape)[active] - q[active]
        dq = bounded_dls_step(jac[:, :3], e_p, secondary, err_secondary, q[active],
                              (lower[active], upper[active]), opts, rest)
        q[active] = np.clip(q[active] + dq, lower[active], upper[active])  # no rounding past a bound
        errors = np.stack([np.linalg.norm(e_p, axis=1), np.linalg.norm(e_r, axis=1)], axis=1)
        done = np.all(errors < tolerances, axis=1) | (np.max(np.abs(dq), axis=1) < opts.step_tol)
        if toward is None and opts.stall_fraction > 0:
            done |= np.all(last_errors[active] - errors < opts.stall_fraction * tolerances, axis=1)
        last_errors[active] = errors
        active[np.flatnonzero(active)[done]] = False
        if not np.any(active):
            break
    poses = model.forward(q)
    pose = poses[:, frame_index] if tool is None else poses[:, frame_index] @ tool
    kept = base_from_target if orientation is None else orientation(poses, pose, base_from_target)[0]
    e_p, e_r = pose_errors(pose, kept)
    pos_err, rot_err = np.linalg.norm(e_p, axis=1), np.linalg.norm(e_r, axis=1)
    converged = (pos_err < opts.position_tol_m) & (rot_err < opts.orientation_tol_rad)
    return IKSolution(q, pos_err, rot_err, iterations, converged, pose, kept)
