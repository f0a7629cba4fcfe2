"""Monocular tracking over an atlas of maps: initialisation, PnP, keyframes, relocalisation, loops.

Per map: frames before initialisation get a rotation-only pose (state ``STATIC``: the camera is
still or only turning, no translation is invented). When the rotation-compensated parallax to the
reference frame exceeds ``init_min_parallax_deg`` a two-view motion (5-point or homography,
chosen by the frames in between: ``initialisation``) gives the first two keyframes and a
triangulated map; then each frame is tracked by robust motion-only optimisation (PnP RANSAC
as fallback) against the map. Keyframes add points (each track triangulated against the keyframe
where it was first seen: the longest baseline it has) and trigger a local BA over the newest
keyframes and the older ones that see the same points, with the keyframes around them held fixed.

A fast turn out of the map (too few map points in view) loses the map; the frames after it keep a
pose as long as their tracks fit a pure rotation from the previous frame (state ``ROTATION_ONLY``:
the rotation, the centre held at the last one known), so the head's turn is measured, not
invented or dropped. When the view then moves enough to
initialise a map and every frame since the loss was followed this way, the map continues (same id
and world frame) from the rotation-only pose, its new part's scale a guess: that link is a *bridge*,
whose scale and translation a loop closure may change freely (``loop_closing``). After frames with
no pose at all a new map starts instead, joined to an old one only where it sees the same place.
Bridging the turn with guessed points was tried and bent the scale (points at the depth of their
image neighbours gave the room seen after a turn from the table a scale 2-36 times the table's on
the hard synthetic preset; far points let the translation wander).

When too few map points are found, the frame is ``LOST``. Each following frame with descriptors is
relocalised against every map (appearance match + PnP, ``loop_closing.relocalise``); until that
works a new map may be initialised from the frames since the loss (anchored at the last good pose,
its scale from the previous map's keyframe spacing). While tracking, every
``place_check_every_frames`` frames the frame's descriptors are matched against the points it is
not tracking: another map seen again is merged into the older one, a revisited place of the same
map closes a loop (``loop_closing``). Maps that never meet keep their own ``segment_id``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import cv2
import numpy as np

from pose_core.camera_poses.ba import BAOptions, PoseFit, optimize_pose
from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.initialisation import (
    InitialisationOptions,
    ThirdView,
    choose_motion,
    homography_motions,
    score_motion,
)
from pose_core.camera_poses.joining import SegmentJoin
from pose_core.camera_poses.keyframe_map import MERGED, Atlas, FirstSeen, FrameRow, Keyframe, refine_keyframes
from pose_core.camera_poses.keyframes import KeyframeOptions, KeyframeSelector
from pose_core.camera_poses.loop_closing import LoopOptions, apply_place_match, recognise_place, relocalise
from pose_core.camera_poses.twoview import (
    RelativeMotion,
    estimate_relative_motion,
    parallax_deg,
    reprojection_error,
    rotation_between,
    triangulate,
)
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import invert_rigid_matrices

__all__ = ["TrackingOptions", "TrackingResult", "TrackingState", "track_episode"]

logger = logging.getLogger(__name__)

# The frame a new map starts from: its features, normalised points `(N, 2)` and cam_from_world `(4, 4)`.
_Reference = tuple[FrameFeatures, np.ndarray, np.ndarray]


class TrackingState(enum.IntEnum):
    """Tracking state of one frame."""

    LOST = 0  # no pose from tracking (completion fills it, flagged)
    STATIC = 1  # before the first map, no translation seen: rotation-only pose, camera centre held fixed
    TRACKING = 2  # pose from a map
    ROTATION_ONLY = 3  # no map in view (lost, or none yet while translating): rotation measured, centre held


@dataclass(frozen=True)
class TrackingOptions:
    """Knobs of tracking."""

    # median rotation-compensated parallax needed to initialise a map, degrees
    init_min_parallax_deg: float = 0.8
    # before a map exists a frame is STATIC (the camera does not translate) while its median parallax to
    # the reference stays below this, degrees (KLT noise: ~0.02); above it, ROTATION_ONLY
    static_max_parallax_deg: float = 0.3
    # inliers of the two-view motion needed to initialise
    init_min_inliers: int = 60
    # the choice between two-view motion hypotheses (5-point, homography) by the frames in between
    initialisation: InitialisationOptions = field(default_factory=InitialisationOptions)
    # minimum shared tracks with the reference frame before the reference is moved forward (while
    # uninitialised the reference also moves when fewer than `init_min_inliers` are shared: those
    # could never initialise)
    min_shared_tracks: int = 30
    # RANSAC threshold of 5-point and PnP, pixels
    ransac_px: float = 1.5
    # residual under which an observation counts as an inlier, pixels
    inlier_px: float = 3.0
    # minimum map-point inliers for a frame to count as tracked
    min_pnp_inliers: int = 25
    # minimum triangulation angle of a new map point, degrees
    min_triangulation_deg: float = 1.0
    # a keyframe is forced when fewer map points than this are tracked
    min_tracked_points: int = 120
    # after a loss, a frame is posed by rotation alone when this fraction of the tracks it shares with
    # the previous frame fit one rotation within `rotation_inlier_deg` (degrees)
    rotation_min_inlier_fraction: float = 0.7
    rotation_inlier_deg: float = 0.3
    # newest keyframes of the map optimised by the local BA ...
    local_ba_window: int = 6
    # ... plus up to this many older keyframes sharing at least `covisible_min_points` points with the
    # newest one; up to `local_ba_anchors` further keyframes observing the window's points are held fixed
    local_ba_covisible: int = 4
    covisible_min_points: int = 20
    local_ba_anchors: int = 4
    # older keyframes searched for covisibility (bounds the cost on long maps)
    local_ba_search: int = 40
    # after a loop correction, a BA of the map's newest `loop.max_corrected_keyframes` keyframes holds up to
    # this many older keyframes fixed, those that see most of the recognised points (`_loop_ba`)
    loop_ba_anchors: int = 10
    # frames before initialisation kept for re-tracking once the map exists
    max_pending_frames: int = 150
    # after a loss, relocalisation alone is tried for this many frames before a new map may start (the
    # frames in between are re-tracked by whichever map takes over)
    relocalise_before_new_map_frames: int = 10
    # while tracking, a frame with descriptors is checked against the places not tracked (loops, other
    # maps) when this many frames have passed since the last check; it becomes a keyframe
    place_check_every_frames: int = 15
    # relocalisation, place recognition, map merging and loop correction
    loop: LoopOptions = field(default_factory=LoopOptions)
    # keyframe selection
    keyframes: KeyframeOptions = field(default_factory=KeyframeOptions)
    # local bundle adjustment and motion-only pose fits (3 iterations: more cost ~40 % of the tracking time
    # and gave no better ATE on KITTI or the synthetic clip, bench/results/camera_poses.md); the reduced
    # system from observation pairs above 10k entries: local windows with their anchors hold thousands of
    # points, where the dense product cost 3x the tracking time (hard synthetic preset: 24.8 -> 7.1 CPU-s)
    ba: BAOptions = field(default_factory=lambda: BAOptions(max_iterations=3, dense_max_entries=10_000))


@dataclass
class TrackingResult:
    """Per-frame output of ``track_episode`` plus the map needed by global BA and completion.

    Attributes:
        world_from_cam: pose per frame, ``(F, 4, 4)``; NaN where ``state == LOST``.
        state: ``TrackingState`` per frame, ``(F,)`` int8.
        segment_id: map of each frame's pose, ``(F,)`` int32, numbered 0.. in order of appearance (a
            map joined to another carries that one's id).
        is_keyframe: keyframe flag, ``(F,)`` bool.
        num_inliers: map-point inliers (or shared rays while STATIC), ``(F,)`` int32.
        reproj_error_px: RMS reprojection error of the inliers, ``(F,)``; NaN when unknown.
        points_in_world: map points, ``(P, 3)``.
        point_track_id: track id of each map point, ``(P,)``.
        point_segment: map of each map point, ``(P,)``; -1 for a point merged into another.
        keyframes: keyframes in frame order, with their observations.
        point_aliases: further track id -> map point (relocalised and merged tracks).
        joins: maps joined and loops closed, in order.
        relocalisations: frames where tracking found a map again (by surviving tracks or by appearance)
            after the map was lost.
    """

    world_from_cam: np.ndarray
    state: np.ndarray
    segment_id: np.ndarray
    is_keyframe: np.ndarray
    num_inliers: np.ndarray
    reproj_error_px: np.ndarray
    points_in_world: np.ndarray
    point_track_id: np.ndarray
    point_segment: np.ndarray
    keyframes: list[Keyframe]
    point_aliases: dict[int, int] = field(default_factory=dict)
    joins: list[SegmentJoin] = field(default_factory=list)
    relocalisations: int = 0


class _Tracker:
    """Mutable state of ``track_episode``; one instance per episode."""

    def __init__(self, camera: Camera, opts: TrackingOptions) -> None:
        self.cam, self.opts, self.f = camera, opts, camera.focal_px
        self.atlas = Atlas.empty()
        self.map = self.atlas.points
        self.first_seen = FirstSeen()
        self.segment = -1  # current map; -1 while there is none (start, or lost)
        self.last_segment = -1  # the map tracked before the last loss
        self.n_segments = 0
        self.ref: _Reference | None = None
        self.ref_row = 0
        self.pending: list[tuple[int, FrameFeatures, np.ndarray]] = []  # row, features, xy without a pose
        self.anchor = np.eye(4)
        self.scale = 1.0
        self.prev: list[np.ndarray] = []
        self.selector = KeyframeSelector(opts.keyframes)
        self.track_desc: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros((0, 32), np.uint8))
        self.last_place_check = -(10**9)
        self.last_posed_frame = -1
        self.lost_at = -1
        self.last: tuple[FrameFeatures, np.ndarray, np.ndarray] | None = None  # previous frame, xy, pose
        self.joins: list[SegmentJoin] = []
        self.relocalisations = 0

    @property
    def keyframes(self) -> list[Keyframe]:
        return self.atlas.keyframes

    # ---- per frame -------------------------------------------------------------------------
    def step(self, feat: FrameFeatures) -> None:
        xy = self.cam.cam_ray_from_img(feat.uv_px.astype(np.float64))
        self._step(feat, xy)
        cfw = self.atlas.rows[-1].cam_from_world
        self.last = (feat, xy, cfw) if np.isfinite(cfw).all() else None

    def _step(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        if feat.descriptors is not None:
            self._note_descriptors(feat)
        if self.segment >= 0:
            self._step_tracking(feat, xy)
            return
        if self.ref is None:
            lost = bool(self.keyframes)
            cfw = self._rotated(feat, xy) if lost else self.anchor
            self._set_reference(feat, xy, cfw if np.isfinite(cfw).all() else self.anchor)
            self._record_without_map(cfw, len(xy), translating=lost)
            if lost:
                self.pending = [(len(self.atlas.rows) - 1, feat, xy)]
            return
        if self.keyframes and self._relocalise(feat, xy):
            return
        self._step_uninitialised(feat, xy, self.ref)

    def _record(self, cfw: np.ndarray, state: TrackingState, n: int, kf: bool, err: float) -> None:
        seg = self.segment if self.segment >= 0 else self.n_segments
        self.atlas.rows.append(FrameRow(cfw, int(state), seg, kf, n, err))
        if np.isfinite(cfw).all():
            self.prev = [*self.prev[-1:], cfw]
            self.last_posed_frame = len(self.atlas.rows) - 1

    def _note_descriptors(self, feat: FrameFeatures) -> None:
        """Keep the latest descriptor of each live track and of the points they see.

        The latest look of a place is the likeliest to be seen again soon.
        """
        idx, desc = feat.described()
        ids = feat.track_ids[idx]
        order = np.argsort(ids)
        self.track_desc = (ids[order], desc[order])
        if self.segment >= 0:
            pidx = self.map.lookup(ids, self.segment)
            self.map.set_descriptors(pidx[pidx >= 0], desc[pidx >= 0])

    def _describe_new_points(self, point_idx: np.ndarray, track_ids: np.ndarray) -> None:
        """Give new points the latest descriptor of their track, where it has one."""
        ids, desc = self.track_desc
        if len(ids) == 0 or len(point_idx) == 0:
            return
        pos = np.minimum(np.searchsorted(ids, track_ids), len(ids) - 1)
        found = ids[pos] == track_ids
        self.map.set_descriptors(point_idx[found], desc[pos[found]])

    def _set_reference(self, feat: FrameFeatures, xy: np.ndarray, cfw: np.ndarray) -> None:
        self.ref = (feat, xy, cfw)
        self.ref_row = len(self.atlas.rows)
        self.pending = []

    def _move_reference(self, feat: FrameFeatures, need: int, ref: _Reference) -> _Reference | None:
        """Move the reference ``ref`` to the oldest pending frame sharing `need` tracks with `feat`.

        Keeps as much of the baseline accrued so far as the surviving tracks allow (a slow start or a
        shard boundary thins the tracks shared with an old reference long before the parallax is
        enough). The old reference and the pending frames stay pending (re-tracked once the map
        exists). Returns the new reference; None when none shares enough.
        """
        for k, (row, cand, cand_xy) in enumerate(self.pending):
            if len(np.intersect1d(cand.track_ids, feat.track_ids, assume_unique=True)) >= need:
                old = (self.ref_row, ref[0], ref[1])
                ref_cfw = self.atlas.rows[row].cam_from_world
                if not np.isfinite(ref_cfw).all():  # after a loss: the new map is anchored at the last pose
                    ref_cfw = self.anchor
                self.ref, self.ref_row = (cand, cand_xy, ref_cfw), row
                self.pending = [old, *self.pending[:k], *self.pending[k + 1 :]]
                return self.ref
        return None

    def _step_uninitialised(self, feat: FrameFeatures, xy: np.ndarray, ref: _Reference) -> None:
        """Track against the reference ``ref`` (no map yet); initialise a map once the baseline allows."""
        lost = bool(self.keyframes)
        need = max(self.opts.min_shared_tracks, self.opts.init_min_inliers, 3)
        _, ia, ib = np.intersect1d(ref[0].track_ids, feat.track_ids, return_indices=True)
        if len(ia) < need:
            moved = self._move_reference(feat, need, ref)
            if moved is None:
                cfw = self._rotated(feat, xy)
                pending = [*self.pending, (self.ref_row, ref[0], ref[1])] if lost else []
                held = self.anchor if lost or not self.prev else self.prev[-1]
                self._set_reference(feat, xy, cfw if np.isfinite(cfw).all() else held)
                moving = bool(self.atlas.rows) and self.atlas.rows[-1].state == TrackingState.ROTATION_ONLY
                self._record_without_map(cfw, len(ia), translating=moving)
                self.pending = pending[-self.opts.max_pending_frames :]
                return
            ref = moved
            _, ia, ib = np.intersect1d(ref[0].track_ids, feat.track_ids, return_indices=True)
        ref_feat, ref_xy, ref_cfw = ref
        rot = rotation_between(ref_xy[ia], xy[ib])
        par = np.median(parallax_deg(ref_xy[ia], xy[ib], rot))
        waited = not lost or feat.frame_idx - self.lost_at >= self.opts.relocalise_before_new_map_frames
        if waited and par >= self.opts.init_min_parallax_deg and len(ia) >= self.opts.init_min_inliers:
            motion = self._initial_motion(feat, xy, ref, ia, ib)
            if motion is not None and self._initialise(feat, xy, ref, ia, ib, motion):
                return
        keep = self.pending[-self.opts.max_pending_frames + 1 :]
        self.pending = [*keep, (len(self.atlas.rows), feat, xy)]
        cfw = np.eye(4)
        cfw[:3, :3] = rot
        translating = par >= self.opts.static_max_parallax_deg
        self._record_without_map(_hold_centre(cfw @ ref_cfw, ref_cfw), len(ia), translating)

    def _initial_motion(
        self, feat: FrameFeatures, xy: np.ndarray, ref: _Reference, ia: np.ndarray, ib: np.ndarray
    ) -> RelativeMotion | None:
        """Motion from ``ref`` to ``feat`` (shared tracks ``ia``/``ib``); None without a 5-point one.

        The 5-point motion, replaced by a homography's when the pending frames in between support
        that one clearly better (``initialisation.choose_motion``).
        """
        o = self.opts
        threshold = o.ransac_px / self.f
        xy_ref, xy_cur = ref[1][ia], xy[ib]
        five_point = estimate_relative_motion(xy_ref, xy_cur, threshold)
        if five_point is None or np.count_nonzero(five_point.inliers) < o.init_min_inliers:
            return None  # a homography alone does not start a map: it only checks the 5-point motion
        scored = (
            score_motion(m, xy_ref, xy_cur, threshold) for m in homography_motions(xy_ref, xy_cur, threshold)
        )
        planar = [h for h in scored if np.count_nonzero(h.inliers) >= o.init_min_inliers]
        start, end = ref[0].frame_idx, feat.frame_idx
        between = sorted(
            (p for p in self.pending if start < p[1].frame_idx < end), key=lambda p: p[1].frame_idx
        )
        views = [ThirdView(p[1].track_ids, p[2]) for p in between]
        return choose_motion(
            five_point, planar, ref[0].track_ids[ia], xy_ref, xy_cur, views, threshold, o.initialisation
        )

    def _rotated(self, feat: FrameFeatures, xy: np.ndarray) -> np.ndarray:
        """Rotation-only pose of ``feat`` from the previous frame's (centre held), ``(4, 4)``.

        NaN when that frame has no pose or too few of its tracks fit one rotation (the camera moved, or
        the image changed).
        """
        o = self.opts
        nan = np.full((4, 4), np.nan)
        if self.last is None or self.last[0].frame_idx != feat.frame_idx - 1:
            return nan
        prev_feat, prev_xy, prev_cfw = self.last
        _, ia, ib = np.intersect1d(prev_feat.track_ids, feat.track_ids, return_indices=True)
        if len(ia) < o.min_shared_tracks:
            return nan
        rot = rotation_between(prev_xy[ia], xy[ib], o.rotation_inlier_deg)
        fits = parallax_deg(prev_xy[ia], xy[ib], rot) < o.rotation_inlier_deg
        if np.count_nonzero(fits) < o.rotation_min_inlier_fraction * len(ia):
            return nan
        cfw = np.eye(4)
        cfw[:3, :3] = rot
        return _hold_centre(cfw @ prev_cfw, prev_cfw)

    def _record_without_map(self, cfw: np.ndarray, n: int, translating: bool) -> None:
        """Record a frame posed by rotation alone (LOST when it has no pose).

        STATIC only before any map and while no translation is seen (rotation-compensated parallax
        below ``static_max_parallax_deg``); else ROTATION_ONLY: the rotation is measured, the
        translation is not.
        """
        if not np.isfinite(cfw).all():
            self._record(cfw, TrackingState.LOST, n, False, float("nan"))
            return
        moving = translating or bool(self.keyframes)
        state = TrackingState.ROTATION_ONLY if moving else TrackingState.STATIC
        self._record(cfw, state, n, False, float("nan"))

    def _initialise(
        self, feat: FrameFeatures, xy: np.ndarray, ref: _Reference, ia: np.ndarray, ib: np.ndarray,
        motion: RelativeMotion,
    ) -> bool:  # fmt: skip
        o = self.opts
        inl = motion.inliers
        if np.count_nonzero(inl) < o.init_min_inliers or motion.median_parallax_deg < o.init_min_parallax_deg:
            return False
        ref_feat, ref_xy, ref_cfw = ref
        cur_from_ref = motion.cur_from_ref.copy()
        cur_from_ref[:3, 3] *= self.scale
        cur_cfw = cur_from_ref @ ref_cfw
        ia, ib = ia[inl], ib[inl]
        pts, ok = triangulate(ref_cfw, cur_cfw, ref_xy[ia], xy[ib])
        ok &= parallax_deg(ref_xy[ia], xy[ib], cur_from_ref[:3, :3]) >= o.min_triangulation_deg / 2
        if np.count_nonzero(ok) < o.init_min_inliers:
            return False
        first_kf = len(self.keyframes)
        rows = self.atlas.rows[self.lost_at : self.ref_row + 1] if self.keyframes else []
        if rows and all(np.isfinite(r.cam_from_world).all() for r in rows):
            # the turn since the loss was followed frame by frame: the same map and world, its scale a guess
            self.segment = self.last_segment
            self.atlas.bridges.append((self.atlas.segment_keyframes(self.segment)[-1], first_kf))
        else:
            self.segment, self.n_segments = self.n_segments, self.n_segments + 1
        idx = self.map.add(pts[ok], ref_feat.track_ids[ia[ok]], self.segment, first_kf)
        self._describe_new_points(idx, ref_feat.track_ids[ia[ok]])
        self._append_keyframe(Keyframe(ref_feat.frame_idx, ref_cfw, idx, ref_xy[ia[ok]]), ref_feat)
        self._append_keyframe(Keyframe(feat.frame_idx, cur_cfw, idx, xy[ib[ok]]), feat)
        self.first_seen = FirstSeen()
        self.first_seen.update(first_kf, ref_feat.track_ids, ref_xy)
        self.first_seen.update(first_kf + 1, feat.track_ids, xy)
        self._local_ba()
        logger.info("map %d initialised at frame %d with %d points", self.segment, feat.frame_idx, len(idx))
        first = self.keyframes[-2].cam_from_world
        self.atlas.rows[self.ref_row] = FrameRow(
            first, int(TrackingState.TRACKING), self.segment, True, len(idx), float("nan")
        )
        self._retrack(self.pending, self.keyframes[-2].cam_from_world)
        self.selector = KeyframeSelector(o.keyframes)
        self.selector.force(feat)
        self.prev = []
        self._record(self.keyframes[-1].cam_from_world, TrackingState.TRACKING, len(idx), True, float("nan"))
        return True

    def _retrack(self, pending: list[tuple[int, FrameFeatures, np.ndarray]], start: np.ndarray) -> None:
        """Give frames without a pose one from the current map, chaining from ``start``."""
        for row, feat, xy in pending:
            pidx = self.map.lookup(feat.track_ids, self.segment)
            have = pidx >= 0
            if np.count_nonzero(have) < self.opts.min_pnp_inliers:
                continue
            fit = optimize_pose(
                start, self.map.points[pidx[have]], xy[have], self.f, self.opts.ba, self.opts.inlier_px
            )
            n_in = int(np.count_nonzero(fit.inliers))
            if n_in >= self.opts.min_pnp_inliers:
                self.atlas.rows[row] = FrameRow(
                    fit.cam_from_world, int(TrackingState.TRACKING), self.segment, False, n_in, fit.rms_px
                )
                start = fit.cam_from_world
        self.pending = []

    def _relocalise(self, feat: FrameFeatures, xy: np.ndarray) -> bool:
        """Find ``feat`` in a map again; on success tracking resumes there with it as a keyframe.

        First by its tracks (they may have outlived a frame that lost the map: a covered lens, a blur),
        in the map tracked last; then, on frames with descriptors, by appearance in every map.
        """
        o = self.opts
        seg = self.last_segment if self.segment < 0 else self.segment
        pidx = self.map.lookup(feat.track_ids, seg)
        fit = None
        if np.count_nonzero(pidx >= 0) >= o.min_pnp_inliers and len(self.prev):
            fit = self._pnp(pidx[pidx >= 0], xy[pidx >= 0])
        if fit is not None and np.count_nonzero(fit.inliers) >= o.min_pnp_inliers:
            cfw = fit.cam_from_world
        elif feat.descriptors is not None:
            found = relocalise(self.atlas, feat, xy, self.f, o.loop, self._prediction(seg, feat))
            if found is None:
                return False
            seg, loc = found
            self.map.alias(feat.track_ids[loc.query_idx], loc.point_idx)
            cfw = loc.cam_from_world
        else:
            return False
        self._resume(seg, feat, xy, cfw)
        return True

    def _prediction(self, seg: int, feat: FrameFeatures) -> tuple[int, np.ndarray, int] | None:
        """The map tracked last, the constant-velocity pose at ``feat`` in it, frames since its last pose."""
        if seg < 0 or not self.prev:
            return None
        frames = feat.frame_idx - self.last_posed_frame
        step = self.prev[-1] @ invert_rigid_matrices(self.prev[-2]) if len(self.prev) == 2 else np.eye(4)
        return seg, np.linalg.matrix_power(step, max(frames, 0)) @ self.prev[-1], frames

    def _resume(self, seg: int, feat: FrameFeatures, xy: np.ndarray, cam_from_world: np.ndarray) -> None:
        """Continue tracking map ``seg`` from ``feat`` (posed near ``cam_from_world``) as a new keyframe."""
        o = self.opts
        waiting = self.pending + ([(self.ref_row, self.ref[0], self.ref[1])] if self.ref is not None else [])
        pending = sorted((p for p in waiting if p[0] != len(self.atlas.rows)), key=lambda p: p[0])
        self.segment, self.relocalisations = seg, self.relocalisations + 1
        self.selector = KeyframeSelector(o.keyframes)
        self.selector.force(feat)
        pidx = self.map.lookup(feat.track_ids, seg)
        have = pidx >= 0
        fit = optimize_pose(cam_from_world, self.map.points[pidx[have]], xy[have], self.f, o.ba, o.inlier_px)
        self._add_keyframe(feat, xy, fit.cam_from_world, pidx, have, fit.inliers)
        cfw = self.keyframes[-1].cam_from_world
        n_in = int(np.count_nonzero(fit.inliers))
        logger.info("frame %d relocalised in map %d on %d points", feat.frame_idx, seg, n_in)
        self.prev = []
        self._record(cfw, TrackingState.TRACKING, n_in, True, fit.rms_px)
        self._retrack(pending[::-1], cfw)
        self.ref = None
        self.last_place_check = feat.frame_idx

    def _step_tracking(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        o = self.opts
        pidx = self.map.lookup(feat.track_ids, self.segment)
        have = pidx >= 0
        fit = None
        if np.count_nonzero(have) >= o.min_pnp_inliers:
            fit = self._pnp(pidx[have], xy[have])
        if fit is None or np.count_nonzero(fit.inliers) < o.min_pnp_inliers:
            if not (feat.descriptors is not None and self._relocalise(feat, xy)):
                self._lose(feat)
            return
        n_in = int(np.count_nonzero(fit.inliers))
        place_check = (
            feat.descriptors is not None
            and feat.frame_idx - self.last_place_check >= o.place_check_every_frames
        )
        is_kf = place_check or self.selector.wants(feat) or n_in < o.min_tracked_points
        cfw = fit.cam_from_world
        if is_kf:
            self.selector.force(feat)
            self._add_keyframe(feat, xy, cfw, pidx, have, fit.inliers)
            cfw = self.keyframes[-1].cam_from_world
        self._record(cfw, TrackingState.TRACKING, n_in, is_kf, fit.rms_px)
        if place_check:
            self._check_place(feat, xy)

    def _predicted(self) -> np.ndarray:
        """Constant-velocity ``cam_from_world`` of the next frame, ``(4, 4)``."""
        if len(self.prev) == 2:
            return self.prev[-1] @ invert_rigid_matrices(self.prev[-2]) @ self.prev[-1]
        return self.prev[-1]

    def _pnp(self, point_idx: np.ndarray, xy: np.ndarray) -> PoseFit | None:
        """Pose from map points ``(K,)`` seen at ``xy (K, 2)``.

        Motion-only from the constant-velocity prediction, PnP RANSAC when that fails. (Keeping the
        RANSAC pose only when it explains more points was tried: no change on the rendered table clips,
        and the hard preset tracked with the 70-degree prior went from 0.79 to 8.4 % ATE.)
        """
        o = self.opts
        x_in_world = self.map.points[point_idx]
        pred = self._predicted()
        fit = optimize_pose(pred, x_in_world, xy, self.f, o.ba, o.inlier_px)
        if np.count_nonzero(fit.inliers) >= 0.6 * len(xy):
            return fit
        ok, rvec, tvec, inl = cv2.solvePnPRansac(
            x_in_world,
            xy,
            np.eye(3),
            None,
            iterationsCount=200,
            reprojectionError=o.ransac_px / self.f,
            confidence=0.999,
            flags=cv2.SOLVEPNP_AP3P,
        )
        if not ok or inl is None:
            return None
        cfw = np.eye(4)
        cfw[:3, :3], cfw[:3, 3] = cv2.Rodrigues(rvec)[0], tvec.ravel()
        return optimize_pose(cfw, x_in_world, xy, self.f, o.ba, o.inlier_px)

    def _lose(self, feat: FrameFeatures) -> None:
        last = self.prev[-1]
        seg_kfs = [self.keyframes[k] for k in self.atlas.segment_keyframes(self.segment)]
        if len(seg_kfs) >= 2:
            centres = np.array([invert_rigid_matrices(k.cam_from_world)[:3, 3] for k in seg_kfs])
            self.scale = float(np.median(np.linalg.norm(np.diff(centres, axis=0), axis=1)))
        logger.info("tracking lost at frame %d in map %d", feat.frame_idx, self.segment)
        self.segment, self.last_segment = -1, self.segment
        self.anchor, self.lost_at = last, feat.frame_idx
        self.ref = None
        self._step(feat, self.cam.cam_ray_from_img(feat.uv_px.astype(np.float64)))

    def _check_place(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        """Loop closure or map merging from the current frame (the newest keyframe)."""
        o = self.opts
        self.last_place_check = feat.frame_idx
        match = recognise_place(self.atlas, feat, xy, self.segment, self.f, o.loop)
        if match is None:
            return
        done = apply_place_match(self.atlas, match, self.segment, feat.frame_idx, o.loop)
        if done is not None:
            if done.joined_to == done.segment:  # a loop within the map (not two maps joined)
                self._loop_ba(match.target_idx)
            self.joins.append(done)
            self.segment = min(self.segment, match.target)
        seen = match.localisation.point_idx
        kept = self.map.segment[seen] != MERGED
        self.map.alias(feat.track_ids[match.localisation.query_idx[kept]], seen[kept])
        self.prev = [self.atlas.rows[-1].cam_from_world]

    # ---- keyframes and map -----------------------------------------------------------------
    def _append_keyframe(self, kf: Keyframe, feat: FrameFeatures) -> None:
        """Append ``kf`` (made from ``feat``) to the current map and index its descriptors for retrieval."""
        self.atlas.keyframes.append(kf)
        self.atlas.keyframe_segment.append(self.segment)
        index = len(self.atlas.keyframes) - 1
        self.atlas.place_index.add(index, feat.described()[1], self.opts.loop.retrieval)

    def _add_keyframe(
        self,
        feat: FrameFeatures,
        xy: np.ndarray,
        cfw: np.ndarray,
        pidx: np.ndarray,
        have: np.ndarray,
        inliers: np.ndarray,
    ) -> None:
        obs = np.nonzero(have)[0][inliers]
        kf = Keyframe(feat.frame_idx, cfw, pidx[obs], xy[obs])
        new_idx, new_xy = self._triangulate_new(feat, xy, cfw, have)
        kf.point_idx = np.concatenate([kf.point_idx, new_idx])
        kf.xy = np.concatenate([kf.xy, new_xy])
        self._append_keyframe(kf, feat)
        self.first_seen.update(len(self.keyframes) - 1, feat.track_ids, xy)
        self._local_ba()

    def _triangulate_new(
        self, feat: FrameFeatures, xy: np.ndarray, cfw: np.ndarray, have: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Triangulate tracks without a map point against the keyframe where each was first seen.

        Returns the new points' indices ``(K,)`` and their coordinates in this frame ``(K, 2)``; the
        first-seen keyframes get the matching observations.
        """
        todo = np.nonzero(~have)[0]
        first_kf, first_xy = self.first_seen.lookup(feat.track_ids[todo])
        new_idx, new_xy = [np.zeros(0, np.int64)], [np.zeros((0, 2))]
        for kf_index in np.unique(first_kf[first_kf >= 0]):
            if self.atlas.keyframe_segment[kf_index] != self.segment:
                continue
            sel = first_kf == kf_index
            old, old_xy, cur = self.keyframes[kf_index], first_xy[sel], todo[sel]
            pts, ok = triangulate(old.cam_from_world, cfw, old_xy, xy[cur])
            rel = cfw @ invert_rigid_matrices(old.cam_from_world)
            ok &= parallax_deg(old_xy, xy[cur], rel[:3, :3]) >= self.opts.min_triangulation_deg
            ok &= self._reproj_ok(old.cam_from_world, pts, old_xy) & self._reproj_ok(cfw, pts, xy[cur])
            if not ok.any():
                continue
            idx = self.map.add(pts[ok], feat.track_ids[cur[ok]], self.segment, int(kf_index))
            self._describe_new_points(idx, feat.track_ids[cur[ok]])
            old.point_idx = np.concatenate([old.point_idx, idx])
            old.xy = np.concatenate([old.xy, old_xy[ok]])
            new_idx.append(idx)
            new_xy.append(xy[cur[ok]])
        return np.concatenate(new_idx), np.concatenate(new_xy)

    def _reproj_ok(self, cfw: np.ndarray, pts: np.ndarray, xy: np.ndarray) -> np.ndarray:
        return reprojection_error(cfw, pts, xy) * self.f < self.opts.inlier_px

    def _seeing_most(self, candidates: list[int], points: np.ndarray, count: int) -> list[int]:
        """The keyframes of ``candidates`` that observe most of the points marked in ``points``.

        ``points`` is a mask over the map's points; at most ``count``, most first (ties: the earlier), none
        that observes none of them.
        """
        seen = np.array([np.count_nonzero(points[self.keyframes[k].point_idx]) for k in candidates], int)
        return [candidates[i] for i in np.argsort(-seen, kind="stable")[:count] if seen[i] > 0]

    def _loop_ba(self, target_idx: np.ndarray) -> None:
        """BA after a loop correction: the newest corrected keyframes and the older ones that see the place.

        The pose graph moves each point with its first keyframe, so points that keyframes on both sides of
        the correction observe are left off their other observations, and the next recognition would be
        measured against them. Up to ``loop_ba_anchors`` older keyframes that see most of the recognised
        points hold the gauge.
        """
        o = self.opts
        seg_kfs = self.atlas.segment_keyframes(self.segment)
        newest = seg_kfs[-o.loop.max_corrected_keyframes :]
        older = seg_kfs[: len(seg_kfs) - len(newest)]
        in_place = np.zeros(self.map.n, bool)
        in_place[target_idx] = True
        anchors = sorted(self._seeing_most(older, in_place, o.loop_ba_anchors))
        chosen = anchors + newest
        fixed = np.zeros(len(chosen), bool)
        fixed[: len(anchors)] = True
        if len(anchors) < 2:
            fixed[:2] = True
        window = [self.keyframes[k] for k in chosen]
        refine_keyframes(window, self.map.points, self.f, fixed, o.ba, o.inlier_px)
        for k in chosen:
            self.atlas.rows[self.keyframes[k].frame_idx].cam_from_world = self.keyframes[k].cam_from_world

    def _local_ba(self) -> None:
        """BA of the newest keyframes and their covisible ones; keyframes seeing the same points anchor it."""
        o = self.opts
        seg_kfs = self.atlas.segment_keyframes(self.segment)
        window = seg_kfs[-o.local_ba_window :]
        older = seg_kfs[-o.local_ba_window - o.local_ba_search : -o.local_ba_window]
        if older:
            newest = self.keyframes[window[-1]].point_idx
            shared = np.array([np.count_nonzero(np.isin(self.keyframes[k].point_idx, newest)) for k in older])
            best = np.argsort(-shared, kind="stable")[: o.local_ba_covisible]
            window = sorted([older[i] for i in best if shared[i] >= o.covisible_min_points] + window)
            in_window = np.zeros(self.map.n, bool)
            for k in window:
                in_window[self.keyframes[k].point_idx] = True
            anchors = self._seeing_most([k for k in older if k not in window], in_window, o.local_ba_anchors)
        else:
            anchors = []
        chosen = sorted(anchors + window)
        fixed = np.array([k in anchors or k == seg_kfs[0] for k in chosen])
        if len(anchors) < 2 and chosen[0] != seg_kfs[0]:  # the two oldest hold the gauge, as without anchors
            fixed[:2] = True
        window_kfs = [self.keyframes[k] for k in chosen]
        refine_keyframes(window_kfs, self.map.points, self.f, fixed, o.ba, o.inlier_px)


