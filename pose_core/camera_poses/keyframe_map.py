"""The map tracking builds: keyframes, triangulated points keyed by track id, and their refinement.

``MapPoints`` holds the points of every segment (growable arrays, one row per point, plus a
track id -> point index table); ``FirstSeen`` remembers where each live track was first seen in a
keyframe so that a track is triangulated over the longest baseline it has, not only inside the
local window; ``refine_keyframes`` bundle-adjusts a list of keyframes and drops outlier
observations. All poses are ``cam_from_world (4, 4)``; observations are undistorted normalised
coordinates ``(x/z, y/z)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from pose_core.camera_poses.ba import BAOptions, BAProblem, BAResult, bundle_adjust
from pose_core.geometry.rigid3 import invert_rigid_matrices

__all__ = ["FirstSeen", "Keyframe", "MapPoints", "refine_keyframes"]

logger = logging.getLogger(__name__)


@dataclass
class Keyframe:
    """A keyframe of a segment: pose and the map points it observes.

    Attributes:
        frame_idx: frame index.
        cam_from_world: pose, ``(4, 4)``.
        point_idx: map point of each observation, ``(K,)``.
        xy: normalised observation, ``(K, 2)``.
    """

    frame_idx: int
    cam_from_world: np.ndarray
    point_idx: np.ndarray
    xy: np.ndarray


class MapPoints:
    """Growable map points with their track id and segment; track id -> latest point."""

    def __init__(self) -> None:
        self.points = np.zeros((1024, 3))
        self.track_id = np.zeros(1024, np.int64)
        self.segment = np.zeros(1024, np.int32)
        self.n = 0
        self._by_track: dict[int, int] = {}

    def lookup(self, track_ids: np.ndarray, segment: int) -> np.ndarray:
        """Map point of each track in ``segment``, -1 where there is none, ``(N,)`` int64."""
        get = self._by_track.get
        out = np.fromiter((get(t, -1) for t in track_ids.tolist()), np.int64, len(track_ids))
        out[(out >= 0) & (self.segment[np.maximum(out, 0)] != segment)] = -1
        return out

    def add(self, x_in_world: np.ndarray, track_ids: np.ndarray, segment: int) -> np.ndarray:
        """Append points ``(K, 3)`` of ``track_ids (K,)``; returns their indices ``(K,)``."""
        k = len(x_in_world)
        while self.n + k > len(self.points):
            self.points = np.concatenate([self.points, np.zeros_like(self.points)])
            self.track_id = np.concatenate([self.track_id, np.zeros_like(self.track_id)])
            self.segment = np.concatenate([self.segment, np.zeros_like(self.segment)])
        idx = np.arange(self.n, self.n + k)
        self.points[idx], self.track_id[idx], self.segment[idx] = x_in_world, track_ids, segment
        self._by_track.update(zip(track_ids.tolist(), idx.tolist(), strict=True))
        self.n += k
        return idx


class FirstSeen:
    """For each live track: the keyframe (list index) where it was first seen and its coordinates there.

    Only tracks alive at the latest keyframe are kept, so memory is bounded by the live tracks.
    """

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.keyframe = np.zeros(0, np.int64)
        self.xy = np.zeros((0, 2))

    def lookup(self, track_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keyframe index (-1 when unseen) ``(N,)`` and first coordinates ``(N, 2)`` of ``track_ids``."""
        if len(self.ids) == 0:
            return np.full(len(track_ids), -1, np.int64), np.zeros((len(track_ids), 2))
        pos = np.minimum(np.searchsorted(self.ids, track_ids), len(self.ids) - 1)
        found = self.ids[pos] == track_ids
        return np.where(found, self.keyframe[pos], -1), self.xy[pos]

    def update(self, keyframe: int, track_ids: np.ndarray, xy: np.ndarray) -> None:
        """Record the tracks of a new keyframe: keep first sightings of known tracks, add new ones."""
        kf, old_xy = self.lookup(track_ids)
        new = kf < 0
        order = np.argsort(track_ids)
        self.ids = track_ids[order]
        self.keyframe = np.where(new, keyframe, kf)[order]
        self.xy = np.where(new[:, None], xy, old_xy)[order]


def refine_keyframes(
    keyframes: list[Keyframe], points: np.ndarray, focal_px: float, n_fixed: int,
    opts: BAOptions, outlier_px: float, refine_focal: bool = False,
) -> BAResult | None:
    """Bundle-adjust keyframes and the points they observe, in place; drop outlier observations.

    Args:
        keyframes: keyframes of one segment, oldest first; poses and observations are updated.
        points: all map points ``(P, 3)``; the observed ones are updated.
        focal_px: focal length, pixels.
        n_fixed: 1 fixes the first keyframe and the scale (largest translation coordinate of the
            second); 2 fixes the first two keyframes.
        opts: solver options.
        outlier_px: observations with a final residual above this are removed from the keyframes.
            Points seen by only one of ``keyframes`` are left out of the problem (no depth constraint).
        refine_focal: also refine the focal length (see ``bundle_adjust``); when the refined focal is
            accepted the keyframes' observations are renormalised with it (divided by ``focal_scale``).

    Returns:
        The solver result, or None when there are fewer than two keyframes (nothing to adjust).
    """
    if len(keyframes) < 2:
        return None
    cam_idx = np.repeat(np.arange(len(keyframes)), [len(k.point_idx) for k in keyframes])
    glob_pt = np.concatenate([k.point_idx for k in keyframes])
    used, local_pt, views = np.unique(glob_pt, return_inverse=True, return_counts=True)
    multi = views[local_pt] >= 2  # a point seen once here has no depth constraint: held fixed, left out
    used, local_pt = np.unique(glob_pt[multi], return_inverse=True)
    cfw = np.stack([k.cam_from_world for k in keyframes])
    fixed = np.zeros((len(keyframes), 6), dtype=bool)
    fixed[0] = True
    if n_fixed >= 2:
        fixed[1] = True
    else:
        rel_t = (cfw[1] @ invert_rigid_matrices(cfw[0]))[:3, 3]
        fixed[1, 3 + int(np.argmax(np.abs(rel_t)))] = True
    xy = np.concatenate([k.xy for k in keyframes])[multi]
    prob = BAProblem(cfw[:, :3, :3].copy(), cfw[:, :3, 3].copy(), points[used].copy(), cam_idx[multi],
                     local_pt, xy, fixed, focal_px, refine_focal)
    res = bundle_adjust(prob, opts)
    points[used] = res.points
    keep = np.ones(len(glob_pt), bool)
    keep[multi] = res.residual_px < outlier_px
    start = 0
    for i, k in enumerate(keyframes):
        k.cam_from_world = np.eye(4)
        k.cam_from_world[:3, :3], k.cam_from_world[:3, 3] = res.rotation[i], res.translation[i]
        sel = keep[start:start + len(k.point_idx)]
        k.point_idx, k.xy = k.point_idx[sel], k.xy[sel] / res.focal_scale
        start += len(sel)
    return res
