"""Converters to and from foreign pose layouts: xyzw quaternions, TUM rows, KITTI rows, COLMAP params.

Convention:
    egolake is wxyz and ``world_from_cam`` everywhere; this module is the only place where xyzw
    appears. TUM rows are ``t tx ty tz qx qy qz qw`` of ``world_from_cam``; KITTI rows are the
    row-major 3x4 ``[R|t]`` of ``world_from_cam``; COLMAP's ``Rigid3d.params`` are
    ``[qx, qy, qz, qw, tx, ty, tz]`` of ``cam_from_world``.
"""

from __future__ import annotations

import logging

import numpy as np

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import invert_rigid_matrices, matrix_from_quat_wxyz, quat_wxyz_from_matrix

__all__ = [
    "colmap_params_from_world_from_cam",
    "kitti_rows_from_world_from_cam",
    "quat_wxyz_from_xyzw",
    "quat_xyzw_from_wxyz",
    "tum_rows_from_world_from_cam",
    "world_from_cam_from_colmap_params",
    "world_from_cam_from_kitti_rows",
    "world_from_cam_from_tum_rows",
]

logger = logging.getLogger(__name__)


def _check(name: str, arr: np.ndarray, trailing: tuple[int, ...], expected: str) -> np.ndarray:
    arr = np.asarray(arr, dtype=np.float64)
    if arr.ndim != 1 + len(trailing) or arr.shape[1:] != trailing:
        raise ShapeError(name, arr.shape, expected)
    return arr


def quat_xyzw_from_wxyz(q_wxyz: np.ndarray) -> np.ndarray:
    """Reorder quaternions ``(..., 4)`` from wxyz to xyzw."""
    return np.roll(np.asarray(q_wxyz, dtype=np.float64), -1, axis=-1)


def quat_wxyz_from_xyzw(q_xyzw: np.ndarray) -> np.ndarray:
    """Reorder quaternions ``(..., 4)`` from xyzw to wxyz."""
    return np.roll(np.asarray(q_xyzw, dtype=np.float64), 1, axis=-1)


def _matrices(rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    out = np.zeros((len(rotation), 4, 4))
    out[:, :3, :3] = rotation
    out[:, :3, 3] = translation
    out[:, 3, 3] = 1.0
    return out


def tum_rows_from_world_from_cam(ts_s: np.ndarray, world_from_cam: np.ndarray) -> np.ndarray:
    """TUM trajectory rows.

    Args:
        ts_s: timestamps in seconds, shape ``(F,)``.
        world_from_cam: camera poses, shape ``(F, 4, 4)``.

    Returns:
        Rows ``t tx ty tz qx qy qz qw``, shape ``(F, 8)``.
    """
    world_from_cam = _check("world_from_cam", world_from_cam, (4, 4), "(F, 4, 4)")
    q_xyzw = quat_xyzw_from_wxyz(quat_wxyz_from_matrix(world_from_cam[:, :3, :3]))
    return np.column_stack([np.asarray(ts_s, dtype=np.float64), world_from_cam[:, :3, 3], q_xyzw])


def world_from_cam_from_tum_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse TUM rows ``(F, 8)`` into timestamps ``(F,)`` in seconds and poses ``(F, 4, 4)``."""
    rows = _check("TUM rows", rows, (8,), "(F, 8)")
    rot = matrix_from_quat_wxyz(quat_wxyz_from_xyzw(rows[:, 4:8]))
    return rows[:, 0].copy(), _matrices(rot, rows[:, 1:4])


def kitti_rows_from_world_from_cam(world_from_cam: np.ndarray) -> np.ndarray:
    """KITTI rows: row-major 3x4 of each ``world_from_cam (F, 4, 4)``, shape ``(F, 12)``."""
    world_from_cam = _check("world_from_cam", world_from_cam, (4, 4), "(F, 4, 4)")
    return world_from_cam[:, :3, :].reshape(-1, 12).copy()


def world_from_cam_from_kitti_rows(rows: np.ndarray) -> np.ndarray:
    """Poses ``(F, 4, 4)`` from KITTI rows ``(F, 12)``."""
    rows = _check("KITTI rows", rows, (12,), "(F, 12)")
    m = rows.reshape(-1, 3, 4)
    return _matrices(m[:, :, :3], m[:, :, 3])


def colmap_params_from_world_from_cam(world_from_cam: np.ndarray) -> np.ndarray:
    """COLMAP ``cam_from_world`` params ``[qx, qy, qz, qw, tx, ty, tz]``, shape ``(F, 7)``."""
    cam_from_world = invert_rigid_matrices(_check("world_from_cam", world_from_cam, (4, 4), "(F, 4, 4)"))
    q_xyzw = quat_xyzw_from_wxyz(quat_wxyz_from_matrix(cam_from_world[:, :3, :3]))
    return np.column_stack([q_xyzw, cam_from_world[:, :3, 3]])


def world_from_cam_from_colmap_params(params: np.ndarray) -> np.ndarray:
    """Poses ``world_from_cam (F, 4, 4)`` from COLMAP ``cam_from_world`` params ``(F, 7)``."""
    params = _check("COLMAP params", params, (7,), "(F, 7)")
    rot = matrix_from_quat_wxyz(quat_wxyz_from_xyzw(params[:, :4]))
    return invert_rigid_matrices(_matrices(rot, params[:, 4:7]))
