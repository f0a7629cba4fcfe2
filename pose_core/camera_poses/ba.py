"""Bundle adjustment: Levenberg-Marquardt with a Schur complement on the points.

The problem is an edge list: observation ``m`` says that point ``point_idx[m]`` is seen by camera
``cam_idx[m]`` at undistorted normalised coordinates ``xy[m]``. Cameras are ``cam_from_world``
(rotation ``(C, 3, 3)``, translation ``(C, 3)``), updated on the left:
``R <- exp(dw) R``, ``t <- t + dt``. Residuals are in pixels (normalised error times the focal
length) under a Huber or Cauchy loss (iteratively reweighted). The point blocks are eliminated:
the reduced camera system ``U - W V^-1 W^T`` is a ``scipy.sparse`` (or ``cupyx.scipy.sparse``)
product whose factor ``W`` has its sparsity pattern built once per problem and refilled each
iteration. Fixed parameters (the gauge:
one camera and one translation coordinate for scale) get a zero column and a unit diagonal.

All array math takes an ``xp`` module: numpy on CPU, cupy on GPU (untested here without a GPU).
``optimize_pose`` is the motion-only special case (points fixed) used by tracking and completion.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import nearest_rotation, skew, so3_exp

__all__ = ["BAOptions", "BAProblem", "BAResult", "PoseFit", "bundle_adjust", "optimize_pose"]

logger = logging.getLogger(__name__)

_MIN_DEPTH = 1e-3  # observations with a point closer than this (map units) get zero weight


@dataclass(frozen=True)
class BAOptions:
    """Knobs of the bundle adjuster."""

    # robust loss on the pixel residual norm
    loss: Literal["huber", "cauchy"] = "huber"
    # loss scale, pixels: residuals above it are down-weighted
    loss_scale_px: float = 1.5
    # maximum LM iterations (accepted or rejected steps)
    max_iterations: int = 15
    # stop when the relative cost decrease of an accepted step is below this
    rel_cost_tol: float = 1e-5
    # initial LM damping, relative to the diagonal of the normal equations
    initial_damping: float = 1e-4
    # factor by which the damping grows after a rejected step
    damping_up: float = 10.0
    # factor by which the damping shrinks after an accepted step
    damping_down: float = 3.0


@dataclass
class BAProblem:
    """A bundle-adjustment problem (arrays live on the ``xp`` device).

    Attributes:
        rotation: ``cam_from_world`` rotations, shape ``(C, 3, 3)``.
        translation: ``cam_from_world`` translations, shape ``(C, 3)``.
        points: points in world, shape ``(P, 3)``.
        cam_idx: camera of each observation, shape ``(M,)`` int.
        point_idx: point of each observation, shape ``(M,)`` int.
        xy: observed undistorted normalised coordinates, shape ``(M, 2)``.
        fixed_params: True for parameters kept constant, ``(C, 6)`` bool, order ``(w, t)``.
        focal_px: focal length turning normalised residuals into pixels.
    """

    rotation: Any
    translation: Any
    points: Any
    cam_idx: Any
    point_idx: Any
    xy: Any
    fixed_params: Any
    focal_px: float

    def validate(self) -> None:
        """Raise ``ShapeError`` on inconsistent shapes (all problems at once)."""
        c, p, m = len(self.rotation), len(self.points), len(self.cam_idx)
        checks = [
            ("rotation", self.rotation.shape, (c, 3, 3)), ("translation", self.translation.shape, (c, 3)),
            ("points", self.points.shape, (p, 3)), ("point_idx", self.point_idx.shape, (m,)),
            ("xy", self.xy.shape, (m, 2)), ("fixed_params", self.fixed_params.shape, (c, 6)),
        ]
        bad = [(n, a, e) for n, a, e in checks if tuple(a) != e]
        if bad:
            raise ShapeError("BAProblem " + ", ".join(n for n, _, _ in bad), tuple(bad[0][1]), str(bad[0][2]))


@dataclass
class BAResult:
    """Outcome of ``bundle_adjust``.

    Attributes:
        rotation: refined rotations ``(C, 3, 3)``.
        translation: refined translations ``(C, 3)``.
        points: refined points ``(P, 3)``.
        converged: the relative cost decrease fell below tolerance before ``max_iterations``.
        cost: final robust cost (sum over observations, pixels squared).
        initial_cost: robust cost before optimisation.
        iterations: LM iterations used.
        residual_px: final residual norm per observation, ``(M,)``.
    """

    rotation: Any
    translation: Any
    points: Any
    converged: bool
    cost: float
    initial_cost: float
    iterations: int
    residual_px: Any


def _robust(r_norm: Any, opts: BAOptions, xp: ModuleType) -> tuple[Any, Any]:
    """Robust cost ``rho(|r|)`` and IRLS weight ``rho'(s)/... `` per residual norm ``(M,)``."""
    d = opts.loss_scale_px
    if opts.loss == "huber":
        w = xp.where(r_norm <= d, 1.0, d / xp.maximum(r_norm, 1e-12))
        rho = xp.where(r_norm <= d, r_norm**2, 2 * d * r_norm - d * d)
    else:
        s = (r_norm / d) ** 2
        w = 1.0 / (1.0 + s)
        rho = d * d * xp.log1p(s)
    return rho, w


