"""Two-view geometry on normalised coordinates: triangulation, parallax, rotation-only fit, 5-point.

All inputs are undistorted normalised coordinates ``(x/z, y/z)``; poses are ``cam_from_world``
``(4, 4)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

__all__ = [
    "RelativeMotion",
    "bearings",
    "estimate_relative_motion",
    "parallax_deg",
    "reprojection_error",
    "rotation_between",
    "triangulate",
]

logger = logging.getLogger(__name__)


def bearings(xy: np.ndarray) -> np.ndarray:
    """Unit rays ``(N, 3)`` of normalised coordinates ``(N, 2)``."""
    rays = np.column_stack([xy, np.ones(len(xy))])
    return rays / np.linalg.norm(rays, axis=1, keepdims=True)


def parallax_deg(xy_a: np.ndarray, xy_b: np.ndarray, b_from_a_rot: np.ndarray) -> np.ndarray:
    """Rotation-compensated angle between matched rays, degrees, shape ``(N,)``."""
    cos = np.sum((bearings(xy_a) @ b_from_a_rot.T) * bearings(xy_b), axis=1)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def rotation_between(xy_a: np.ndarray, xy_b: np.ndarray, inlier_deg: float = 0.5) -> np.ndarray:
    """Rotation ``b_from_a`` that best maps rays of view a onto view b (pure-rotation model).

    Kabsch fit, then one refit on the rays within ``inlier_deg`` of the first fit.

    Args:
        xy_a: normalised coordinates in view a, ``(N, 2)``, N >= 3.
        xy_b: matched coordinates in view b, ``(N, 2)``.
        inlier_deg: residual angle below which a ray pair is kept for the refit.

    Returns:
        Rotation matrix ``(3, 3)``.
    """
    ra, rb = bearings(xy_a), bearings(xy_b)
    keep = np.ones(len(ra), dtype=bool)
    rot = np.eye(3)
    for _ in range(2):
        u, _, vt = np.linalg.svd(rb[keep].T @ ra[keep])
        d = np.sign(np.linalg.det(u @ vt))
        rot = u @ np.diag([1.0, 1.0, d]) @ vt
        resid = parallax_deg(xy_a, xy_b, rot)
        if np.count_nonzero(resid < inlier_deg) < 3:
            break
        keep = resid < inlier_deg
    return rot


def reprojection_error(cam_from_world: np.ndarray, x_in_world: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """Distance of points ``(N, 3)`` projected by ``cam_from_world (4, 4)`` to ``xy (N, 2)``, ``(N,)``.

    Normalised units; infinite for a point not in front of the camera.
    """
    x_in_cam = x_in_world @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
    z = np.where(x_in_cam[:, 2] > 0, x_in_cam[:, 2], np.nan)
    err = np.linalg.norm(x_in_cam[:, :2] / z[:, None] - xy, axis=1)
    return np.nan_to_num(err, nan=np.inf)


def triangulate(
    cam_from_world_a: np.ndarray, cam_from_world_b: np.ndarray, xy_a: np.ndarray, xy_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Linear (DLT) triangulation of matched rays from two views.

    Args:
        cam_from_world_a: pose of view a, ``(4, 4)``.
        cam_from_world_b: pose of view b, ``(4, 4)``.
        xy_a: normalised coordinates in view a, ``(N, 2)``.
        xy_b: normalised coordinates in view b, ``(N, 2)``.

    Returns:
        Points in world ``(N, 3)`` and a mask ``(N,)`` of points in front of both cameras.
    """
    pa, pb = cam_from_world_a[:3], cam_from_world_b[:3]
    a = np.stack(
        [
            xy_a[:, :1] * pa[2] - pa[0],
            xy_a[:, 1:] * pa[2] - pa[1],
            xy_b[:, :1] * pb[2] - pb[0],
            xy_b[:, 1:] * pb[2] - pb[1],
        ],
        axis=1,
    )  # (N, 4, 4)
    _, _, vt = np.linalg.svd(a)
    hom = vt[:, -1]
    w = hom[:, 3:]
    ok = np.abs(w[:, 0]) > 1e-12
    x_in_world = hom[:, :3] / np.where(ok[:, None], w, 1.0)
    za = x_in_world @ pa[2, :3] + pa[2, 3]
    zb = x_in_world @ pb[2, :3] + pb[2, 3]
    return x_in_world, ok & (za > 0) & (zb > 0)


@dataclass
class RelativeMotion:
    """Result of the 5-point initialisation between a reference view and a current view.

    Attributes:
        cur_from_ref: pose of the current view relative to the reference, unit baseline, ``(4, 4)``.
        inliers: correspondences consistent with the essential matrix and in front of both views, ``(N,)``.
        median_parallax_deg: median triangulation angle of the inliers, degrees.
    """

    cur_from_ref: np.ndarray
    inliers: np.ndarray
    median_parallax_deg: float


def estimate_relative_motion(
    xy_ref: np.ndarray, xy_cur: np.ndarray, threshold: float, seed: int = 0
) -> RelativeMotion | None:
    """5-point RANSAC essential matrix and cheirality check.

    Args:
        xy_ref: normalised coordinates in the reference view, ``(N, 2)``, N >= 5.
        xy_cur: matched coordinates in the current view, ``(N, 2)``.
        threshold: RANSAC threshold in normalised units (pixels / focal).
        seed: seed of OpenCV's RNG, for reproducible results.

    Returns:
        The relative motion, or None when no essential matrix is found (a normal outcome for too few
        or degenerate matches, not an error).
    """
    cv2.setRNGSeed(seed)
    e_mat, mask = cv2.findEssentialMat(xy_ref, xy_cur, np.eye(3), cv2.RANSAC, 0.999, threshold)
    if e_mat is None or e_mat.shape != (3, 3):
        return None
    _, rot, t, mask = cv2.recoverPose(e_mat, xy_ref, xy_cur, np.eye(3), mask=mask.copy())
    inliers = mask.ravel() > 0
    if np.count_nonzero(inliers) < 5:
        return None
    cur_from_ref = np.eye(4)
    cur_from_ref[:3, :3], cur_from_ref[:3, 3] = rot, t.ravel() / np.linalg.norm(t)
    par = parallax_deg(xy_ref[inliers], xy_cur[inliers], rot)
    return RelativeMotion(cur_from_ref, inliers, float(np.median(par)))
