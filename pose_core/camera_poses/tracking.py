"""Monocular tracking: parallax-gated 5-point initialisation, PnP against a local map, local BA.

Per segment: frames before initialisation get a rotation-only pose (state ``STATIC``: the camera
is still or only turning, no translation is invented). When the rotation-compensated parallax to
the segment's reference frame exceeds ``init_min_parallax_deg`` a 5-point RANSAC gives the first
two keyframes and a triangulated map; then each frame is tracked by robust motion-only
optimisation (PnP RANSAC as fallback) against the map, keyframes add points (each track is
triangulated against the keyframe where it was first seen: the longest baseline it has) and
trigger a sliding-window BA. When too few map points are found the frame is marked ``LOST`` and a
new segment starts there, anchored at the last good pose (its scale set from the previous
segment's keyframe spacing): an episode never fails because tracking was lost. After the last
frame, segments are joined to their predecessor where their maps share tracks (``joining``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import cv2
import numpy as np

from pose_core.camera_poses.ba import BAOptions, optimize_pose
from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.joining import JoinOptions, SegmentJoin, join_segments
from pose_core.camera_poses.keyframe_map import FirstSeen, Keyframe, MapPoints, refine_keyframes
from pose_core.camera_poses.keyframes import KeyframeOptions, KeyframeSelector
from pose_core.camera_poses.twoview import (
    RelativeMotion,
    estimate_relative_motion,
    parallax_deg,
    rotation_between,
    triangulate,
)
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import invert_rigid_matrices

__all__ = ["TrackingOptions", "TrackingResult", "TrackingState", "track_episode"]

logger = logging.getLogger(__name__)


class TrackingState(enum.IntEnum):
    """Tracking state of one frame."""

    LOST = 0  # no pose from tracking (completion fills it, flagged)
    STATIC = 1  # before initialisation: rotation-only pose, camera centre held fixed
    TRACKING = 2  # pose from the map


@dataclass(frozen=True)
class TrackingOptions:
    """Knobs of tracking."""

    # median rotation-compensated parallax needed to initialise a segment, degrees
    init_min_parallax_deg: float = 0.8
    # inliers of the 5-point RANSAC needed to initialise
    init_min_inliers: int = 60
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
    # keyframes in the sliding-window BA
    local_ba_window: int = 6
    # frames before initialisation kept for re-tracking once the map exists
    max_pending_frames: int = 150
    # joining a segment to the previous one after a loss
    join: JoinOptions = field(default_factory=JoinOptions)
    # keyframe selection
    keyframes: KeyframeOptions = field(default_factory=KeyframeOptions)
    # local bundle adjustment and motion-only pose fits (3 iterations: more cost ~40 % of the tracking time
    # and gave no better ATE on KITTI or the synthetic clip, bench/results/camera_poses.md)
    ba: BAOptions = field(default_factory=lambda: BAOptions(max_iterations=3))


@dataclass
class TrackingResult:
    """Per-frame output of ``track_episode`` plus the map needed by global BA and completion.

    Attributes:
        world_from_cam: pose per frame, ``(F, 4, 4)``; NaN where ``state == LOST``.
        state: ``TrackingState`` per frame, ``(F,)`` int8.
        segment_id: tracking segment per frame, ``(F,)`` int32 (a new one after each loss that could not
            be joined).
        is_keyframe: keyframe flag, ``(F,)`` bool.
        num_inliers: map-point inliers (or shared rays while STATIC), ``(F,)`` int32.
        reproj_error_px: RMS reprojection error of the inliers, ``(F,)``; NaN when unknown.
        points_in_world: map points, ``(P, 3)``.
        point_track_id: track id of each map point, ``(P,)``.
        point_segment: segment of each map point, ``(P,)``.
        keyframes: keyframes in order, with their observations.
        joins: for each segment after the first, whether it was joined to its predecessor.
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
    joins: list[SegmentJoin] = field(default_factory=list)