def track_episode(
    features: Iterable[FrameFeatures], camera: Camera, opts: TrackingOptions | None = None
) -> TrackingResult:
    """Track the camera through one episode.

    Args:
        features: per-frame tracks in decode order (``frame_idx`` 0, 1, ...).
        camera: intrinsics of the frames the features were measured on.
        opts: tracking options.

    Returns:
        Per-frame poses, states and diagnostics, the keyframes and the atlas's points. Never raises for
        lost tracking: lost frames are marked, relocalised where possible, and maps that never meet
        keep their own ``segment_id``.
    """
    opts = opts or TrackingOptions()
    tracker = _Tracker(camera, opts)
    for feat in features:
        tracker.step(feat)
    atlas = tracker.atlas
    rows = atlas.rows
    n = atlas.points.n
    cfw = np.stack([r.cam_from_world for r in rows]) if rows else np.zeros((0, 4, 4))
    return TrackingResult(
        world_from_cam=invert_rigid_matrices(cfw),
        state=np.array([r.state for r in rows], np.int8),
        segment_id=_dense_segments(
            np.array([r.segment for r in rows], np.int64), np.array(atlas.keyframe_segment, np.int64)
        ),
        is_keyframe=np.array([r.is_keyframe for r in rows], bool),
        num_inliers=np.array([r.num_inliers for r in rows], np.int32),
        reproj_error_px=np.array([r.reproj_error_px for r in rows], np.float64),
        points_in_world=atlas.points.points[:n].copy(),
        point_track_id=atlas.points.track_id[:n].copy(),
        point_segment=_relabel_points(atlas),
        keyframes=atlas.keyframes,
        point_aliases=dict(atlas.points.aliases),
        joins=tracker.joins,
        relocalisations=tracker.relocalisations,
    )


