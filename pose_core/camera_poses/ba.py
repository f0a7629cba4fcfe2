"""Bundle adjustment: Levenberg-Marquardt with a Schur complement on the points.

The problem is an edge list: observation ``m`` says that point ``point_idx[m]`` is seen by camera
``cam_idx[m]`` at undistorted normalised coordinates ``xy[m]``. Cameras are ``cam_from_world``
(rotation ``(C, 3, 3)``, translation ``(C, 3)``), updated on the left:
``R <- exp(dw) R``, ``t <- t + dt``. Residuals are in pixels (normalised error times the focal
length) under a Huber or Cauchy loss (iteratively reweighted). The point blocks are eliminated
(Schur complement) and the reduced camera system ``S = U - W V^-1 W^T`` is formed by ``_Pattern``,
whose structure is built once per problem and refilled each iteration: a dense product for small
problems (sliding-window BA), observation pairs summed per camera block for large ones (global
BA; memory bounded by chunking), solved dense up to ``dense_max_cameras`` cameras and as a
``scipy.sparse`` (``cupyx.scipy.sparse``) matrix above. Fixed parameters (the gauge: one camera
and one translation coordinate for scale) get a zero column and a unit diagonal.

Focal refinement (``BAProblem.refine_focal``, for intrinsics that are a prior, not a calibration):
the observations were normalised with the prior focal ``f0`` and the prior principal point
``c``: ``xy = (u - c) / f0``. If the true focal is ``f = s f0`` (same principal point, square
pixels), ``u = f proj(X) + c`` gives ``xy = s proj(X)``, so one scalar ``s`` joins the unknowns and
the pixel residual stays ``f0 (s proj(X) - xy)`` (exactly ``u_pred - u``). Its column borders the
reduced camera system: after the points are eliminated, ``[[S, b], [b^T, d]]`` is solved by
eliminating the border with two right-hand sides of ``S`` (same ``_Pattern`` path, dense or
sparse). The focal's posterior standard deviation comes from the same bordered system at the
solution (``1 / (d - b^T S^-1 b)`` times the residual variance); when it is above
``focal_max_rel_std`` (pure translation, e.g. driving straight, cannot tell the focal from the depth
of the scene), ``s`` leaves ``focal_scale_range``, the solver did not converge or too many residuals
stay above the loss scale and no fewer than with the prior (the map is broken), the problem is solved
again with the prior focal and the reason is logged. A principal point off the image centre is not
modelled (the prior puts it at the centre).

Radial distortion (``BAProblem.refine_radial``, with the focal): one more global unknown ``k1``
with ``xy = s p (1 + k1 |p|^2)``, ``p = proj(X)`` (OpenCV's radial term in the true camera's
normalised coordinates). The focal and ``k1`` border the reduced camera system together (``G`` = 2
right-hand sides more); ``k1`` is kept at 0, with the reason, when its posterior standard deviation
is above ``radial_max_std`` or it leaves ``radial_range``.

All array math takes an ``xp`` module: numpy on CPU, cupy on GPU
(``tests/pose_core/camera_poses/test_ba_gpu.py`` compares the two; it passed on an H200 with cupy 14.2).
``optimize_pose`` is the motion-only special case (points fixed) used by tracking and completion.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Literal

import numpy as np

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import nearest_rotation, skew, so3_exp, so3_log

__all__ = [
    "BAOptions",
    "BAProblem",
    "BAResult",
    "FocalStatus",
    "PoseFit",
    "PosePrior",
    "bundle_adjust",
    "optimize_pose",
]

logger = logging.getLogger(__name__)

_MIN_DEPTH = 1e-3  # observations with a point closer than this (map units) get zero weight

#: What became of the focal length: ``fixed`` (not refined), ``refined``, or kept at the prior because
#: the data do not determine it (``unobservable``), the change is out of range (``implausible``),
#: the solver did not converge within ``focal_max_iterations`` (``unconverged``) or the refined
#: solution leaves too many residuals above the loss scale (``poor_fit``: a broken map); a radial term
#: too small to matter is ``negligible``.
FocalStatus = Literal[
    "fixed", "refined", "unobservable", "implausible", "unconverged", "poor_fit", "negligible"
]


@dataclass(frozen=True)
class BAOptions:
    """Knobs of the bundle adjuster."""

    # robust loss on the pixel residual norm
    loss: Literal["huber", "cauchy"] = "huber"
    # loss scale, pixels: residuals above it are down-weighted
    loss_scale_px: float = 1.5
    # maximum LM iterations (accepted or rejected steps)
    max_iterations: int = 15
    # maximum LM iterations of a problem that refines the focal: its scale couples every depth and is
    # a slow direction (synthetic tracks, 11-29 keyframes, prior 12 % off: converged in 6-16; rendered
    # 600-frame clip, 137 keyframes, 70-degree prior 9 % short: 53)
    focal_max_iterations: int = 80
    # keep the prior when the focal has not converged in focal_max_iterations (False: an estimate still
    # moving is used, e.g. to track again with it before the final BA)
    focal_require_convergence: bool = True
    # stop when the relative cost decrease of an accepted step is below this
    rel_cost_tol: float = 1e-5
    # initial LM damping, relative to the diagonal of the normal equations
    initial_damping: float = 1e-4
    # factor by which the damping grows after a rejected step
    damping_up: float = 10.0
    # factor by which the damping shrinks after an accepted step
    damping_down: float = 3.0
    # give up (keep the current estimate) once the damping exceeds this
    max_damping: float = 1e8
    # problems with 6C x 3P at most this many entries form the reduced system by a dense product
    dense_max_entries: int = 2_000_000
    # reduced camera systems of at most this many cameras are solved dense, larger ones sparse
    dense_max_cameras: int = 100
    # observation pairs per chunk when filling the reduced system (bounds the memory of that step)
    pair_chunk: int = 1 << 18
    # motion-only optimisation stops when its step (radians and map units) is below this
    pose_step_tol: float = 1e-6
    # motion-only optimisation: after its first step, observations with a residual above this (pixels)
    # are left out (many gross outliers under a Huber loss dragged KITTI frames 0.8 m off a good start)
    pose_outlier_gate_px: float = 10.0
    # focal refinement (``BAProblem.refine_focal``) keeps the prior when the refined focal's relative
    # posterior standard deviation is above this: the motion does not determine it (KITTI's straight
    # drive: 6.6 %; synthetic head motion: 0.04-0.12 %)
    focal_max_rel_std: float = 0.01
    # focal refinement keeps the prior when refined / prior focal falls outside this range (implausible)
    focal_scale_range: tuple[float, float] = (0.5, 2.0)
    # focal refinement keeps the prior when more than this fraction of the refined residuals are above
    # loss_scale_px and no fewer than with the prior focal: the map (tracked with the prior focal) is
    # broken and a focal fitted to it is not trusted (synthetic runs: accepted fits 0-3.5 %, focal within
    # 0.2 %; broken maps 8-17 %, focal 2-33 % off, the prior's 7.7 %; KITTI 1.7 %; real handheld
    # 7-Scenes 9 % even calibrated)
    focal_max_outlier_frac: float = 0.05
    # radial refinement (``BAProblem.refine_radial``) keeps k1 = 0 when its posterior standard deviation
    # is above this ...
    radial_max_std: float = 0.02
    # ... or when k1 falls outside this range (OpenCV's k1 of phone and action cameras: about -0.4..0.2)
    radial_range: tuple[float, float] = (-0.6, 0.4)
    # ... or when |k1| is below this: at the corner of a 70-degree view (r^2 ~ 0.5) it moves a point by
    # under 0.5 % of its radius, and the std is optimistic at that level (an undistorted synthetic camera
    # gave k1 = 0.002 +- 0.0006 and, through the focal's correlation with k1, a focal 0.8 % off)
    radial_min_abs: float = 0.01


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
        focal_px: focal length turning normalised residuals into pixels (the one ``xy`` was made with).
        refine_focal: also estimate a global focal scale ``s`` (refined focal ``s * focal_px``); for
            intrinsics from a prior, never for a calibration.
        refine_radial: with ``refine_focal``, also estimate a radial distortion coefficient ``k1``.
    """

    rotation: Any
    translation: Any
    points: Any
    cam_idx: Any
    point_idx: Any
    xy: Any
    fixed_params: Any
    focal_px: float
    refine_focal: bool = False
    refine_radial: bool = False

    def validate(self) -> None:
        """Raise ``ShapeError`` on inconsistent shapes (all problems at once)."""
        c, p, m = len(self.rotation), len(self.points), len(self.cam_idx)
        checks = [
            ("rotation", self.rotation.shape, (c, 3, 3)),
            ("translation", self.translation.shape, (c, 3)),
            ("points", self.points.shape, (p, 3)),
            ("point_idx", self.point_idx.shape, (m,)),
            ("xy", self.xy.shape, (m, 2)),
            ("fixed_params", self.fixed_params.shape, (c, 6)),
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
        focal_scale: refined / given focal length the returned values agree with (1 unless refined).
        focal_scale_std: posterior standard deviation of the focal scale at the refined solution (also
            when it was rejected); NaN when the focal was not refined.
        focal_status: see ``FocalStatus``.
        radial_k1: refined radial coefficient the returned values agree with (0 unless refined).
        radial_k1_std: its posterior standard deviation (also when rejected); NaN when not refined.
        radial_status: ``fixed``, ``refined``, or kept at 0: ``unobservable`` or ``implausible``.
    """

    rotation: Any
    translation: Any
    points: Any
    converged: bool
    cost: float
    initial_cost: float
    iterations: int
    residual_px: Any
    focal_scale: float = 1.0
    focal_scale_std: float = float("nan")
    focal_status: FocalStatus = "fixed"
    radial_k1: float = 0.0
    radial_k1_std: float = float("nan")
    radial_status: FocalStatus = "fixed"


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


def _residuals(
    rot: Any,
    trans: Any,
    pts: Any,
    intr: tuple[float, float],
    prob: BAProblem,
    opts: BAOptions,
    xp: ModuleType,
) -> tuple[Any, Any, Any, Any]:
    """Camera-frame points ``(M, 3)``, pixel residuals ``(M, 2)``, robust costs and IRLS weights ``(M,)``.

    ``intr`` is the focal scale ``s`` and radial ``k1``: the prediction is ``s p (1 + k1 |p|^2)``,
    ``p = proj(x_in_cam)``.
    """
    x_in_cam = (rot[prob.cam_idx] @ pts[prob.point_idx][:, :, None])[:, :, 0] + trans[prob.cam_idx]
    z = xp.maximum(x_in_cam[:, 2], _MIN_DEPTH)
    p = x_in_cam[:, :2] / z[:, None]
    radial = 1.0 + intr[1] * xp.sum(p * p, axis=1, keepdims=True)
    res = (intr[0] * p * radial - prob.xy) * prob.focal_px
    rho, w = _robust(xp.linalg.norm(res, axis=1), opts, xp)
    return x_in_cam, res, rho, xp.where(x_in_cam[:, 2] > _MIN_DEPTH, w, 0.0)


def _projection_jacobians(
    x_in_cam: Any, rx: Any, focal_px: float, xp: ModuleType, k1: float = 0.0
) -> tuple[Any, Any]:
    """Jacobians of the pixel projection of ``x_in_cam = R p + t`` (left update of ``R``).

    Args:
        x_in_cam: camera-frame points, ``(M, 3)``.
        rx: the rotated world points ``R p = x_in_cam - t``, ``(M, 3)``.
        focal_px: focal length, pixels.
        xp: array module.
        k1: radial coefficient of the projection ``p (1 + k1 |p|^2)``.

    Returns:
        ``d res / d x_in_cam`` (also ``d res / d t``), ``(M, 2, 3)``, and ``d res / d w``, ``(M, 2, 3)``.
    """
    inv_z = 1.0 / xp.maximum(x_in_cam[:, 2], _MIN_DEPTH)
    d_proj = xp.zeros((len(inv_z), 2, 3))
    d_proj[:, 0, 0] = d_proj[:, 1, 1] = focal_px * inv_z
    d_proj[:, :, 2] = -focal_px * x_in_cam[:, :2] * (inv_z**2)[:, None]
    if k1 != 0.0:  # d distorted / d p = (1 + k1 r^2) I + 2 k1 p p^T
        p = x_in_cam[:, :2] * inv_z[:, None]
        d_dist = 2.0 * k1 * p[:, :, None] * p[:, None, :]
        d_dist += (1.0 + k1 * xp.sum(p * p, axis=1))[:, None, None] * xp.eye(2)
        d_proj = d_dist @ d_proj
    return d_proj, xp.cross(rx[:, None, :], d_proj)  # row k of d/dw: rx x d_proj[k]


class _Pattern:
    """Structure of the reduced camera system ``S = U - sum_p W_ip V_p^-1 W_jp^T``, built once per problem.

    Small problems (``6C x 3P`` at most ``dense_max_entries``) scatter ``W`` and ``Y = W V^-1`` into
    dense ``(6C, 3P)`` matrices and form ``Y W^T`` with one matrix product. Larger ones use the
    observation pairs: every ordered pair ``(a, b)`` of observations of one point adds ``Y_a W_b^T``
    (6x6) to the block of cameras ``(cam_a, cam_b)``; the pairs, their block index and the CSR layout
    of the blocks are computed here once, and each iteration only refills values (in chunks of
    ``pair_chunk`` pairs, which bounds memory). ``S`` is solved dense up to ``dense_max_cameras``
    cameras, sparse above.
    """

    def __init__(self, prob: BAProblem, opts: BAOptions, xp: ModuleType) -> None:
        self.n_cam, self.n_pt = len(prob.rotation), len(prob.points)
        self.cam_idx, self.point_idx = prob.cam_idx, prob.point_idx
        self.dense_product = 18 * self.n_cam * self.n_pt <= opts.dense_max_entries
        self.dense_solve = self.n_cam <= opts.dense_max_cameras
        if not self.dense_product:
            self._pairs(prob, opts, xp)

    def _pairs(self, prob: BAProblem, opts: BAOptions, xp: ModuleType) -> None:
        """Observation pairs of each point (``cam_a <= cam_b``), sorted by their camera block."""
        cam = _to_numpy(prob.cam_idx).astype(np.int64)
        pt = _to_numpy(prob.point_idx).astype(np.int64)
        n_cam = self.n_cam
        order = np.argsort(pt, kind="stable")
        counts = np.bincount(pt, minlength=self.n_pt)
        k = counts[pt[order]]  # size of the point's group at each sorted position
        first = (np.cumsum(counts) - counts)[pt[order]]
        a = np.repeat(np.arange(len(pt)), k)
        b = np.repeat(first, k) + np.arange(len(a)) - np.repeat(np.cumsum(k) - k, k)
        obs_a, obs_b = order[a], order[b]
        upper = cam[obs_a] <= cam[obs_b]
        obs_a, obs_b = obs_a[upper], obs_b[upper]
        key = cam[obs_a] * n_cam + cam[obs_b]
        by_block = np.argsort(key, kind="stable")
        obs_a, obs_b, key = obs_a[by_block], obs_b[by_block], key[by_block]
        diag = np.arange(n_cam) * (n_cam + 1)
        up_blocks, up_inverse = np.unique(np.concatenate([key, diag]), return_inverse=True)
        self.obs_a, self.obs_b = xp.asarray(obs_a), xp.asarray(obs_b)
        self.pair_block = up_inverse[: len(key)]  # non-decreasing: segments of equal block are contiguous
        self.n_up, self.chunk = len(up_blocks), opts.pair_chunk
        rows, cols = up_blocks // n_cam, up_blocks % n_cam
        off = rows != cols  # the lower triangle is the transpose of the upper one
        full_rows, full_cols = np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])
        row_major = np.lexsort((full_cols, full_rows))
        full_rows, full_cols = full_rows[row_major], full_cols[row_major]
        self.full_src = xp.asarray(np.concatenate([np.arange(self.n_up), np.nonzero(off)[0]])[row_major])
        self.full_transposed = xp.asarray((row_major >= self.n_up)[:, None, None])
        self.diag_block = xp.asarray(up_inverse[len(key) :])
        self.block_row, self.block_col = xp.asarray(full_rows), xp.asarray(full_cols)
        if not self.dense_solve:
            self._csr_layout(full_rows, full_cols, xp)

    def _csr_layout(self, rows: np.ndarray, cols: np.ndarray, xp: ModuleType) -> None:
        """Gather index from block values ``(B, 6, 6)`` to CSR data, plus CSR indices and indptr."""
        per_row = np.bincount(rows, minlength=self.n_cam)
        row_start = np.cumsum(per_row) - per_row
        b, r, c = np.meshgrid(np.arange(len(rows)), np.arange(6), np.arange(6), indexing="ij")
        start = row_start[rows][:, None, None]
        pos = (36 * start + r * 6 * per_row[rows][:, None, None] + 6 * (b - start) + c).ravel()
        gather = np.argsort(pos)
        self.csr_gather = xp.asarray(gather)
        self.csr_indices = xp.asarray((6 * cols[:, None, None] + c).ravel()[gather].astype(np.int32))
        indptr = np.concatenate([[0], np.cumsum(np.repeat(6 * per_row, 6))])
        self.csr_indptr = xp.asarray(indptr.astype(np.int32))

    def _scatter(self, blocks: Any, xp: ModuleType) -> Any:
        """Dense ``(6C, 3P)`` matrix from per-observation ``(M, 6, 3)`` blocks."""
        out = xp.zeros((self.n_cam, 6, self.n_pt, 3))
        out[self.cam_idx, :, self.point_idx, :] = blocks
        return out.reshape(6 * self.n_cam, 3 * self.n_pt)

    def _pair_blocks(self, y: Any, w_blk: Any, xp: ModuleType) -> Any:
        """``sum Y_a W_b^T`` per upper camera block, ``(B_up, 6, 6)`` (chunked segment sums)."""
        acc = xp.zeros((self.n_up, 36))
        for s in range(0, len(self.obs_a), self.chunk):
            a, b = self.obs_a[s : s + self.chunk], self.obs_b[s : s + self.chunk]
            blk = self.pair_block[s : s + self.chunk]
            starts = np.nonzero(np.r_[True, blk[1:] != blk[:-1]])[0]
            prod = (y[a] @ xp.swapaxes(w_blk[b], 1, 2)).reshape(-1, 36)
            acc[xp.asarray(blk[starts])] += _segment_sum_sorted(prod, starts, xp)
        return acc.reshape(self.n_up, 6, 6)

    def solve(self, u: Any, y: Any, w_blk: Any, rhs: Any, xp: ModuleType) -> Any:
        """Solve ``S d = rhs`` for the camera step: ``rhs (C, 6)`` or ``(C, 6, K)``, ``K`` right-hand sides.

        Args:
            u: damped camera blocks with the gauge on the diagonal, ``(C, 6, 6)``.
            y: ``W V^-1`` per observation, ``(M, 6, 3)``.
            w_blk: ``W`` per observation, ``(M, 6, 3)``.
            rhs: reduced right-hand side(s), ``(C, 6)`` or ``(C, 6, K)``.
            xp: array module.

        Returns:
            The solution, shaped like ``rhs``.
        """
        n = 6 * self.n_cam
        b = rhs.reshape(n, -1)
        if self.dense_product:
            mat = -(self._scatter(y, xp) @ self._scatter(w_blk, xp).T).reshape(self.n_cam, 6, self.n_cam, 6)
            cams = xp.arange(self.n_cam)
            mat[cams, :, cams, :] += u
            return xp.linalg.solve(mat.reshape(n, n), b).reshape(rhs.shape)
        up = -self._pair_blocks(y, w_blk, xp)
        up[self.diag_block] += u
        vals = xp.where(self.full_transposed, xp.swapaxes(up[self.full_src], 1, 2), up[self.full_src])
        if self.dense_solve:
            mat = xp.zeros((self.n_cam, self.n_cam, 6, 6))
            mat[self.block_row, self.block_col] = vals
            return xp.linalg.solve(xp.swapaxes(mat, 1, 2).reshape(n, n), b).reshape(rhs.shape)
        mat = _sparse(xp).csr_matrix(
            (vals.reshape(-1)[self.csr_gather], self.csr_indices, self.csr_indptr), shape=(n, n)
        )
        return _spsolve(mat, b, xp).reshape(rhs.shape)


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


def _segment_sum_sorted(vals: Any, starts: np.ndarray, xp: ModuleType) -> Any:
    """Sums of the contiguous row segments of ``vals (N, K)`` that begin at ``starts (S,)``, ``(S, K)``."""
    if xp is np:
        return np.add.reduceat(vals, starts, axis=0)
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(vals)]))
    return _segment_sum(xp.asarray(seg), vals, len(starts), xp)


def _segment_sum(idx: Any, vals: Any, n: int, xp: ModuleType) -> Any:
    """Sum rows of ``vals (M, ...)`` into ``n`` bins by ``idx (M,)``."""
    flat = vals.reshape(len(idx), -1)
    k = flat.shape[1]
    keys = (idx[:, None] * k + xp.arange(k)[None, :]).reshape(-1)
    out = xp.bincount(keys, weights=flat.reshape(-1), minlength=n * k)
    return out.reshape((n,) + vals.shape[1:])


@dataclass
class _IntrinsicBlocks:
    """The rows of ``G`` global intrinsics in the Gauss-Newton system.

    ``J_g`` is their residual Jacobian, ``(M, 2, G)``: the focal scale, then ``k1`` when it is refined.

    Attributes:
        u_cg: ``J_cam^T W J_g`` per camera, ``(C, 6, G)``.
        u_gg: ``J_g^T W J_g``, ``(G, G)``.
        w_g: ``J_g^T W J_pt`` per point, ``(P, 3, G)``.
        g_g: gradient ``J_g^T W r``, ``(G,)``.
    """

    u_cg: Any
    u_gg: Any
    w_g: Any
    g_g: Any


@dataclass
class _Normal:
    """Gauss-Newton blocks: ``U (C,6,6)``, ``V (P,3,3)``, ``g_cam (C,6)``, ``g_pt (P,3)``, ``W (M,6,3)``."""

    u: Any
    v: Any
    g_cam: Any
    g_pt: Any
    w_blk: Any
    intrinsics: _IntrinsicBlocks | None


def _normal_blocks(
    rot: Any,
    trans: Any,
    x_in_cam: Any,
    res: Any,
    w: Any,
    intr: tuple[float, float],
    prob: BAProblem,
    xp: ModuleType,
) -> _Normal:
    """The Gauss-Newton blocks at the current estimate (with the intrinsics' rows when they are refined)."""
    rx = x_in_cam - trans[prob.cam_idx]
    d_proj, j_rot = _projection_jacobians(x_in_cam, rx, intr[0] * prob.focal_px, xp, intr[1])
    j_cam = xp.concatenate([j_rot, d_proj], axis=2) * (~prob.fixed_params[prob.cam_idx])[:, None, :]
    j_pt = d_proj @ rot[prob.cam_idx]  # (M, 2, 3)
    jw_cam_t = xp.swapaxes(j_cam * w[:, None, None], 1, 2)  # (M, 6, 2)
    jw_pt_t = xp.swapaxes(j_pt * w[:, None, None], 1, 2)  # (M, 3, 2)
    n_cam, n_pt = len(rot), len(prob.points)
    u = _segment_sum(prob.cam_idx, jw_cam_t @ j_cam, n_cam, xp)
    v = _segment_sum(prob.point_idx, jw_pt_t @ j_pt, n_pt, xp)
    g_cam = _segment_sum(prob.cam_idx, (jw_cam_t @ res[:, :, None])[:, :, 0], n_cam, xp)
    g_pt = _segment_sum(prob.point_idx, (jw_pt_t @ res[:, :, None])[:, :, 0], n_pt, xp)
    intrinsics = None
    if prob.refine_focal:
        p = x_in_cam[:, :2] / xp.maximum(x_in_cam[:, 2], _MIN_DEPTH)[:, None]  # (M, 2)
        r2 = xp.sum(p * p, axis=1, keepdims=True)
        j_g = [prob.focal_px * p * (1.0 + intr[1] * r2)]  # d res / d s
        if prob.refine_radial:
            j_g.append(prob.focal_px * intr[0] * p * r2)  # d res / d k1
        j_g = xp.stack(j_g, axis=2)  # (M, 2, G)
        jw_g = j_g * w[:, None, None]
        intrinsics = _IntrinsicBlocks(
            u_cg=_segment_sum(prob.cam_idx, jw_cam_t @ j_g, n_cam, xp),
            u_gg=xp.einsum("mkg,mkh->gh", jw_g, j_g),
            w_g=_segment_sum(prob.point_idx, xp.swapaxes(j_pt, 1, 2) @ jw_g, n_pt, xp),
            g_g=xp.einsum("mkg,mk->g", jw_g, res),
        )
    return _Normal(u, v, g_cam, g_pt, jw_cam_t @ j_pt, intrinsics)


def _lm_step(
    nb: _Normal, lam: float, gauge: Any, pattern: _Pattern, prob: BAProblem, xp: ModuleType
) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """One damped step: camera ``(C, 6)``, point ``(P, 3)`` and intrinsics ``(G,)`` steps, and their info.

    The points are eliminated (Schur complement ``S``); with intrinsics, their rows and columns border
    ``S`` and are eliminated in turn: ``S [x_r, X_b] = [rhs, B]``, ``I = D - B^T X_b``,
    ``dg = I^-1 (rhs_g - B^T x_r)``, ``d_cam = x_r - X_b dg``. ``I`` ``(G, G)`` is the intrinsics'
    information with every other parameter marginalised (returned; empty without intrinsics).
    """
    eye3, eye6 = xp.eye(3), xp.eye(6)
    v_inv = xp.linalg.inv(nb.v + (lam * nb.v + 1e-9 * eye3) * eye3)
    y = nb.w_blk @ v_inv[prob.point_idx]  # (M, 6, 3)
    n_cam, n_pt = len(nb.u), len(nb.v)
    y_g = (y @ nb.g_pt[prob.point_idx][:, :, None])[:, :, 0]
    rhs = -nb.g_cam + _segment_sum(prob.cam_idx, y_g, n_cam, xp)
    u_damped = nb.u + (lam * nb.u + 1e-9 * eye6) * eye6 + gauge
    d_g, info = np.zeros(0), np.zeros((0, 0))
    if nb.intrinsics is None:
        d_cam = pattern.solve(u_damped, y, nb.w_blk, rhs, xp)
        pt_rhs = -nb.g_pt
    else:
        f = nb.intrinsics
        border = f.u_cg - _segment_sum(prob.cam_idx, y @ f.w_g[prob.point_idx], n_cam, xp)  # (C, 6, G)
        vinv_wg = v_inv @ f.w_g  # (P, 3, G)
        n_g = f.u_gg.shape[0]
        d_gg = (
            f.u_gg
            + lam * xp.diag(xp.diag(f.u_gg))
            + 1e-9 * xp.eye(n_g)
            - xp.einsum("pkg,pkh->gh", f.w_g, vinv_wg)
        )
        rhs_g = -f.g_g + xp.einsum("pkg,pk->g", vinv_wg, nb.g_pt)
        x = pattern.solve(u_damped, y, nb.w_blk, xp.concatenate([rhs[:, :, None], border], axis=2), xp)
        info = _to_numpy(d_gg - xp.einsum("ckg,ckh->gh", border, x[:, :, 1:]))
        lhs = _to_numpy(rhs_g - xp.einsum("ckg,ck->g", border, x[:, :, 0]))
        d_g = np.linalg.solve(info, lhs) if np.all(np.linalg.eigvalsh(info) > 0) else np.zeros(n_g)
        d_cam = x[:, :, 0] - x[:, :, 1:] @ xp.asarray(d_g)
        pt_rhs = -nb.g_pt - f.w_g @ xp.asarray(d_g)
    wt_dc = (xp.swapaxes(nb.w_blk, 1, 2) @ d_cam[prob.cam_idx][:, :, None])[:, :, 0]
    d_pt = (v_inv @ (pt_rhs - _segment_sum(prob.point_idx, wt_dc, n_pt, xp))[:, :, None])[:, :, 0]
    return d_cam, d_pt, d_g, info


def bundle_adjust(prob: BAProblem, opts: BAOptions | None = None, xp: ModuleType = np) -> BAResult:
    """Refine cameras and points (and intrinsics) by robust Levenberg-Marquardt with a Schur complement.

    Args:
        prob: the problem; arrays on the device of ``xp``. Not modified.
        opts: solver options.
        xp: numpy or cupy.

    Returns:
        The refined problem values, cost, iterations and per-observation residuals in pixels. With
        ``prob.refine_focal`` (and ``refine_radial``), the focal scale (and ``k1``) and posterior
        standard deviations; when the guard rejects the radial term it is solved again without it,
        when it rejects the focal (see the module notes) the values are those of the prior camera.

    Raises:
        ShapeError: if the problem arrays are inconsistent.
    """
    opts = opts or BAOptions()
    prob.validate()
    res = _solve(prob, opts, xp)
    if not prob.refine_focal:
        return res
    if prob.refine_radial:
        radial = _radial_verdict(res, opts)
        if radial is not None:
            status, reason = radial
            logger.info("BA keeps k1 = 0: refined %.4f, %s (%s)", res.radial_k1, reason, status)
            kept = bundle_adjust(replace(prob, refine_radial=False), opts, xp)
            return replace(kept, radial_k1_std=res.radial_k1_std, radial_status=status)
    verdict = _focal_verdict(res, opts, xp)
    if verdict is None:
        logger.info(
            "BA focal %.1f -> %.1f px (std %.2f px), k1 %.4f (std %.4f)",
            prob.focal_px,
            res.focal_scale * prob.focal_px,
            res.focal_scale_std * prob.focal_px,
            res.radial_k1,
            res.radial_k1_std,
        )
        return res
    status, reason = verdict
    kept = _solve(replace(prob, refine_focal=False, refine_radial=False), opts, xp)
    if status == "poor_fit" and _outlier_fraction(res, opts, xp) < _outlier_fraction(kept, opts, xp):
        # real footage leaves more residuals above the loss scale than the limit with any camera
        # (7-Scenes, calibrated: 9 %); a focal that explains more of them than the prior is trusted
        logger.info(
            "BA focal %.1f -> %.1f px: %s, fewer than with the prior",
            prob.focal_px,
            res.focal_scale * prob.focal_px,
            reason,
        )
        return res
    logger.info(
        "BA keeps the prior focal %.1f px: refined %.1f px, %s (%s)",
        prob.focal_px,
        res.focal_scale * prob.focal_px,
        reason,
        status,
    )
    return replace(
        kept,
        focal_scale_std=res.focal_scale_std,
        focal_status=status,
        radial_status=status if prob.refine_radial else "fixed",
    )


def _outlier_fraction(res: BAResult, opts: BAOptions, xp: ModuleType) -> float:
    """Fraction of the residuals above the loss scale."""
    return float(xp.mean(res.residual_px > opts.loss_scale_px))


def _radial_verdict(res: BAResult, opts: BAOptions) -> tuple[FocalStatus, str] | None:
    """Why the refined ``k1`` is not trusted, or None when it is."""
    lo, hi = opts.radial_range
    if not res.radial_k1_std <= opts.radial_max_std:
        return "unobservable", f"std {res.radial_k1_std:.3g} > {opts.radial_max_std:g}"
    if not lo <= res.radial_k1 <= hi:
        return "implausible", f"outside [{lo:g}, {hi:g}]"
    if abs(res.radial_k1) < opts.radial_min_abs:
        return "negligible", f"below {opts.radial_min_abs:g}"
    return None


def _focal_verdict(res: BAResult, opts: BAOptions, xp: ModuleType) -> tuple[FocalStatus, str] | None:
    """Why the refined focal is not trusted, or None when it is."""
    rel_std = res.focal_scale_std / res.focal_scale
    lo, hi = opts.focal_scale_range
    if not rel_std <= opts.focal_max_rel_std:  # NaN (no information) is unobservable too
        return "unobservable", f"relative std {rel_std:.3g} > {opts.focal_max_rel_std:g}"
    if not lo <= res.focal_scale <= hi:
        return "implausible", f"outside [{lo:g}, {hi:g}]"
    if opts.focal_require_convergence and not res.converged:
        return "unconverged", f"not converged in {res.iterations} iterations"
    outliers = _outlier_fraction(res, opts, xp)
    if outliers > opts.focal_max_outlier_frac:
        return "poor_fit", f"{outliers:.1%} of residuals above {opts.loss_scale_px:g} px"
    return None


def _solve(prob: BAProblem, opts: BAOptions, xp: ModuleType) -> BAResult:
    """The LM iterations of ``bundle_adjust`` (no intrinsics guard)."""
    pattern = _Pattern(prob, opts, xp)
    gauge = xp.eye(6) * prob.fixed_params[:, None, :]  # unit diagonal on fixed parameters, (C, 6, 6)
    rot, trans, pts, intr = prob.rotation, prob.translation, prob.points, (1.0, 0.0)
    x_in_cam, res, rho, w = _residuals(rot, trans, pts, intr, prob, opts, xp)
    cost = initial_cost = float(rho.sum())
    lam, converged, it = opts.initial_damping, False, 0
    max_it = opts.focal_max_iterations if prob.refine_focal else opts.max_iterations
    while it < max_it:
        nb = _normal_blocks(rot, trans, x_in_cam, res, w, intr, prob, xp)
        new_cost = np.inf
        while it < max_it and lam <= opts.max_damping:
            it += 1
            d_cam, d_pt, d_g, _ = _lm_step(nb, lam, gauge, pattern, prob, xp)
            new_rot = nearest_rotation(so3_exp(d_cam[:, :3], xp) @ rot, xp)
            new_trans, new_pts = trans + d_cam[:, 3:], pts + d_pt
            step_g = np.concatenate([d_g, np.zeros(2 - len(d_g))])
            new_intr = (intr[0] + float(step_g[0]), intr[1] + float(step_g[1]))
            new = _residuals(new_rot, new_trans, new_pts, new_intr, prob, opts, xp)
            new_cost = float(new[2].sum())
            if new_cost < cost:
                break
            lam *= opts.damping_up
        if new_cost >= cost:
            converged = lam > opts.max_damping  # no step lowers the cost: a minimum to numerical precision
            break
        rel = (cost - new_cost) / max(cost, 1e-12)
        rot, trans, pts, intr, cost = new_rot, new_trans, new_pts, new_intr, new_cost
        x_in_cam, res, _, w = new
        lam = max(lam / opts.damping_down, 1e-9)
        if rel < opts.rel_cost_tol:
            converged = True
            break
    logger.debug(
        "BA %d cams %d pts: cost %.1f -> %.1f in %d its, focal scale %.4f, k1 %.4f",
        len(rot),
        len(pts),
        initial_cost,
        cost,
        it,
        intr[0],
        intr[1],
    )
    out = BAResult(rot, trans, pts, converged, cost, initial_cost, it, xp.linalg.norm(res, axis=1))
    if prob.refine_focal:
        # the intrinsics' information with everything else marginalised: the bordered system, damped only
        # enough (1e-9) to invert a point that lost every observation
        info = _lm_step(
            _normal_blocks(rot, trans, x_in_cam, res, w, intr, prob, xp), 1e-9, gauge, pattern, prob, xp
        )[3]
        std = _intrinsics_std(info, res, w, prob, xp)
        out.focal_scale, out.focal_scale_std, out.focal_status = intr[0], float(std[0]), "refined"
        if prob.refine_radial:
            out.radial_k1, out.radial_k1_std, out.radial_status = intr[1], float(std[1]), "refined"
    return out


def _intrinsics_std(info: np.ndarray, res: Any, w: Any, prob: BAProblem, xp: ModuleType) -> np.ndarray:
    """Posterior standard deviations ``(G,)`` of the intrinsics: ``sqrt(diag(sigma^2 info^-1))``.

    ``sigma^2`` is the weighted residual variance per coordinate, ``sum(w r^2) / (2 M_used - parameters)``,
    with residuals ``res (M, 2)`` and IRLS weights ``w (M,)``; ``info`` ``(G, G)`` is the intrinsics'
    marginal information. NaN when it is not positive definite (not determined at all).
    """
    n_obs = int(xp.count_nonzero(w > 0))
    n_params = 6 * len(prob.rotation) - int(xp.count_nonzero(prob.fixed_params)) + 3 * len(prob.points)
    sigma2 = float(xp.sum(w[:, None] * res**2)) / max(2 * n_obs - n_params - len(info), 1)
    if not np.all(np.linalg.eigvalsh(info) > 0):
        return np.full(len(info), np.nan)
    return np.sqrt(sigma2 * np.diag(np.linalg.inv(info)))


@dataclass(frozen=True)
class PosePrior:
    """A Gaussian prior on one camera's pose, for motion-only fits that the points alone do not pin.

    Its residuals count like a pixel residual of one pixel per sigma. A tiny ``centre_sigma`` holds
    the camera centre (rotation-only tracking through a turn seen only on far points); a wider one
    keeps a non-keyframe near its neighbours when its points are few or disagree.

    Attributes:
        cam_from_world: the expected pose, ``(4, 4)``.
        centre_sigma: standard deviation of the camera centre, map units.
        rotation_sigma_rad: standard deviation of the rotation, radians; ``inf``: no rotation prior.
    """

    cam_from_world: np.ndarray
    centre_sigma: float
    rotation_sigma_rad: float = float("inf")


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
    prior: PosePrior | None = None,
) -> PoseFit:
    """Motion-only robust Gauss-Newton: refine one camera against fixed points.

    Args:
        cam_from_world: initial pose, shape ``(4, 4)``.
        x_in_world: points in world, shape ``(N, 3)``.
        xy: their undistorted normalised observations, shape ``(N, 2)``.
        focal_px: focal length turning normalised residuals into pixels.
        opts: loss and iteration options (``loss``, ``loss_scale_px``, ``max_iterations``).
        inlier_px: residual threshold of the returned inlier mask, pixels.
        prior: an optional prior on the pose (``PosePrior``).

    Returns:
        The refined pose, inliers, inlier RMS and iteration count.
    """
    opts = opts or BAOptions()
    rot, trans = nearest_rotation(cam_from_world[:3, :3]), cam_from_world[:3, 3].copy()
    it = 0
    for it in range(1, opts.max_iterations + 1):  # noqa: B007 - reported below
        rx = x_in_world @ rot.T
        x_in_cam = rx + trans
        z = np.maximum(x_in_cam[:, 2], _MIN_DEPTH)
        res = (x_in_cam[:, :2] / z[:, None] - xy) * focal_px
        r_norm = np.linalg.norm(res, axis=1)
        _, w = _robust(r_norm, opts, np)
        w = np.where(x_in_cam[:, 2] > _MIN_DEPTH, w, 0.0)
        if it > 1:  # gross outliers out after the first step (a Huber tail still pulls; ORB-SLAM gates too)
            w = np.where(r_norm < opts.pose_outlier_gate_px, w, 0.0)
        d_proj, j_rot = _projection_jacobians(x_in_cam, rx, focal_px, np)
        jac = np.concatenate([j_rot, d_proj], axis=2).reshape(-1, 6)  # (2N, 6)
        jw = jac * np.repeat(w, 2)[:, None]
        hess, grad = jw.T @ jac + 1e-9 * np.eye(6), jw.T @ res.reshape(-1)
        if prior is not None:
            hess, grad = _add_prior(hess, grad, rot, trans, prior)
        step = np.linalg.solve(hess, -grad)
        rot = so3_exp(step[:3]) @ rot
        trans = trans + step[3:]
        if np.linalg.norm(step) < opts.pose_step_tol:
            break
    x_in_cam = x_in_world @ rot.T + trans
    z = x_in_cam[:, 2]
    z = np.where(z > _MIN_DEPTH, z, np.nan)
    err = np.linalg.norm((x_in_cam[:, :2] / z[:, None] - xy) * focal_px, axis=1)
    inliers = np.nan_to_num(err, nan=np.inf) < inlier_px
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = rot, trans
    rms = float(np.sqrt(np.mean(err[inliers] ** 2))) if inliers.any() else float("nan")
    return PoseFit(out, inliers, rms, it)


def _add_prior(
    hess: np.ndarray, grad: np.ndarray, rot: np.ndarray, trans: np.ndarray, prior: PosePrior
) -> tuple[np.ndarray, np.ndarray]:
    """The normal equations ``(6, 6)``, ``(6,)`` with the prior's centre and rotation residuals added.

    For the update ``R <- exp(w) R``, ``t <- t + dt`` the centre ``C = -R^T t`` moves by
    ``-R^T [t]x w - R^T dt`` and the rotation error ``log(R R_p^T)`` by ``w`` (to first order).
    """
    p_rot, p_t = prior.cam_from_world[:3, :3], prior.cam_from_world[:3, 3]
    res_c = (-rot.T @ trans + p_rot.T @ p_t) / prior.centre_sigma
    jac_c = np.hstack([-rot.T @ skew(trans), -rot.T]) / prior.centre_sigma
    hess, grad = hess + jac_c.T @ jac_c, grad + jac_c.T @ res_c
    if np.isfinite(prior.rotation_sigma_rad):
        res_r = so3_log((rot @ p_rot.T)[None])[0] / prior.rotation_sigma_rad
        jac_r = np.hstack([np.eye(3), np.zeros((3, 3))]) / prior.rotation_sigma_rad
        hess, grad = hess + jac_r.T @ jac_r, grad + jac_r.T @ res_r
    return hess, grad