class _Tracker:
    """Mutable state of ``track_episode``; one instance per episode."""

    def __init__(self, camera: Camera, opts: TrackingOptions) -> None:
        self.cam, self.opts, self.f = camera, opts, camera.focal_px
        self.map = MapPoints()
        self.first_seen = FirstSeen()
        self.keyframes: list[Keyframe] = []
        self.rows: list[tuple[np.ndarray, int, int, bool, int, float]] = []
        self.segment = 0
        self.seg_kf_start = 0
        self.ref: tuple[FrameFeatures, np.ndarray, np.ndarray] | None = None  # features, xy, cam_from_world
        self.ref_row = 0
        self.pending: list[tuple[int, FrameFeatures, np.ndarray]] = []  # row, features, xy before init
        self.anchor = np.eye(4)
        self.scale = 1.0
        self.prev: list[np.ndarray] = []
        self.selector = KeyframeSelector(opts.keyframes)

    # ---- per frame -------------------------------------------------------------------------
    def step(self, feat: FrameFeatures) -> None:
        xy = self.cam.cam_ray_from_img(feat.uv_px.astype(np.float64))
        if self.ref is None:
            self._set_reference(feat, xy, self.anchor)
            self._record(self.anchor, TrackingState.STATIC, len(xy), False, float("nan"))
            return
        if len(self.keyframes) == self.seg_kf_start:
            self._step_uninitialised(feat, xy)
        else:
            self._step_tracking(feat, xy)

    def _record(self, cfw: np.ndarray, state: TrackingState, n: int, kf: bool, err: float) -> None:
        self.rows.append((cfw, int(state), self.segment, kf, n, err))
        self.prev = [*self.prev[-1:], cfw]

    def _set_reference(self, feat: FrameFeatures, xy: np.ndarray, cfw: np.ndarray) -> None:
        self.ref = (feat, xy, cfw)
        self.ref_row = len(self.rows)
        self.pending = []

    def _move_reference(self, feat: FrameFeatures, need: int) -> bool:
        """Move the reference to the oldest pending frame sharing `need` tracks with `feat`.

        Keeps as much of the baseline accrued so far as the surviving tracks allow (a slow start or a
        shard boundary thins the tracks shared with an old reference long before the parallax is
        enough). The old reference and the pending frames stay pending (re-tracked once the map
        exists). False when none shares enough.
        """
        for k, (row, cand, cand_xy) in enumerate(self.pending):
            if len(np.intersect1d(cand.track_ids, feat.track_ids, assume_unique=True)) >= need:
                old = (self.ref_row, self.ref[0], self.ref[1])
                self.ref, self.ref_row = (cand, cand_xy, self.rows[row][0]), row
                self.pending = [old, *self.pending[:k], *self.pending[k + 1:]]
                return True
        return False

    def _step_uninitialised(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        need = max(self.opts.min_shared_tracks, self.opts.init_min_inliers, 3)
        _, ia, ib = np.intersect1d(self.ref[0].track_ids, feat.track_ids, return_indices=True)
        if len(ia) < need:
            if not self._move_reference(feat, need):
                cfw = self.prev[-1]
                self._set_reference(feat, xy, cfw)
                self._record(cfw, TrackingState.STATIC, len(ia), False, float("nan"))
                return
            _, ia, ib = np.intersect1d(self.ref[0].track_ids, feat.track_ids, return_indices=True)
        ref_feat, ref_xy, ref_cfw = self.ref
        rot = rotation_between(ref_xy[ia], xy[ib])
        cfw = np.eye(4)
        cfw[:3, :3] = rot
        cfw = cfw @ ref_cfw
        par = np.median(parallax_deg(ref_xy[ia], xy[ib], rot))
        if par >= self.opts.init_min_parallax_deg and len(ia) >= self.opts.init_min_inliers:
            motion = estimate_relative_motion(ref_xy[ia], xy[ib], self.opts.ransac_px / self.f)
            if motion is not None and self._initialise(feat, xy, ia, ib, motion):
                return
        keep = self.pending[-self.opts.max_pending_frames + 1:]
        self.pending = [*keep, (len(self.rows), feat, xy)]
        self._record(cfw, TrackingState.STATIC, len(ia), False, float("nan"))

    def _initialise(self, feat: FrameFeatures, xy: np.ndarray, ia: np.ndarray, ib: np.ndarray,
                    motion: RelativeMotion) -> bool:
        o = self.opts
        inl = motion.inliers
        if np.count_nonzero(inl) < o.init_min_inliers or motion.median_parallax_deg < o.init_min_parallax_deg:
            return False
        ref_feat, ref_xy, ref_cfw = self.ref
        cur_from_ref = motion.cur_from_ref.copy()
        cur_from_ref[:3, 3] *= self.scale
        cur_cfw = cur_from_ref @ ref_cfw
        ia, ib = ia[inl], ib[inl]
        pts, ok = triangulate(ref_cfw, cur_cfw, ref_xy[ia], xy[ib])
        ok &= parallax_deg(ref_xy[ia], xy[ib], cur_from_ref[:3, :3]) >= o.min_triangulation_deg / 2
        if np.count_nonzero(ok) < o.init_min_inliers:
            return False
        idx = self.map.add(pts[ok], ref_feat.track_ids[ia[ok]], self.segment)
        self.keyframes.append(Keyframe(ref_feat.frame_idx, ref_cfw, idx, ref_xy[ia[ok]]))
        self.keyframes.append(Keyframe(feat.frame_idx, cur_cfw, idx, xy[ib[ok]]))
        self.first_seen = FirstSeen()
        self.first_seen.update(len(self.keyframes) - 2, ref_feat.track_ids, ref_xy)
        self.first_seen.update(len(self.keyframes) - 1, feat.track_ids, xy)
        self._local_ba()
        logger.debug("segment %d initialised at frame %d with %d points", self.segment, feat.frame_idx,
                     len(idx))
        self.rows[self.ref_row] = (self.keyframes[-2].cam_from_world, int(TrackingState.TRACKING),
                                   self.segment, True, len(idx), float("nan"))
        self._retrack_pending()
        self.selector.force(feat)
        self._record(self.keyframes[-1].cam_from_world, TrackingState.TRACKING, len(idx), True, float("nan"))
        return True

    def _retrack_pending(self) -> None:
        """Give the frames between the two initial keyframes a pose from the new map."""
        start = self.keyframes[-2].cam_from_world
        for row, feat, xy in self.pending:
            pidx = self.map.lookup(feat.track_ids, self.segment)
            have = pidx >= 0
            if np.count_nonzero(have) < self.opts.min_pnp_inliers:
                continue
            fit = optimize_pose(start, self.map.points[pidx[have]], xy[have], self.f, self.opts.ba,
                                self.opts.inlier_px)
            n_in = int(np.count_nonzero(fit.inliers))
            if n_in >= self.opts.min_pnp_inliers:
                self.rows[row] = (fit.cam_from_world, int(TrackingState.TRACKING), self.segment, False, n_in,
                                  fit.rms_px)
                start = fit.cam_from_world
        self.pending = []

    def _step_tracking(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        o = self.opts
        pidx = self.map.lookup(feat.track_ids, self.segment)
        have = pidx >= 0
        fit = None
        if np.count_nonzero(have) >= o.min_pnp_inliers:
            fit = self._pnp(self.map.points[pidx[have]], xy[have])
        if fit is None or np.count_nonzero(fit.inliers) < o.min_pnp_inliers:
            self._lose(feat, xy)
            return
        n_in = int(np.count_nonzero(fit.inliers))
        is_kf = self.selector.wants(feat) or n_in < o.min_tracked_points
        cfw = fit.cam_from_world
        if is_kf:
            self.selector.force(feat)
            self._add_keyframe(feat, xy, cfw, pidx, have, fit.inliers)
            cfw = self.keyframes[-1].cam_from_world
        self._record(cfw, TrackingState.TRACKING, n_in, is_kf, fit.rms_px)

    def _pnp(self, x_in_world: np.ndarray, xy: np.ndarray):  # noqa: ANN202
        o = self.opts
        pred = self.prev[-1] @ invert_rigid_matrices(self.prev[-2]) @ self.prev[-1] if len(self.prev) == 2 \
            else self.prev[-1]
        fit = optimize_pose(pred, x_in_world, xy, self.f, o.ba, o.inlier_px)
        if np.count_nonzero(fit.inliers) >= 0.6 * len(xy):
            return fit
        ok, rvec, tvec, inl = cv2.solvePnPRansac(
            x_in_world, xy, np.eye(3), None, iterationsCount=200, reprojectionError=o.ransac_px / self.f,
            confidence=0.999, flags=cv2.SOLVEPNP_AP3P)
        if not ok or inl is None:
            return None
        cfw = np.eye(4)
        cfw[:3, :3], cfw[:3, 3] = cv2.Rodrigues(rvec)[0], tvec.ravel()
        return optimize_pose(cfw, x_in_world, xy, self.f, o.ba, o.inlier_px)

    def _lose(self, feat: FrameFeatures, xy: np.ndarray) -> None:
        last = self.prev[-1]
        seg_kfs = self.keyframes[self.seg_kf_start:]
        if len(seg_kfs) >= 2:
            centres = np.array([invert_rigid_matrices(k.cam_from_world)[:3, 3] for k in seg_kfs])
            self.scale = float(np.median(np.linalg.norm(np.diff(centres, axis=0), axis=1)))
        logger.info("tracking lost at frame %d; new segment %d", feat.frame_idx, self.segment + 1)
        self.segment += 1
        self.seg_kf_start = len(self.keyframes)
        self.selector = KeyframeSelector(self.opts.keyframes)
        self._set_reference(feat, xy, last)
        self._record(np.full((4, 4), np.nan), TrackingState.LOST, 0, False, float("nan"))
        self.prev = [last]

    # ---- keyframes and map -----------------------------------------------------------------
    def _add_keyframe(self, feat: FrameFeatures, xy: np.ndarray, cfw: np.ndarray, pidx: np.ndarray,
                      have: np.ndarray, inliers: np.ndarray) -> None:
        obs = np.nonzero(have)[0][inliers]
        kf = Keyframe(feat.frame_idx, cfw, pidx[obs], xy[obs])
        new_idx, new_xy = self._triangulate_new(feat, xy, cfw, have)
        kf.point_idx = np.concatenate([kf.point_idx, new_idx])
        kf.xy = np.concatenate([kf.xy, new_xy])
        self.keyframes.append(kf)
        self.first_seen.update(len(self.keyframes) - 1, feat.track_ids, xy)
        self._local_ba()

    def _triangulate_new(self, feat: FrameFeatures, xy: np.ndarray, cfw: np.ndarray,
                         have: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Triangulate tracks without a map point against the keyframe where each was first seen.

        Returns the new points' indices ``(K,)`` and their coordinates in this frame ``(K, 2)``; the
        first-seen keyframes get the matching observations.
        """
        todo = np.nonzero(~have)[0]
        first_kf, first_xy = self.first_seen.lookup(feat.track_ids[todo])
        new_idx, new_xy = [np.zeros(0, np.int64)], [np.zeros((0, 2))]
        for kf_index in np.unique(first_kf[first_kf >= 0]):
            sel = first_kf == kf_index
            old, old_xy, cur = self.keyframes[kf_index], first_xy[sel], todo[sel]
            pts, ok = triangulate(old.cam_from_world, cfw, old_xy, xy[cur])
            rel = cfw @ invert_rigid_matrices(old.cam_from_world)
            ok &= parallax_deg(old_xy, xy[cur], rel[:3, :3]) >= self.opts.min_triangulation_deg
            ok &= self._reproj_ok(old.cam_from_world, pts, old_xy) & self._reproj_ok(cfw, pts, xy[cur])
            if not ok.any():
                continue
            idx = self.map.add(pts[ok], feat.track_ids[cur[ok]], self.segment)
            old.point_idx = np.concatenate([old.point_idx, idx])
            old.xy = np.concatenate([old.xy, old_xy[ok]])
            new_idx.append(idx)
            new_xy.append(xy[cur[ok]])
        return np.concatenate(new_idx), np.concatenate(new_xy)

    def _reproj_ok(self, cfw: np.ndarray, pts: np.ndarray, xy: np.ndarray) -> np.ndarray:
        x_in_cam = pts @ cfw[:3, :3].T + cfw[:3, 3]
        z = np.where(x_in_cam[:, 2] > 0, x_in_cam[:, 2], np.nan)
        err = np.linalg.norm(x_in_cam[:, :2] / z[:, None] - xy, axis=1) * self.f
        return np.nan_to_num(err, nan=np.inf) < self.opts.inlier_px

    def _local_ba(self) -> None:
        start = max(self.seg_kf_start, len(self.keyframes) - self.opts.local_ba_window)
        window = self.keyframes[start:]
        n_fixed = 1 if start == self.seg_kf_start else 2
        refine_keyframes(window, self.map.points, self.f, n_fixed, self.opts.ba, self.opts.inlier_px)


def track_episode(features: Iterable[FrameFeatures], camera: Camera, opts: TrackingOptions | None = None
                  ) -> TrackingResult:
    """Track the camera through one episode.

    Args:
        features: per-frame tracks in decode order (``frame_idx`` 0, 1, ...).
        camera: intrinsics of the frames the features were measured on.
        opts: tracking options.

    Returns:
        Per-frame poses, states and diagnostics, the keyframes and the map. Never raises for lost
        tracking: lost frames are marked and a new segment starts; segments whose maps share enough
        tracks are joined afterwards (``joining``), the others keep their own ``segment_id``.
    """
    opts = opts or TrackingOptions()
    tracker = _Tracker(camera, opts)
    for feat in features:
        tracker.step(feat)
    cfw = np.stack([r[0] for r in tracker.rows]) if tracker.rows else np.zeros((0, 4, 4))
    n = tracker.map.n
    result = TrackingResult(
        world_from_cam=invert_rigid_matrices(cfw),
        state=np.array([r[1] for r in tracker.rows], np.int8),
        segment_id=np.array([r[2] for r in tracker.rows], np.int32),
        is_keyframe=np.array([r[3] for r in tracker.rows], bool),
        num_inliers=np.array([r[4] for r in tracker.rows], np.int32),
        reproj_error_px=np.array([r[5] for r in tracker.rows], np.float64),
        points_in_world=tracker.map.points[:n].copy(),
        point_track_id=tracker.map.track_id[:n].copy(),
        point_segment=tracker.map.segment[:n].copy(),
        keyframes=tracker.keyframes,
    )
    result.joins = join_segments(result, opts.join)
    return result
