"""Sim(3) pose-graph optimisation over keyframes: spread a loop correction along the path.

A loop closure says where the current keyframe really is in the map's old part (a similarity: a
monocular map also drifts in scale). Moving only that keyframe would tear the map; bundle
adjustment from the drifted state converges slowly or not at all. As in ORB-SLAM's essential-graph
optimisation, every keyframe gets a similarity ``cam_from_world`` (``s R``, ``t``); edges between
keyframes keep their current relative similarity (what tracking measured locally), the loop edge
asks for the corrected one, and a sparse least-squares problem spreads the disagreement over the
loop. Points then move with the keyframe that created them, and the keyframes become rigid again
(camera units rescaled). Global BA at the ba stage refines the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix, csr_matrix, diags
from scipy.sparse.linalg import spsolve

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import so3_exp, so3_log

__all__ = ["PoseGraphOptions", "optimise_sim3_graph", "rigid_from_sim3"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoseGraphOptions:
    """Knobs of the Sim(3) pose graph."""

    # Levenberg-Marquardt iterations
    max_iterations: int = 100
    # initial damping (times the diagonal of the normal equations)
    initial_damping: float = 1e-4
    # stop when an accepted step lowers the cost by less than this fraction
    rel_cost_tol: float = 1e-8
    # weight of the log-scale residual relative to a rotation residual of one radian
    scale_weight: float = 1.0


def _chart(v: np.ndarray) -> np.ndarray:
    """Similarities ``(N, 4, 4)`` from ``(N, 7)`` vectors ``(log s, rotation vector, t)``."""
    out = np.tile(np.eye(4), (len(v), 1, 1))
    out[:, :3, :3] = np.exp(v[:, :1])[:, :, None] * so3_exp(v[:, 1:4])
    out[:, :3, 3] = v[:, 4:7]
    return out


def _unchart(m: np.ndarray) -> np.ndarray:
    """Inverse of ``_chart``: ``(N, 4, 4)`` -> ``(N, 7)``."""
    s = np.cbrt(np.linalg.det(m[:, :3, :3]))
    return np.column_stack([np.log(s), so3_log(m[:, :3, :3] / s[:, None, None]), m[:, :3, 3]])


def _inverse(m: np.ndarray) -> np.ndarray:
    """Inverse similarities ``(N, 4, 4)``."""
    s = np.cbrt(np.linalg.det(m[:, :3, :3]))
    rot_t = np.swapaxes(m[:, :3, :3], 1, 2) / s[:, None, None]
    out = np.tile(np.eye(4), (len(m), 1, 1))
    out[:, :3, :3] = rot_t / s[:, None, None]
    out[:, :3, 3] = -(out[:, :3, :3] @ m[:, :3, 3, None])[:, :, 0]
    return out


def optimise_sim3_graph(
    cam_from_world: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    dst_from_src: np.ndarray,
    fixed: np.ndarray,
    opts: PoseGraphOptions | None = None,
    edge_weight: np.ndarray | None = None,
    initial: np.ndarray | None = None,
) -> np.ndarray:
    """Similarity poses that best agree with the measured relative similarities.

    Levenberg-Marquardt on each node's ``world_from_cam`` similarity as ``(log s, rotation vector,
    camera centre)``: with the centre explicit, rescaling a stretch of the path about a point is
    linear in the unknowns (a ``cam_from_world`` chart couples scale and position and crawled). Each
    edge's residual ``chart(M^-1 S_dst S_src^-1)`` depends on two nodes, so its ``7 x 14`` Jacobian
    comes from central differences of that edge alone (vectorised over edges) and the normal
    equations are sparse.

    Args:
        cam_from_world: initial keyframe poses (rigid or similarity), ``(K, 4, 4)``.
        src: source keyframe of each edge, ``(E,)`` int.
        dst: target keyframe of each edge, ``(E,)`` int.
        dst_from_src: measured ``S_dst S_src^-1`` of each edge, ``(E, 4, 4)``.
        fixed: keyframes held at their initial pose, ``(K,)`` bool (at least one).
        opts: solver options.
        edge_weight: weight of each edge's residual components ``(E, 7)`` (log scale, rotation,
            translation), or ``(E,)`` for all components; 1 by default. A weak edge takes more of the
            correction.
        initial: starting similarity poses ``(K, 4, 4)`` (e.g. with a loop's correction put where it is
            likeliest); ``cam_from_world`` by default.

    Returns:
        Similarity ``cam_from_world`` per keyframe, ``(K, 4, 4)``.

    Raises:
        ShapeError: on inconsistent shapes or when no keyframe is fixed.
    """
    opts = opts or PoseGraphOptions()
    k, e = len(cam_from_world), len(src)
    if cam_from_world.shape != (k, 4, 4) or dst_from_src.shape != (e, 4, 4) or len(dst) != e:
        raise ShapeError("pose graph", cam_from_world.shape, "(K, 4, 4) with (E, 4, 4) edges")
    if fixed.shape != (k,) or not fixed.any():
        raise ShapeError("pose graph fixed keyframes", fixed.shape, f"({k},) with at least one True")
    v = _unchart(_inverse(cam_from_world if initial is None else initial))
    free = np.nonzero(~fixed)[0]
    if len(free) == 0:
        return _inverse(_chart(v))
    slot = np.full(k, -1)
    slot[free] = np.arange(len(free))
    meas_inv = _inverse(dst_from_src)
    baseline = np.median(np.linalg.norm(dst_from_src[:, :3, 3], axis=1))
    weight = np.tile(np.array([opts.scale_weight, 1, 1, 1, *([1.0 / max(baseline, 1e-9)] * 3)]), (e, 1))
    if edge_weight is not None:
        weight = weight * (edge_weight[:, None] if edge_weight.ndim == 1 else edge_weight)
    # An edge between two fixed nodes adds a constant to the cost and nothing else: it is evaluated once,
    # so an iteration costs what the free part of the graph holds (a loop closed late in a long map
    # frees only the loop's span).
    live = ~(fixed[src] & fixed[dst])
    held = _unchart(meas_inv[~live] @ _inverse(_chart(v[dst[~live]])) @ _chart(v[src[~live]])) * weight[~live]
    held_cost = float(np.sum(held**2))
    src, dst, meas_inv, weight = src[live], dst[live], meas_inv[live], weight[live]

    def residuals(v_src: np.ndarray, v_dst: np.ndarray) -> np.ndarray:
        return _unchart(meas_inv @ _inverse(_chart(v_dst)) @ _chart(v_src)) * weight

    res = residuals(v[src], v[dst])
    cost, damping = held_cost + float(np.sum(res**2)), opts.initial_damping
    for _ in range(opts.max_iterations):
        jac = _edge_jacobians(residuals, v[src], v[dst])  # (E, 7, 14)
        hess, grad = _normal_equations(jac, res, slot[src], slot[dst], len(free))
        while damping < 1e10:
            step = spsolve((hess + damping * diags(hess.diagonal() + 1e-12)).tocsc(), -grad).reshape(-1, 7)
            trial = v.copy()
            trial[free] += step
            trial_res = residuals(trial[src], trial[dst])
            trial_cost = held_cost + float(np.sum(trial_res**2))
            if trial_cost < cost:
                break
            damping *= 10.0
        else:
            break
        done = (cost - trial_cost) < opts.rel_cost_tol * cost
        logger.debug("pose graph cost %.6g -> %.6g (damping %.1e)", cost, trial_cost, damping)
        v, res, cost, damping = trial, trial_res, trial_cost, max(damping / 10.0, 1e-12)
        if done:
            break
    return _inverse(_chart(v))


def _edge_jacobians(
    residuals: Callable[[np.ndarray, np.ndarray], np.ndarray],
    v_src: np.ndarray,
    v_dst: np.ndarray,
    h: float = 1e-6,
) -> np.ndarray:
    """Central-difference Jacobians ``(E, 7, 14)`` of every edge's residual w.r.t. its two nodes."""
    jac = np.zeros((len(v_src), 7, 14))
    for i in range(7):
        d = np.zeros(7)
        d[i] = h
        jac[:, :, i] = (residuals(v_src + d, v_dst) - residuals(v_src - d, v_dst)) / (2 * h)
        jac[:, :, 7 + i] = (residuals(v_src, v_dst + d) - residuals(v_src, v_dst - d)) / (2 * h)
    return jac