def _project(rot: Any, trans: Any, pts: Any, prob: BAProblem, xp: ModuleType) -> tuple[Any, Any]:
    """Camera-frame points ``(M, 3)`` and pixel residuals ``(M, 2)``."""
    x_in_cam = xp.einsum("mij,mj->mi", rot[prob.cam_idx], pts[prob.point_idx]) + trans[prob.cam_idx]
    z = xp.maximum(x_in_cam[:, 2], _MIN_DEPTH)
    res = (x_in_cam[:, :2] / z[:, None] - prob.xy) * prob.focal_px
    return x_in_cam, res


class _Pattern:
    """Sparsity pattern of ``W`` (cameras x points, 6x3 blocks), built once per problem.

    Each iteration refills values only: the per-observation blocks ``(M, 6, 3)`` of ``W`` and of
    ``Y = W V^-1`` (same pattern, since ``V^-1`` is block diagonal) are permuted into CSR data
    arrays, and the reduced camera system is ``U - Y W^T`` (a sparse product).
    """

    def __init__(self, prob: BAProblem, xp: ModuleType) -> None:
        cam = _to_numpy(prob.cam_idx).astype(np.int64)
        pt = _to_numpy(prob.point_idx).astype(np.int64)
        n_cam, n_pt = len(prob.rotation), len(prob.points)
        rows = (6 * cam[:, None, None] + np.arange(6)[None, :, None]) + np.zeros((1, 1, 3), np.int64)
        cols = (3 * pt[:, None, None] + np.arange(3)[None, None, :]) + np.zeros((1, 6, 1), np.int64)
        rows, cols = rows.ravel(), cols.ravel()
        order = np.lexsort((cols, rows))
        self.perm = xp.asarray(order)
        self.w_indices = xp.asarray(cols[order].astype(np.int32))
        self.w_indptr = xp.asarray(np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=6 * n_cam))])
                                   .astype(np.int32))
        self.shape_w = (6 * n_cam, 3 * n_pt)
        n = 6 * n_cam
        self.u_indices = xp.asarray((6 * (np.arange(n) // 6)[:, None] + np.arange(6)[None, :]).ravel()
                                    .astype(np.int32))
        self.u_indptr = xp.asarray(np.arange(0, 6 * n + 1, 6, dtype=np.int32))
        self.n = n

    def _w_matrix(self, blocks: Any, xp: ModuleType) -> Any:
        return _sparse(xp).csr_matrix((blocks.reshape(-1)[self.perm], self.w_indices, self.w_indptr),
                                      shape=self.shape_w)

    def reduced(self, y_blocks: Any, w_blocks: Any, u_blocks: Any, xp: ModuleType) -> Any:
        """Sparse ``U - Y W^T``, ``(6C, 6C)``, from blocks ``(M, 6, 3)``, ``(M, 6, 3)``, ``(C, 6, 6)``."""
        u = _sparse(xp).csr_matrix((u_blocks.reshape(-1), self.u_indices, self.u_indptr), shape=(self.n, self.n))
        return u - self._w_matrix(y_blocks, xp) @ self._w_matrix(w_blocks, xp).T


def _to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _sparse(xp: ModuleType) -> ModuleType:
    if xp is np:
        import scipy.sparse as sp  # noqa: PLC0415 - keeps cupy and scipy imports symmetric

        return sp
    import cupyx.scipy.sparse as csp  # noqa: PLC0415 - optional GPU dependency

    return csp


def _spsolve(mat: Any, rhs: Any, xp: ModuleType) -> Any:
    if xp is np:
        from scipy.sparse.linalg import spsolve  # noqa: PLC0415

        return spsolve(mat.tocsc(), rhs)
    from cupyx.scipy.sparse.linalg import spsolve as cu_spsolve  # noqa: PLC0415

    return cu_spsolve(mat, rhs)


def _segment_sum(idx: Any, vals: Any, n: int, xp: ModuleType) -> Any:
    """Sum rows of ``vals (M, ...)`` into ``n`` bins by ``idx (M,)``."""
    flat = vals.reshape(len(idx), -1)
    k = flat.shape[1]
    keys = (idx[:, None] * k + xp.arange(k)[None, :]).reshape(-1)
    out = xp.bincount(keys, weights=flat.reshape(-1), minlength=n * k)
    return out.reshape((n,) + vals.shape[1:])


def _linearize(rot: Any, trans: Any, pts: Any, prob: BAProblem, opts: BAOptions, xp: ModuleType):  # noqa: ANN202
    x_in_cam, res = _project(rot, trans, pts, prob, xp)
    r_norm = xp.linalg.norm(res, axis=1)
    rho, w = _robust(r_norm, opts, xp)
    w = xp.where(x_in_cam[:, 2] > _MIN_DEPTH, w, 0.0)
    z = xp.maximum(x_in_cam[:, 2], _MIN_DEPTH)
    f = prob.focal_px
    zero = xp.zeros_like(z)
    d_proj = f * xp.stack([
        xp.stack([1 / z, zero, -x_in_cam[:, 0] / z**2], axis=-1),
        xp.stack([zero, 1 / z, -x_in_cam[:, 1] / z**2], axis=-1),
    ], axis=-2)  # (M, 2, 3)
    rx = x_in_cam - trans[prob.cam_idx]
    eye = xp.broadcast_to(xp.eye(3), rx.shape + (3,))
    j_cam = d_proj @ xp.concatenate([-skew(rx, xp), eye], axis=-1)  # (M, 2, 6)
    j_cam = j_cam * (~prob.fixed_params[prob.cam_idx])[:, None, :]
    j_pt = d_proj @ rot[prob.cam_idx]  # (M, 2, 3)
    return res, w, rho, j_cam, j_pt


def bundle_adjust(prob: BAProblem, opts: BAOptions | None = None, xp: ModuleType = np) -> BAResult:
    """Refine cameras and points by robust Levenberg-Marquardt with a Schur complement.

    Args:
        prob: the problem; arrays on the device of ``xp``. Not modified.
        opts: solver options.
        xp: numpy or cupy.

    Returns:
        The refined problem values, cost, iterations and per-observation residuals in pixels.

    Raises:
        ShapeError: if the problem arrays are inconsistent.
    """
    opts = opts or BAOptions()
    prob.validate()
    n_cam, n_pt = len(prob.rotation), len(prob.points)
    pattern = _Pattern(prob, xp)
    fixed_flat = prob.fixed_params.reshape(-1).astype(xp.float64)
    rot, trans, pts = prob.rotation, prob.translation, prob.points
    res, w, rho, j_cam, j_pt = _linearize(rot, trans, pts, prob, opts, xp)
    cost = initial_cost = float(rho.sum())
    lam, converged, it = opts.initial_damping, False, 0
    while it < opts.max_iterations:
        it += 1
        jw_cam = j_cam * w[:, None, None]
        jw_pt = j_pt * w[:, None, None]
        u = _segment_sum(prob.cam_idx, xp.swapaxes(jw_cam, 1, 2) @ j_cam, n_cam, xp)
        v = _segment_sum(prob.point_idx, xp.swapaxes(jw_pt, 1, 2) @ j_pt, n_pt, xp)
        g_cam = _segment_sum(prob.cam_idx, xp.einsum("mki,mk->mi", jw_cam, res), n_cam, xp)
        g_pt = _segment_sum(prob.point_idx, xp.einsum("mki,mk->mi", jw_pt, res), n_pt, xp)
        w_blk = xp.swapaxes(jw_cam, 1, 2) @ j_pt  # (M, 6, 3)
        while True:
            ud = u + lam * u * xp.eye(6) + 1e-9 * xp.eye(6)
            vd = v + lam * v * xp.eye(3) + 1e-9 * xp.eye(3)
            v_inv = xp.linalg.inv(vd)
            y = w_blk @ v_inv[prob.point_idx]  # (M, 6, 3)
            s = pattern.reduced(y, w_blk, ud, xp) + _sparse(xp).diags(fixed_flat)
            rhs = -g_cam + _segment_sum(prob.cam_idx, xp.einsum("mij,mj->mi", y, g_pt[prob.point_idx]), n_cam, xp)
            d_cam = _spsolve(s, rhs.reshape(-1), xp).reshape(n_cam, 6)
            wt_dc = xp.einsum("mij,mi->mj", w_blk, d_cam[prob.cam_idx])
            d_pt = xp.einsum("pij,pj->pi", v_inv, -g_pt - _segment_sum(prob.point_idx, wt_dc, n_pt, xp))
            new_rot = nearest_rotation(so3_exp(d_cam[:, :3], xp) @ rot, xp)
            new_trans, new_pts = trans + d_cam[:, 3:], pts + d_pt
            lin = _linearize(new_rot, new_trans, new_pts, prob, opts, xp)
            new_cost = float(lin[2].sum())
            if new_cost < cost:
                break
            lam *= opts.damping_up
            it += 1
            if it >= opts.max_iterations or lam > 1e8:
                break
        if new_cost >= cost:
            break
        rel = (cost - new_cost) / max(cost, 1e-12)
        rot, trans, pts, cost = new_rot, new_trans, new_pts, new_cost
        res, w, _, j_cam, j_pt = lin
        lam = max(lam / opts.damping_down, 1e-9)
        if rel < opts.rel_cost_tol:
            converged = True
            break
    logger.debug("BA %d cams %d pts: cost %.1f -> %.1f in %d its", n_cam, n_pt, initial_cost, cost, it)
    return BAResult(rot, trans, pts, converged, cost, initial_cost, it, xp.linalg.norm(res, axis=1))


@dataclass
class PoseFit:
    """Outcome of ``optimize_pose``.

    Attributes:
        cam_from_world: refined pose, shape ``(4, 4)``.
        inliers: observations with residual below the inlier threshold, ``(N,)`` bool.
        rms_px: RMS residual of the inliers, pixels.
        iterations: Gauss-Newton iterations used.
    """

    cam_from_world: np.ndarray
    inliers: np.ndarray
    rms_px: float
    iterations: int


def optimize_pose(
    cam_from_world: np.ndarray,
    x_in_world: np.ndarray,
    xy: np.ndarray,
    focal_px: float,
    opts: BAOptions | None = None,
    inlier_px: float = 3.0,
) -> PoseFit:
    """Motion-only robust Gauss-Newton: refine one camera against fixed points.

    Args:
        cam_from_world: initial pose, shape ``(4, 4)``.
        x_in_world: points in world, shape ``(N, 3)``.
        xy: their undistorted normalised observations, shape ``(N, 2)``.
        focal_px: focal length turning normalised residuals into pixels.
        opts: loss and iteration options (``loss``, ``loss_scale_px``, ``max_iterations``).
        inlier_px: residual threshold of the returned inlier mask, pixels.

    Returns:
        The refined pose, inliers, inlier RMS and iteration count.
    """
    opts = opts or BAOptions()
    rot, trans = nearest_rotation(cam_from_world[:3, :3]), cam_from_world[:3, 3].copy()
    it = 0
    for it in range(1, opts.max_iterations + 1):  # noqa: B007 - reported below
        x_in_cam = x_in_world @ rot.T + trans
        z = np.maximum(x_in_cam[:, 2], _MIN_DEPTH)
        res = (x_in_cam[:, :2] / z[:, None] - xy) * focal_px
        _, w = _robust(np.linalg.norm(res, axis=1), opts, np)
        w = np.where(x_in_cam[:, 2] > _MIN_DEPTH, w, 0.0)
        jx = np.zeros((len(z), 2, 3))
        jx[:, 0, 0] = jx[:, 1, 1] = focal_px / z
        jx[:, :, 2] = -focal_px * x_in_cam[:, :2] / z[:, None] ** 2
        jac = jx @ np.concatenate([-skew(x_in_cam - trans), np.broadcast_to(np.eye(3), (len(z), 3, 3))], axis=2)
        jw = jac * w[:, None, None]
        h = np.einsum("mki,mkj->ij", jw, jac) + 1e-9 * np.eye(6)
        step = np.linalg.solve(h, -np.einsum("mki,mk->i", jw, res))
        rot = so3_exp(step[:3]) @ rot
        trans = trans + step[3:]
        if np.linalg.norm(step) < 1e-8:
            break
    x_in_cam = x_in_world @ rot.T + trans
    z = x_in_cam[:, 2]
    err = np.linalg.norm((x_in_cam[:, :2] / np.where(z > _MIN_DEPTH, z, np.nan)[:, None] - xy) * focal_px, axis=1)
    inliers = np.nan_to_num(err, nan=np.inf) < inlier_px
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rot, trans
    rms = float(np.sqrt(np.mean(err[inliers] ** 2))) if inliers.any() else float("nan")
    return PoseFit(out, inliers, rms, it)