def _hold_centre(cam_from_world: np.ndarray, centre_from: np.ndarray) -> np.ndarray:
    """``cam_from_world`` with its camera centre moved to that of ``centre_from`` (both ``(4, 4)``)."""
    out = cam_from_world.copy()
    centre = -centre_from[:3, :3].T @ centre_from[:3, 3]
    out[:3, 3] = -out[:3, :3] @ centre
    return out


def _dense_segments(row_segment: np.ndarray, map_ids: np.ndarray) -> np.ndarray:
    """Per-frame map ids renumbered 0.. in order of appearance, ``(F,)`` int32.

    A frame of a map that was never made (lost before any initialisation) takes its predecessor's id
    (its successor's at the start).
    """
    made = np.isin(row_segment, map_ids)
    seg = row_segment.copy()
    if made.any():
        idx = np.nonzero(made)[0]
        nearest = idx[np.clip(np.searchsorted(idx, np.arange(len(seg)), side="right") - 1, 0, None)]
        nearest = np.where(np.arange(len(seg)) < idx[0], idx[0], nearest)
        seg = row_segment[nearest]
    _, first = np.unique(seg, return_index=True)
    order = seg[np.sort(first)]
    lut = {int(s): i for i, s in enumerate(order)}
    return np.array([lut[int(s)] for s in seg], np.int32)


def _relabel_points(atlas: Atlas) -> np.ndarray:
    """``point_segment`` renumbered like the frames (merged points stay -1)."""
    rows = np.array([r.segment for r in atlas.rows], np.int64)
    dense = _dense_segments(rows, np.array(atlas.keyframe_segment, np.int64))
    lut = dict(zip(rows.tolist(), dense.tolist(), strict=True))
    seg = atlas.points.segment[: atlas.points.n]
    return np.array([lut.get(int(s), int(s)) if s != MERGED else MERGED for s in seg], np.int32)
