"""Similarity transforms (Sim(3)) as ``(4, 4)`` matrices ``[[s R, t], [0, 1]]``.

Monocular maps differ by a similarity: joining two maps or closing a loop moves points by
``x_in_b = s R x_in_a + t`` (``b_from_a``). Camera poses stay rigid: a camera of frame ``a`` seen
from frame ``b`` has its camera-frame units scaled by ``s`` (``cam_from_world_after_sim3``).

Convention:
    ``b_from_a`` as in ``rigid3``; the scale is ``cbrt(det(M[:3, :3]))`` (positive).
"""

from __future__ import annotations

import logging

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "cam_from_world_after_sim3",
    "sim3_from_parts",
    "sim3_inverse",
    "sim3_parts",
    "transform_points",
]

logger = logging.getLogger(__name__)


def sim3_from_parts(scale: float, rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    """``(4, 4)`` similarity from a scale, a rotation ``(3, 3)`` and a translation ``(3,)``."""
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = scale * np.asarray(rotation, float), translation
    return out


def sim3_parts(b_from_a: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Scale, rotation ``(3, 3)`` and translation ``(3,)`` of a similarity ``(4, 4)``.

    Raises:
        ShapeError: if the input is not ``(4, 4)``.
    """
    m = np.asarray(b_from_a, float)
    if m.shape != (4, 4):
        raise ShapeError("similarity", m.shape, "(4, 4)")
    scale = float(np.cbrt(np.linalg.det(m[:3, :3])))
    return scale, m[:3, :3] / scale, m[:3, 3].copy()


def sim3_inverse(b_from_a: np.ndarray) -> np.ndarray:
    """``a_from_b`` of a similarity ``b_from_a (4, 4)``."""
    s, rot, t = sim3_parts(b_from_a)
    return sim3_from_parts(1.0 / s, rot.T, -rot.T @ t / s)


def transform_points(b_from_a: np.ndarray, x_in_a: np.ndarray) -> np.ndarray:
    """Points ``(N, 3)`` moved by a similarity (or rigid) ``(4, 4)``."""
    return np.asarray(x_in_a, float) @ b_from_a[:3, :3].T + b_from_a[:3, 3]


def cam_from_world_after_sim3(cam_from_world_a: np.ndarray, b_from_a: np.ndarray) -> np.ndarray:
    """Rigid camera poses in world ``b`` from poses in world ``a``, ``(..., 4, 4)``.

    ``x_in_cam = T (S^-1 x_in_b)`` is the camera frame shrunk by ``s``; its rigid pose in ``b`` has
    rotation ``R_T R^T`` and translation ``s t_T - R_T R^T t``.
    """
    s, rot, t = sim3_parts(b_from_a)
    out = np.array(cam_from_world_a, float, copy=True)
    out[..., :3, :3] = cam_from_world_a[..., :3, :3] @ rot.T
    out[..., :3, 3] = s * cam_from_world_a[..., :3, 3] - out[..., :3, :3] @ t
    return out
