"""The map tracking builds: keyframes, triangulated points keyed by track id, and their refinement.

``MapPoints`` holds the points of every map (growable arrays, one row per point, plus a track id ->
point index table). A point also carries two ORB descriptors of its track, its first and its latest
look (for relocalisation after a short loss the latest matches best, for a place revisited later
the first: the latest look is often the blurred, oblique view of the turn that left the place),
the keyframe that created it (loop correction moves a point with it) and, after relocalisation or
merging, further track ids that see it (``aliases``). ``FirstSeen`` remembers where each live track
was first seen in a keyframe so that a track is triangulated over the longest baseline it has, not
only inside the local window;
``refine_keyframes`` bundle-adjusts a list of keyframes (some held fixed) and drops outlier
observations. All poses are ``cam_from_world (4, 4)``; observations are undistorted normalised
coordinates ``(x/z, y/z)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pose_core.camera_poses.ba import BAOptions, BAProblem, BAResult, bundle_adjust
from pose_core.camera_poses.features import DESCRIPTOR_BYTES
from pose_core.camera_poses.place_index import KeyframeIndex
from pose_core.geometry.rigid3 import invert_rigid_matrices

__all__ = ["FirstSeen", "Keyframe", "MapPoints", "refine_keyframes"]

logger = logging.getLogger(__name__)

#: ``MapPoints.segment`` of a point merged into another one: never looked up again.
MERGED = -1


@dataclass
class Keyframe:
    """A keyframe of a map: pose and the map points it observes.

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
    """Growable map points with track id, map (``segment``), descriptor and creating keyframe."""

    def __init__(self) -> None:
        self.n = 0
        self.points = np.zeros((1024, 3))
        self.track_id = np.zeros(1024, np.int64)
        self.segment = np.zeros(1024, np.int32)
        self.ref_keyframe = np.zeros(1024, np.int64)
        self.oldest_observer = np.zeros(1024, np.int64)  # no keyframe before this one sees the point
        self.descriptor = np.zeros((1024, DESCRIPTOR_BYTES), np.uint8)  # latest look
        self.first_descriptor = np.zeros((1024, DESCRIPTOR_BYTES), np.uint8)
        self.has_descriptor = np.zeros(1024, bool)
        self.aliases: dict[int, int] = {}  # further track id -> point
        self._aliased_to: dict[int, set[int]] = {}  # point -> the further track ids that see it
        self._by_track: dict[int, int] = {}

    def lookup(self, track_ids: np.ndarray, segment: int) -> np.ndarray:
        """Map point of each track in map ``segment``, -1 where there is none, ``(N,)`` int64."""
        get = self._by_track.get
        out = np.fromiter((get(t, -1) for t in track_ids.tolist()), np.int64, len(track_ids))
        out[(out >= 0) & (self.segment[np.maximum(out, 0)] != segment)] = -1
        return out

    def add(
        self, x_in_world: np.ndarray, track_ids: np.ndarray, segment: int, ref_keyframe: int
    ) -> np.ndarray:
        """Append points ``(K, 3)`` of ``track_ids (K,)``; returns their indices ``(K,)``."""
        k = len(x_in_world)
        while self.n + k > len(self.points):
            for name in (
                "points",
                "track_id",
                "segment",
                "ref_keyframe",
                "oldest_observer",
                "descriptor",
                "first_descriptor",
                "has_descriptor",
            ):
                arr = getattr(self, name)
                setattr(self, name, np.concatenate([arr, np.zeros_like(arr)]))
        idx = np.arange(self.n, self.n + k)
        self.points[idx], self.track_id[idx], self.segment[idx] = x_in_world, track_ids, segment
        self.ref_keyframe[idx], self.has_descriptor[idx] = ref_keyframe, False
        self.oldest_observer[idx] = ref_keyframe
        self._by_track.update(zip(track_ids.tolist(), idx.tolist(), strict=True))
        self.n += k
        return idx

    def alias(self, track_ids: np.ndarray, point_idx: np.ndarray) -> None:
        """Let ``track_ids (K,)`` see the existing points ``point_idx (K,)`` (relocalisation, merges)."""
        pairs = dict(zip(track_ids.tolist(), point_idx.tolist(), strict=True))
        self._by_track.update(pairs)
        self._index_aliases(pairs)
        self.aliases.update(pairs)

    def _index_aliases(self, pairs: dict[int, int]) -> None:
        """Keep ``_aliased_to`` in step with ``aliases`` about to be updated by ``pairs`` (track -> point)."""
        for track, point in pairs.items():
            before = self.aliases.get(track)
            if before is not None:
                self._aliased_to[before].discard(track)
            self._aliased_to.setdefault(point, set()).add(track)

    def merge(self, dup_idx: np.ndarray, into_idx: np.ndarray) -> None:
        """Merge points ``dup_idx (K,)`` into ``into_idx (K,)``: their tracks see the kept points."""
        remap = dict(zip(dup_idx.tolist(), into_idx.tolist(), strict=True))
        # the further tracks of a merged point follow it
        followers = {t: remap[p] for p in remap for t in self._aliased_to.get(p, ())}
        self.alias(self.track_id[dup_idx], into_idx)
        self._by_track.update(followers)
        self._index_aliases(followers)
        self.aliases.update(followers)
        self.segment[dup_idx] = MERGED
        np.minimum.at(self.oldest_observer, into_idx, self.oldest_observer[dup_idx])

    def set_descriptors(self, point_idx: np.ndarray, descriptors: np.ndarray) -> None:
        """Store the latest descriptors ``(K, 32)`` of points ``(K,)`` (the first one too, if it is)."""
        first = point_idx[~self.has_descriptor[point_idx]]
        self.first_descriptor[first] = descriptors[~self.has_descriptor[point_idx]]
        self.descriptor[point_idx], self.has_descriptor[point_idx] = descriptors, True

    def live(self) -> np.ndarray:
        """Indices of the points not merged into another, ``(P,)``."""
        return np.nonzero(self.segment[: self.n] != MERGED)[0]


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
    keyframes: list[Keyframe],
    points: np.ndarray,
    focal_px: float,
    fixed: np.ndarray | int,
    opts: BAOptions,
    outlier_px: float,
    refine_focal: bool = False,
    refine_radial: bool = False,
) -> BAResult | None:
    """Bundle-adjust keyframes and the points they observe, in place; drop outlier observations.

    Args:
        keyframes: keyframes, oldest first; poses and observations are updated.
        points: all map points ``(P, 3)``; the observed ones are updated.
        focal_px: focal length, pixels.
        fixed: which keyframes keep their pose: a bool mask ``(len(keyframes),)``, or an int ``n``
            for the first ``n``. With fewer than two fixed keyframes the scale is fixed too (the
            largest translation coordinate of the first free keyframe relative to the first one).
        opts: solver options.
        outlier_px: observations with a final residual above this are removed from the keyframes.
            Points seen by only one of ``keyframes`` are left out of the problem (no depth constraint).
        refine_focal: also refine the focal length (see ``bundle_adjust``); the keyframes' observations
            stay normalised with the given focal (the caller renormalises them to the refined camera).
        refine_radial: with ``refine_focal``, also refine a radial coefficient ``k1``.

    Returns:
        The solver result, or None when there is nothing to adjust (fewer than two keyframes, or no
        point seen twice).
    """
    if len(keyframes) < 2:
        return None
    cam_idx = np.repeat(np.arange(len(keyframes)), [len(k.point_idx) for k in keyframes])
    glob_pt = np.concatenate([k.point_idx for k in keyframes])
    _, local_pt, views = np.unique(glob_pt, return_inverse=True, return_counts=True)
    multi = views[local_pt] >= 2  # a point seen once here has no depth constraint: held fixed, left out
    if not multi.any():
        return None
    used, local_pt = np.unique(glob_pt[multi], return_inverse=True)
    cfw = np.stack([k.cam_from_world for k in keyframes])
    fixed_kf = np.zeros(len(keyframes), bool)
    if isinstance(fixed, (int, np.integer)):
        fixed_kf[: max(int(fixed), 1)] = True
    else:
        fixed_kf[:] = fixed
    if not fixed_kf.any():
        fixed_kf[0] = True
    params = np.repeat(fixed_kf[:, None], 6, axis=1)
    if np.count_nonzero(fixed_kf) < 2 and not fixed_kf.all():
        ref, free = int(np.argmax(fixed_kf)), int(np.argmin(fixed_kf))
        rel_t = (cfw[free] @ invert_rigid_matrices(cfw[ref]))[:3, 3]
        params[free, 3 + int(np.argmax(np.abs(rel_t)))] = True
    xy = np.concatenate([k.xy for k in keyframes])[multi]
    prob = BAProblem(
        cfw[:, :3, :3].copy(),
        cfw[:, :3, 3].copy(),
        points[used].copy(),
        cam_idx[multi],
        local_pt,
        xy,
        params,
        focal_px,
        refine_focal,
        refine_radial,
    )
    res = bundle_adjust(prob, opts)
    points[used] = res.points
    keep = np.ones(len(glob_pt), bool)
    keep[multi] = res.residual_px < outlier_px
    start = 0
    for i, k in enumerate(keyframes):
        k.cam_from_world = np.eye(4)
        k.cam_from_world[:3, :3], k.cam_from_world[:3, 3] = res.rotation[i], res.translation[i]
        sel = keep[start : start + len(k.point_idx)]
        k.point_idx, k.xy = k.point_idx[sel], k.xy[sel]
        start += len(sel)
    return res


