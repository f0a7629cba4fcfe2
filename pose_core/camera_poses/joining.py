"""The similarity between two maps of one place (joining maps, closing loops).

Two monocular maps of one place differ by a similarity; so do the drifted and the true position of
a revisited place. ``similarity_from_views``: one frame posed in both maps (tracked in the source,
relocalised in the target) fixes the rotation and translation; the scale is the median ratio of
the depths, in that frame, of point pairs known to be one place (the same track, or an appearance
match PnP confirmed). This stays right where the newest points' depths are still noisy (a low
baseline: the typical state of a map where a loop is found), which a 3-D point-set fit does not
(measured on the hard synthetic preset: pairs seen within 0.3 deg of each other, depth ratios
0.47-0.91, Umeyama residuals 39 % of the spread). ``fit_sim3`` is the robust point-set fit
(evo's ``umeyama_alignment``, refitted on the points within ``inlier_ratio`` times the median
residual), for pairs whose depths are both well determined.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from evo.core.geometry import GeometryException, umeyama_alignment

from pose_core.geometry.sim3 import sim3_from_parts

__all__ = ["JoinOptions", "SegmentJoin", "fit_sim3", "similarity_from_views"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinOptions:
    """Knobs of the similarity fit between point sets."""

    # minimum point pairs needed to estimate the Sim(3)
    min_shared_points: int = 15
    # a point is an inlier when its residual is below this many times the median residual
    inlier_ratio: float = 3.0
    # the fit is rejected when the median residual exceeds this fraction of the median point distance
    # from the target points' centroid
    max_rel_residual: float = 0.05
    # a pair agrees with a view-based similarity when its two rays, in the frame, differ by less than
    # this, degrees ...
    max_ray_angle_deg: float = 2.0
    # ... and its depth ratio is within this factor of the median ratio
    max_depth_ratio_factor: float = 2.0
    # the scale is taken as 1 unless its log differs from 0 by more than this many standard errors (the
    # newest points' depths are noisy: a loop on a drift-free map otherwise "corrected" the scale by
    # 4-9 % on the synthetic table clip)
    scale_significance: float = 3.0


@dataclass(frozen=True)
class SegmentJoin:
    """One map merged into another (place recognition) or a loop closed within a map.

    Attributes:
        segment: the map that moved (its original id).
        joined_to: the map it joined (equal to ``segment`` for a loop closure within one map).
        frame_idx: the frame where the place was recognised.
        shared_points: point pairs used for the fit.
        inliers: pairs that agreed with the final fit.
        scale: scale of the applied ``dst_from_src``.
    """

    segment: int
    joined_to: int
    frame_idx: int
    shared_points: int
    inliers: int
    scale: float


def fit_sim3(p_src: np.ndarray, p_dst: np.ndarray, opts: JoinOptions) -> tuple[np.ndarray, np.ndarray] | None:
    """Robust ``dst_from_src`` similarity from point pairs.

    Args:
        p_src: points in the source frame, ``(N, 3)``.
        p_dst: the same places in the target frame, ``(N, 3)``.
        opts: options.

    Returns:
        The similarity ``(4, 4)`` and the inlier mask ``(N,)``, or None when the pairs do not agree.
    """
    keep = np.ones(len(p_src), bool)
    for _ in range(3):
        if np.count_nonzero(keep) < opts.min_shared_points:
            return None
        try:
            rot, t, scale = umeyama_alignment(p_src[keep].T, p_dst[keep].T, with_scale=True)
        except GeometryException:
            return None
        resid = np.linalg.norm(scale * p_src @ rot.T + t - p_dst, axis=1)
        keep = resid <= opts.inlier_ratio * np.median(resid[keep])
    spread = np.median(np.linalg.norm(p_dst - np.median(p_dst, axis=0), axis=1))
    if (
        np.count_nonzero(keep) < opts.min_shared_points
        or np.median(resid[keep]) > opts.max_rel_residual * spread
    ):
        return None
    return sim3_from_parts(float(scale), rot, t), keep


def similarity_from_views(
    src_cam_from_world: np.ndarray,
    dst_cam_from_world: np.ndarray,
    x_in_src: np.ndarray,
    x_in_dst: np.ndarray,
    opts: JoinOptions,
    depth_known: np.ndarray | None = None,
    scale_may_jump: bool = False,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``dst_from_src`` from one frame posed in both maps and point pairs seen in it.

    Args:
        src_cam_from_world: the frame's pose in the source map, ``(4, 4)``.
        dst_cam_from_world: its pose in the target map, ``(4, 4)``.
        x_in_src: points in the source map, ``(N, 3)``.
        x_in_dst: the same places in the target map, ``(N, 3)``.
        opts: options.
        depth_known: pairs whose source depth is well determined ``(N,)`` bool (seen with enough
            parallax); only these measure the scale when there are ``min_shared_points`` of them.
        scale_may_jump: the two maps' scales may differ by far more than drift (two maps, or a loop
            over a bridge whose scale was guessed). With too few well-determined pairs, all agreeing
            pairs then measure the scale (their noise is small beside such a jump); else it is 1.

    Returns:
        The similarity ``(4, 4)`` (``x_dst = s T_dst^-1 T_src x_src`` up to the camera-frame scale) and
        the pairs that agree with it ``(N,)``, or None with fewer than ``min_shared_points`` agreeing.
        Its scale ``s`` is the median depth ratio, or 1 when that is not significant.
    """
    x_src_cam = x_in_src @ src_cam_from_world[:3, :3].T + src_cam_from_world[:3, 3]
    x_dst_cam = x_in_dst @ dst_cam_from_world[:3, :3].T + dst_cam_from_world[:3, 3]
    n_src, n_dst = np.linalg.norm(x_src_cam, axis=1), np.linalg.norm(x_dst_cam, axis=1)
    cos = np.sum(x_src_cam * x_dst_cam, axis=1) / np.maximum(n_src * n_dst, 1e-12)
    front = (x_src_cam[:, 2] > 0) & (x_dst_cam[:, 2] > 0)
    keep = front & (np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))) < opts.max_ray_angle_deg)
    if np.count_nonzero(keep) < opts.min_shared_points:
        return None
    ratio = n_dst / np.maximum(n_src, 1e-12)
    scale = float(np.median(ratio[keep]))
    keep &= (ratio < scale * opts.max_depth_ratio_factor) & (ratio > scale / opts.max_depth_ratio_factor)
    if np.count_nonzero(keep) < opts.min_shared_points:
        return None
    measured = keep if depth_known is None else keep & depth_known
    if np.count_nonzero(measured) < opts.min_shared_points:
        if not scale_may_jump:
            return _similarity(1.0, src_cam_from_world, dst_cam_from_world), keep
        measured = keep
    log_ratio = np.log(ratio[measured])
    scale = float(np.exp(np.median(log_ratio)))
    std_err = 1.2533 * float(np.std(log_ratio)) / np.sqrt(len(log_ratio))  # of the median
    if abs(np.log(scale)) < opts.scale_significance * std_err:
        scale = 1.0
    return _similarity(scale, src_cam_from_world, dst_cam_from_world), keep


def _similarity(scale: float, src_cam_from_world: np.ndarray, dst_cam_from_world: np.ndarray) -> np.ndarray:
    """``dst_from_src`` putting the source frame's camera on the target one, camera units times ``scale``."""
    return np.linalg.inv(dst_cam_from_world) @ np.diag([scale, scale, scale, 1.0]) @ src_cam_from_world