def _normal_equations(
    jac: np.ndarray, res: np.ndarray, slot_src: np.ndarray, slot_dst: np.ndarray, n_free: int
) -> tuple[csr_matrix, np.ndarray]:
    """Sparse ``J^T J`` ``(7F, 7F)`` and ``J^T r`` ``(7F,)`` over the free nodes (slot -1: fixed)."""
    slots = np.stack([slot_src, slot_dst], axis=1)  # (E, 2)
    cols = (7 * slots[:, :, None] + np.arange(7)).reshape(len(jac), 14)  # (E, 14), negative: fixed
    valid = np.repeat(slots >= 0, 7, axis=1)
    jtj = np.einsum("eri,erj->eij", jac, jac)
    jtr = np.einsum("eri,er->ei", jac, res)
    keep = valid[:, :, None] & valid[:, None, :]
    rows_i = np.broadcast_to(cols[:, :, None], jtj.shape)[keep]
    cols_j = np.broadcast_to(cols[:, None, :], jtj.shape)[keep]
    hess = coo_matrix((jtj[keep], (rows_i, cols_j)), shape=(7 * n_free, 7 * n_free)).tocsr()
    grad = np.bincount(cols[valid], weights=jtr[valid], minlength=7 * n_free)
    return hess, grad


def rigid_from_sim3(cam_from_world: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rigid poses ``(K, 4, 4)`` (camera units divided by the scale) and the scales ``(K,)``."""
    s = np.cbrt(np.linalg.det(cam_from_world[:, :3, :3]))
    out = cam_from_world.copy()
    out[:, :3, :3] /= s[:, None, None]
    out[:, :3, 3] /= s[:, None]
    return out, s
