"""Join tracking segments after a loss: a Sim(3) between the two segments' maps on re-observed tracks.

A segment starts after tracking was lost; its world frame is anchored at the last good pose and its
scale is a guess. When KLT tracks survived the loss (the map ran out of points, the image did not go
dark), the same track ids have map points in both segments. A robust Umeyama fit (evo's
``umeyama_alignment``, refitted on the points within ``inlier_ratio`` times the median residual)
gives ``old_from_new`` (scale, rotation, translation); the new segment's keyframes, points and
frame poses are moved into the old segment's frame and scale, its duplicate points are merged into
the old ones (so global BA ties the two), and it takes the old segment's id. Segments that share too
few points keep their own id: their poses are labelled as a separate segment, not joined.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from evo.core.geometry import GeometryException, umeyama_alignment

from pose_core.geometry.rigid3 import invert_rigid_matrices

if TYPE_CHECKING:
    from pose_core.camera_poses.tracking import TrackingResult

__all__ = ["JoinOptions", "SegmentJoin", "join_segments"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinOptions:
    """Knobs of segment joining."""

    # minimum points (same track id in both segments) needed to estimate the Sim(3)
    min_shared_points: int = 15
    # a point is an inlier when its residual is below this many times the median residual
    inlier_ratio: float = 3.0
    # the fit is rejected when the median residual exceeds this fraction of the median point distance
    # from the old segment's centroid
    max_rel_residual: float = 0.05


@dataclass(frozen=True)
class SegmentJoin:
    """Outcome of joining one segment to its predecessor.

    Attributes:
        segment: the segment's original id.
        joined_to: the id it now carries (its predecessor's), or its own id when not joined.
        shared_points: tracks with a map point in both segments.
        inliers: points used by the final fit.
        scale: scale of ``old_from_new`` (NaN when not joined).
    """

    segment: int
    joined_to: int
    shared_points: int
    inliers: int
    scale: float


def _fit_sim3(p_new: np.ndarray, p_old: np.ndarray, opts: JoinOptions) -> tuple[np.ndarray, int] | None:
    """Robust ``old_from_new`` as a ``(4, 4)`` similarity matrix and its inlier count, or None."""
    keep = np.ones(len(p_new), bool)
    for _ in range(3):
        if np.count_nonzero(keep) < opts.min_shared_points:
            return None
        try:
            rot, t, scale = umeyama_alignment(p_new[keep].T, p_old[keep].T, with_scale=True)
        except GeometryException:
            return None
        resid = np.linalg.norm(scale * p_new @ rot.T + t - p_old, axis=1)
        keep = resid <= opts.inlier_ratio * np.median(resid[keep])
    spread = np.median(np.linalg.norm(p_old - np.median(p_old, axis=0), axis=1))
    if np.median(resid[keep]) > opts.max_rel_residual * spread:
        return None
    sim = np.eye(4)
    sim[:3, :3], sim[:3, 3] = scale * rot, t
    return sim, int(np.count_nonzero(keep))


def _apply(result: TrackingResult, seg: int, target: int, sim: np.ndarray,
           duplicates: tuple[np.ndarray, np.ndarray]) -> None:
    """Move segment ``seg`` into ``target``'s frame by ``old_from_new = sim`` and merge duplicates.

    ``duplicates`` is ``(new point indices, old point indices)`` of the tracks seen in both maps.
    """
    dup_new, dup_old = duplicates
    scale = np.cbrt(np.linalg.det(sim[:3, :3]))
    rot, t = sim[:3, :3] / scale, sim[:3, 3]
    new_from_old = np.eye(4)  # rigid part acting on camera poses: cam_from_old = cam_from_new @ new_from_old
    new_from_old[:3, :3], new_from_old[:3, 3] = rot.T, -rot.T @ t / scale
    frames = result.segment_id == seg
    cfw = invert_rigid_matrices(result.world_from_cam[frames]) @ new_from_old
    cfw[:, :3, 3] *= scale
    result.world_from_cam[frames] = invert_rigid_matrices(cfw)
    pts = result.point_segment == seg
    result.points_in_world[pts] = result.points_in_world[pts] @ sim[:3, :3].T + t
    remap = np.arange(len(result.point_segment))
    remap[dup_new] = dup_old
    for k in result.keyframes:
        if result.segment_id[k.frame_idx] == seg:
            k.cam_from_world = k.cam_from_world @ new_from_old
            k.cam_from_world[:3, 3] *= scale
            k.point_idx = remap[k.point_idx]
    result.point_segment[pts] = target
    result.point_segment[dup_new] = -1  # merged into the old point: never looked up again
    result.segment_id[frames] = target


def join_segments(result: TrackingResult, opts: JoinOptions | None = None) -> list[SegmentJoin]:
    """Join each segment to the one before it where their maps share enough tracks; in place.

    Args:
        result: output of ``track_episode``; poses, points, keyframes and segment ids are updated.
        opts: options.

    Returns:
        One ``SegmentJoin`` per segment after the first, in order.
    """
    opts = opts or JoinOptions()
    report = []
    for seg in range(1, int(result.segment_id.max(initial=0)) + 1):
        first = int(np.argmax(result.segment_id == seg))
        target = int(result.segment_id[first - 1])
        new_idx = np.nonzero(result.point_segment == seg)[0]
        old_idx = np.nonzero(result.point_segment == target)[0]
        _, ia, ib = np.intersect1d(result.point_track_id[new_idx], result.point_track_id[old_idx],
                                   return_indices=True)
        dup_new, dup_old = new_idx[ia], old_idx[ib]
        fit = _fit_sim3(result.points_in_world[dup_new], result.points_in_world[dup_old], opts) \
            if len(ia) >= opts.min_shared_points else None
        if fit is None:
            report.append(SegmentJoin(seg, seg, len(ia), 0, float("nan")))
            logger.info("segment %d not joined: %d shared points", seg, len(ia))
            continue
        sim, n_in = fit
        _apply(result, seg, target, sim, (dup_new, dup_old))
        report.append(SegmentJoin(seg, target, len(ia), n_in, float(np.cbrt(np.linalg.det(sim[:3, :3])))))
        logger.info("segment %d joined to %d on %d/%d points", seg, target, n_in, len(ia))
    return report
