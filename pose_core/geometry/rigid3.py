"""Rigid transforms in 3-D and the rotation helpers they need (quaternions wxyz, so(3) exp/log).

Convention:
    A transform is named for its target and source frame: ``x_in_b = b_from_a * x_in_a``.
    Composition reads right to left: ``c_from_a = c_from_b @ b_from_a``. Quaternions are
    real-first ``(w, x, y, z)``, unit norm, and ``q`` and ``-q`` are the same rotation; the
    helpers here return ``w >= 0``. Passing ``xyzw`` by mistake gives a valid-looking rotation
    and no error: convert foreign layouts in ``pose_core.geometry.interop`` only.

The array helpers take an ``xp`` module (numpy by default, cupy works unchanged) so that the
bundle adjuster can run them on a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "Rigid3",
    "interpolate_rigid",
    "invert_rigid_matrices",
    "matrix_from_quat_wxyz",
    "nearest_rotation",
    "quat_wxyz_from_matrix",
    "skew",
    "so3_exp",
    "so3_log",
]

logger = logging.getLogger(__name__)

_SMALL_ANGLE_RAD = 1e-8  # below this the Taylor forms of exp/log are used


def skew(v: Any, xp: ModuleType = np) -> Any:
    """Cross-product matrices.

    Args:
        v: vectors, shape ``(..., 3)``.
        xp: array module (numpy or cupy).

    Returns:
        ``[v]_x`` with ``[v]_x @ u == cross(v, u)``, shape ``(..., 3, 3)``.
    """
    zero = xp.zeros_like(v[..., 0])
    rows = [
        xp.stack([zero, -v[..., 2], v[..., 1]], axis=-1),
        xp.stack([v[..., 2], zero, -v[..., 0]], axis=-1),
        xp.stack([-v[..., 1], v[..., 0], zero], axis=-1),
    ]
    return xp.stack(rows, axis=-2)


def so3_exp(omega: Any, xp: ModuleType = np) -> Any:
    """Rotation matrices from rotation vectors (Rodrigues).

    Args:
        omega: axis * angle in radians, shape ``(..., 3)``.
        xp: array module (numpy or cupy).

    Returns:
        Rotation matrices, shape ``(..., 3, 3)``.

    Example:
        >>> bool(np.allclose(so3_exp(np.zeros(3)), np.eye(3)))
        True
    """
    theta = xp.linalg.norm(omega, axis=-1)[..., None, None]
    small = theta < _SMALL_ANGLE_RAD
    safe = xp.where(small, 1.0, theta)
    a = xp.where(small, 1.0 - theta**2 / 6.0, xp.sin(safe) / safe)
    b = xp.where(small, 0.5 - theta**2 / 24.0, (1.0 - xp.cos(safe)) / safe**2)
    k = skew(omega, xp)
    eye = xp.broadcast_to(xp.eye(3, dtype=k.dtype), k.shape)
    return eye + a * k + b * (k @ k)


def so3_log(rotation: np.ndarray) -> np.ndarray:
    """Rotation vectors from rotation matrices.

    Args:
        rotation: rotation matrices, shape ``(..., 3, 3)``.

    Returns:
        Axis * angle in radians, angle in ``[0, pi]``, shape ``(..., 3)``.
    """
    return _rotvec_from_quat(quat_wxyz_from_matrix(rotation))


def _rotvec_from_quat(q: np.ndarray) -> np.ndarray:
    w = np.clip(q[..., :1], -1.0, 1.0)
    vec = q[..., 1:]
    sin_half = np.linalg.norm(vec, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(sin_half, w)
    small = sin_half < _SMALL_ANGLE_RAD
    factor = np.where(small, 2.0, angle / np.where(small, 1.0, sin_half))
    return vec * factor


def quat_wxyz_from_matrix(rotation: np.ndarray) -> np.ndarray:
    """Unit quaternions (w, x, y, z) with ``w >= 0`` from rotation matrices.

    Args:
        rotation: rotation matrices, shape ``(..., 3, 3)``.

    Returns:
        Quaternions wxyz, shape ``(..., 4)``.

    Raises:
        ShapeError: if the trailing shape is not ``(3, 3)``.
    """
    rotation = np.asarray(rotation, dtype=np.float64)
    if rotation.shape[-2:] != (3, 3):
        raise ShapeError("rotation matrices", rotation.shape, "(..., 3, 3)")
    m = rotation
    # Shepperd's method: pick the largest of 4 candidate denominators for stability.
    trace = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    cand = np.stack([trace, m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]], axis=-1)
    choice = np.argmax(cand, axis=-1)
    q = np.empty(m.shape[:-2] + (4,))
    diag = np.stack([m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]], axis=-1)
    for i in range(4):
        sel = choice == i
        if not np.any(sel):
            continue
        mi = m[sel]
        if i == 0:
            s = np.sqrt(1.0 + trace[sel]) * 2.0
            qi = [0.25 * s, (mi[:, 2, 1] - mi[:, 1, 2]) / s, (mi[:, 0, 2] - mi[:, 2, 0]) / s,
                  (mi[:, 1, 0] - mi[:, 0, 1]) / s]
        else:
            a, b, c = (i - 1), i % 3, (i + 1) % 3
            d = diag[sel]
            s = np.sqrt(1.0 + d[:, a] - d[:, b] - d[:, c]) * 2.0
            vec = [None, None, None]
            vec[a] = 0.25 * s
            vec[b] = (mi[:, b, a] + mi[:, a, b]) / s
            vec[c] = (mi[:, c, a] + mi[:, a, c]) / s
            qi = [(mi[:, c, b] - mi[:, b, c]) / s, *vec]
        q[sel] = np.stack(qi, axis=-1)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return np.where(q[..., :1] < 0, -q, q)


def matrix_from_quat_wxyz(q: np.ndarray) -> np.ndarray:
    """Rotation matrices from quaternions (w, x, y, z); the input is normalised first.

    Args:
        q: quaternions wxyz, shape ``(..., 4)``.

    Returns:
        Rotation matrices, shape ``(..., 3, 3)``.

    Raises:
        ShapeError: if the trailing size is not 4.
    """
    q = np.asarray(q, dtype=np.float64)
    if q.shape[-1] != 4:
        raise ShapeError("quaternions wxyz", q.shape, "(..., 4)")
    w, x, y, z = np.moveaxis(q / np.linalg.norm(q, axis=-1, keepdims=True), -1, 0)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return np.stack([np.stack(r, axis=-1) for r in rows], axis=-2)


def nearest_rotation(m: Any, xp: ModuleType = np) -> Any:
    """Closest rotation matrices (Frobenius norm) to ``m (..., 3, 3)``, via SVD.

    Used to remove the drift from orthonormality that repeated composition accumulates.
    """
    u, _, vt = xp.linalg.svd(m)
    d = xp.sign(xp.linalg.det(u @ vt))
    u = xp.concatenate([u[..., :2], u[..., 2:] * d[..., None, None]], axis=-1)
    return u @ vt


def invert_rigid_matrices(b_from_a: np.ndarray) -> np.ndarray:
    """Invert homogeneous rigid transforms without a general matrix inverse.

    Args:
        b_from_a: transforms, shape ``(..., 4, 4)``; NaN rows stay NaN.

    Returns:
        ``a_from_b``, shape ``(..., 4, 4)``.
    """
    rot_t = np.swapaxes(b_from_a[..., :3, :3], -1, -2)
    out = np.zeros_like(b_from_a)
    out[..., :3, :3] = rot_t
    out[..., :3, 3] = -(rot_t @ b_from_a[..., :3, 3:4])[..., 0]
    out[..., 3, 3] = 1.0
    return out


def interpolate_rigid(b_from_a0: np.ndarray, b_from_a1: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Interpolate between two rigid transforms (slerp on rotation, linear on translation).

    Args:
        b_from_a0: transform at ``alpha = 0``, shape ``(4, 4)``.
        b_from_a1: transform at ``alpha = 1``, shape ``(4, 4)``.
        alpha: interpolation parameters, shape ``(N,)``; values outside ``[0, 1]`` extrapolate.

    Returns:
        Transforms, shape ``(N, 4, 4)``.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    delta = so3_log(b_from_a1[:3, :3] @ b_from_a0[:3, :3].T)
    out = np.zeros((alpha.size, 4, 4))
    out[:, :3, :3] = so3_exp(alpha[:, None] * delta) @ b_from_a0[:3, :3]
    out[:, :3, 3] = (1 - alpha)[:, None] * b_from_a0[:3, 3] + alpha[:, None] * b_from_a1[:3, 3]
    out[:, 3, 3] = 1.0
    return out


@dataclass(frozen=True)
class Rigid3:
    """A rigid transform ``b_from_a``: ``x_in_b = rotation @ x_in_a + translation``.

    Attributes:
        rotation: rotation matrix, shape ``(3, 3)``.
        translation: translation in metres (or map units), shape ``(3,)``.
    """

    rotation: np.ndarray
    translation: np.ndarray

    def __post_init__(self) -> None:
        if np.shape(self.rotation) != (3, 3):
            raise ShapeError("Rigid3.rotation", np.shape(self.rotation), "(3, 3)")
        if np.shape(self.translation) != (3,):
            raise ShapeError("Rigid3.translation", np.shape(self.translation), "(3,)")

    @classmethod
    def identity(cls) -> Rigid3:
        """The identity transform."""
        return cls(np.eye(3), np.zeros(3))

    @classmethod
    def from_matrix(cls, b_from_a: np.ndarray) -> Rigid3:
        """Build from a homogeneous ``(4, 4)`` or ``(3, 4)`` matrix."""
        m = np.asarray(b_from_a, dtype=np.float64)
        if m.shape not in ((4, 4), (3, 4)):
            raise ShapeError("rigid matrix", m.shape, "(4, 4) or (3, 4)")
        return cls(m[:3, :3].copy(), m[:3, 3].copy())

    @classmethod
    def from_quat_wxyz(cls, q_wxyz: np.ndarray, translation: np.ndarray) -> Rigid3:
        """Build from a quaternion wxyz ``(4,)`` and a translation ``(3,)``."""
        return cls(matrix_from_quat_wxyz(q_wxyz), np.asarray(translation, dtype=np.float64))

    @property
    def quat_wxyz(self) -> np.ndarray:
        """Rotation as a unit quaternion wxyz, shape ``(4,)``, ``w >= 0``."""
        return quat_wxyz_from_matrix(self.rotation)

    def matrix(self) -> np.ndarray:
        """Homogeneous matrix, shape ``(4, 4)``."""
        out = np.eye(4)
        out[:3, :3] = self.rotation
        out[:3, 3] = self.translation
        return out

    def inverse(self) -> Rigid3:
        """``a_from_b`` for this ``b_from_a``."""
        rot_t = self.rotation.T
        return Rigid3(rot_t, -rot_t @ self.translation)

    def transform(self, x_in_a: np.ndarray) -> np.ndarray:
        """Map points ``(N, 3)`` from frame a to frame b."""
        return np.asarray(x_in_a) @ self.rotation.T + self.translation

    def __matmul__(self, other: Rigid3) -> Rigid3:
        """Compose: ``(c_from_b @ b_from_a) == c_from_a``."""
        return Rigid3(self.rotation @ other.rotation, self.rotation @ other.translation + self.translation)