@dataclass
class FrameRow:
    """Tracking's record of one frame (``TrackingResult`` is built from these).

    Attributes:
        cam_from_world: pose ``(4, 4)``, NaN when the frame has none.
        state: ``TrackingState`` value.
        segment: map the pose is expressed in (maps merged later are relabelled at the end).
        is_keyframe: whether the frame is a keyframe.
        num_inliers: map-point inliers (shared rays before initialisation).
        reproj_error_px: RMS reprojection error of the inliers, NaN when unknown.
    """

    cam_from_world: np.ndarray
    state: int
    segment: int
    is_keyframe: bool
    num_inliers: int
    reproj_error_px: float


@dataclass
class Atlas:
    """Every map of an episode (ORB-SLAM's Atlas): keyframes, their map, the points and the frame rows.

    Keyframes of all maps share one list in frame order (``keyframe_segment`` says whose they are);
    points carry their map in ``points.segment``; frame rows carry the map their pose is in.
    ``bridges`` are pairs of consecutive keyframes of one map (indices into ``keyframes``) joined by
    a turn tracked by rotation alone: their relative rotation is known, their relative translation
    and scale only guessed. ``loop_anchors`` holds, per map, the keyframe (index into ``keyframes``)
    where it was last corrected for a loop; ``place_index`` retrieves keyframes by appearance.
    """

    points: MapPoints
    keyframes: list[Keyframe]
    keyframe_segment: list[int]
    rows: list[FrameRow]
    bridges: list[tuple[int, int]] = field(default_factory=list)
    loop_anchors: dict[int, int] = field(default_factory=dict)
    place_index: KeyframeIndex = field(default_factory=KeyframeIndex)

    @classmethod
    def empty(cls) -> Atlas:
        """An atlas without maps."""
        return cls(MapPoints(), [], [], [])

    def segment_keyframes(self, segment: int) -> list[int]:
        """Indices (into ``keyframes``) of the keyframes of map ``segment``, oldest first."""
        return [i for i, s in enumerate(self.keyframe_segment) if s == segment]

    def segment_points(self, segment: int) -> np.ndarray:
        """Indices of the (unmerged) points of map ``segment``."""
        return np.nonzero(self.points.segment[: self.points.n] == segment)[0]

    def merge_points(self, dup_idx: np.ndarray, into_idx: np.ndarray) -> None:
        """Merge points ``dup_idx (K,)`` into ``into_idx (K,)`` in the points and every keyframe.

        Only the keyframes from the points' oldest observer on are visited: a long map's merges cost
        the keyframes that can see the points, not all of them.
        """
        if len(dup_idx) == 0:
            return
        oldest = int(self.points.oldest_observer[dup_idx].min())  # no keyframe before it sees them
        self.points.merge(dup_idx, into_idx)
        remap = np.arange(self.points.n)
        remap[dup_idx] = into_idx
        for kf in self.keyframes[oldest:]:
            idx = remap[kf.point_idx]
            _, first = np.unique(idx, return_index=True)  # a keyframe sees a point once
            first.sort()
            kf.point_idx, kf.xy = idx[first], kf.xy[first]
