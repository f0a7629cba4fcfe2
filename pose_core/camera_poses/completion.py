"""Global BA over keyframes, then a pose for every frame.

``bundle_adjust_keyframes`` runs one BA per tracking segment over all its keyframes (first
keyframe and the scale fixed). When the intrinsics are not calibrated (``intrinsics_source`` prior
or metadata) the segment with the most keyframes also refines the focal length (``bundle_adjust``'s
bordered system and observability guard); the other segments are then adjusted with that focal,
and the returned camera carries it (``intrinsics_source`` ``<source>_refined``). ``complete_poses``
then gives each non-keyframe a pose by robust motion-only optimisation against the refined map,
using the cached per-frame features (no decoding); it starts from the tracking pose moved with its
segment's nearest keyframe. The centres of each map's posed frames are then smoothed by the camera's
motion model (``path_smoothing``: single-frame outliers of the motion-only fits rejected), and frames
whose centre was not measured (static or turning before, between or after them) take it from their
posed neighbours. Frames that cannot be optimised get an interpolated pose, flagged as such.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pose_core.camera_poses.ba import BAOptions, BAResult, FocalStatus, PosePrior, optimize_pose
from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.keyframe_map import Keyframe, refine_keyframes
from pose_core.camera_poses.path_smoothing import PathSmoothingOptions, smooth_camera_path
from pose_core.camera_poses.tracking import TrackingResult, TrackingState
from pose_core.geometry.camera import Camera, IntrinsicsSource
from pose_core.geometry.rigid3 import interpolate_rigid, invert_rigid_matrices

__all__ = [
    "CompletionOptions",
    "CompletionResult",
    "GlobalBA",
    "PoseQuality",
    "bundle_adjust_keyframes",
    "estimate_intrinsics",
    "complete_poses",
]

logger = logging.getLogger(__name__)


class PoseQuality(enum.IntEnum):
    """Where a frame's final pose comes from (higher is better)."""

    INTERPOLATED = 0  # fallback: interpolated/held from neighbouring posed frames
    ROTATION_ONLY = 1  # no map in view: rotation fitted, centre held (tracking state static or rotation_only)
    MOTION_ONLY = 2  # motion-only optimisation against the bundle-adjusted map
    KEYFRAME = 3  # keyframe pose from global bundle adjustment


@dataclass(frozen=True)
class CompletionOptions:
    """Knobs of global BA and completion."""

    # global BA over each segment's keyframes
    ba: BAOptions = field(default_factory=lambda: BAOptions(max_iterations=10))
    # a segment with more keyframes than this is adjusted in overlapping windows of this many
    # consecutive keyframes, oldest first, so that BA's memory and time grow with the window, not with
    # the footage (one problem over an hour's keyframes, whose revisits make the reduced camera system
    # nearly dense, does not fit in a worker); 0: always one problem
    ba_window_keyframes: int = 300
    # keyframes a window shares with the one before it: held at that window's result, they carry the
    # gauge and scale on (a third of the window: on synthetic tracks, 300 frames, 69 keyframes, windows
    # of 24 sharing 8 were as accurate as one problem, sharing 4 of 16 worse than no BA;
    # tests/pose_core/camera_poses/test_ba_windows.py)
    ba_window_overlap: int = 100
    # up to this many earlier keyframes outside a window that see most of its points are held fixed in
    # it, so a point seen again on a revisit keeps its earlier views
    ba_window_anchors: int = 30
    # residual under which an observation is an inlier, pixels
    inlier_px: float = 3.0
    # minimum inliers for a motion-only pose to be accepted
    min_inliers: int = 20
    # a keyframe keeps its global-BA pose only when that pose explains at least this fraction of the
    # points a motion-only fit against the map explains in the frame's own tracks; else it is posed like
    # any frame (keyframes are made where tracking weakens, and BA gives them only the observations they
    # were made with: a real desk clip had keyframes on 32-90 points sitting 2-5 % of the scene depth
    # off frames on 100-160; the synthetic table clip one on 31 of ~300 points, 8 mm off)
    keyframe_min_explained: float = 0.9
    # a non-keyframe's fit is held near the pose interpolated between its two keyframes: camera centre
    # sigma as a fraction of the distance between them, rotation sigma in degrees (one pixel of
    # reprojection error per sigma; a frame with many agreeing points barely feels it, one with few or
    # misleading points cannot leave its neighbours: KITTI-like driving had 3 m outliers without it)
    prior_centre_fraction: float = 0.5
    prior_rotation_deg: float = 5.0
    # refine the focal length in global BA when it is not calibrated (intrinsics_source prior or
    # metadata); the guard in `ba` (focal_max_rel_std, focal_scale_range) keeps the prior when the
    # motion cannot determine it
    refine_focal: bool = True
    # with the focal, also estimate one radial distortion coefficient k1 (kept at 0 when the guard in
    # `ba`, radial_max_std and radial_range, does not trust it)
    refine_radial: bool = True
    # keyframes of the largest segment (evenly spread) the intrinsics are estimated on
    intrinsics_keyframes: int = 40
    # the camera path's motion model over each map's posed frames (centres only)
    path: PathSmoothingOptions = field(default_factory=PathSmoothingOptions)


@dataclass
class CompletionResult:
    """A pose for every frame, with diagnostics for QA.

    Attributes:
        world_from_cam: pose per frame, ``(F, 4, 4)``, never NaN when any frame was tracked.
        quality: ``PoseQuality`` per frame, ``(F,)`` int8.
        tracking_state: ``TrackingState`` per frame from tracking, ``(F,)`` int8.
        is_keyframe: keyframe flag, ``(F,)`` bool.
        num_inliers: inliers of the final pose, ``(F,)`` int32.
        reproj_error_px: RMS reprojection error of the inliers, ``(F,)``; NaN when unknown.
        segment_id: tracking segment, ``(F,)`` int32.
    """

    world_from_cam: np.ndarray
    quality: np.ndarray
    tracking_state: np.ndarray
    is_keyframe: np.ndarray
    num_inliers: np.ndarray
    reproj_error_px: np.ndarray
    segment_id: np.ndarray


@dataclass
class GlobalBA:
    """Outcome of ``bundle_adjust_keyframes``.

    Attributes:
        solves: one solver result per problem solved (a segment with at least two keyframes, or one
            window of a long one: `CompletionOptions.ba_window_keyframes`), in segment order.
        camera: the intrinsics the adjusted keyframes and points agree with: the given camera, or
            the one estimated from the footage (``fx``, ``fy`` scaled, ``radtan`` with ``k1`` when the
            radial term was accepted; ``intrinsics_source`` ``estimated``).
        focal_status: what became of the focal (``FocalStatus``; ``fixed`` when not refined).
        focal_std_px: posterior standard deviation of the refined focal, pixels; NaN when not refined.
        radial_status: what became of the radial term (``FocalStatus``); ``fixed`` when not refined.
        radial_k1_std: posterior standard deviation of ``k1``; NaN when not refined.
    """

    solves: list[BAResult]
    camera: Camera
    focal_status: FocalStatus = "fixed"
    focal_std_px: float = float("nan")
    radial_status: FocalStatus = "fixed"
    radial_k1_std: float = float("nan")


#: intrinsics_source values whose camera global BA may estimate (again)
_REFINED_SOURCE: frozenset[IntrinsicsSource] = frozenset({"prior", "metadata", "estimated"})


def bundle_adjust_keyframes(
    result: TrackingResult, camera: Camera, opts: CompletionOptions | None = None
) -> GlobalBA:
    """Global BA per segment over all keyframes; updates ``result`` keyframes and points in place.

    An uncalibrated camera is first estimated (``estimate_intrinsics``); every keyframe's observations
    are then normalised with the estimate and the segments are adjusted with it held fixed. A long
    segment is adjusted in overlapping windows of keyframes (``_ba_windows``), so memory stays bounded.

    Args:
        result: output of ``track_episode``.
        camera: intrinsics the keyframe observations were normalised with.
        opts: options.

    Returns:
        The solver results and the camera after BA (estimated when allowed and accepted).
    """
    opts = opts or CompletionOptions()
    out = estimate_intrinsics(result, camera, opts)
    if out.camera is not camera:
        for k in result.keyframes:
            k.xy = _renormalised(k.xy, camera, out.camera)
    seg_of_kf = np.array([result.segment_id[k.frame_idx] for k in result.keyframes], dtype=np.int64)
    for seg in np.unique(seg_of_kf):
        kfs = [k for k, s in zip(result.keyframes, seg_of_kf, strict=True) if s == seg]
        for chosen, fixed in _ba_windows(kfs, opts):
            res = refine_keyframes(
                chosen, result.points_in_world, out.camera.focal_px, fixed, opts.ba, opts.inlier_px
            )
            if res is None:
                continue
            logger.debug(
                "global BA segment %d: %d keyframes (%d held), cost %.1f -> %.1f, converged=%s",
                seg, len(chosen), int(np.sum(fixed)), res.initial_cost, res.cost, res.converged,
            )  # fmt: skip
            out.solves.append(res)
    return out


def _ba_windows(
    kfs: list[Keyframe], opts: CompletionOptions
) -> Iterator[tuple[list[Keyframe], np.ndarray | int]]:
    """The problems global BA solves for one segment's keyframes (oldest first): `(keyframes, fixed)`.

    One problem (the first keyframe holds the gauge) up to `opts.ba_window_keyframes`; above, windows
    of that many consecutive keyframes, each sharing `opts.ba_window_overlap` with the one before (held
    fixed at its result: gauge and scale) and holding fixed up to `opts.ba_window_anchors` earlier
    keyframes that see most of its points. Yielded lazily: a window's anchors are picked after the
    windows before it were solved (their observations, outliers removed, are current).
    """
    size, overlap = opts.ba_window_keyframes, opts.ba_window_overlap
    if size <= 0 or len(kfs) <= size:
        yield kfs, 1
        return
    if not 0 <= overlap < size:
        raise ValueError(f"ba_window_overlap must be in [0, ba_window_keyframes), got {overlap}")
    for start in range(0, len(kfs) - overlap, size - overlap):
        window = kfs[start : start + size]
        anchors = _anchor_keyframes(kfs[:start], window, opts.ba_window_anchors)
        fixed = np.zeros(len(anchors) + len(window), bool)
        fixed[: len(anchors)] = True
        fixed[len(anchors) : len(anchors) + (overlap if start > 0 else 1)] = True
        yield [*anchors, *window], fixed


def _anchor_keyframes(earlier: list[Keyframe], window: list[Keyframe], count: int) -> list[Keyframe]:
    """Up to `count` of `earlier` that share the most points with `window` (at least one), oldest first."""
    if count <= 0 or not earlier:
        return []
    points = np.unique(np.concatenate([k.point_idx for k in window]))
    obs = np.concatenate([k.point_idx for k in earlier])
    owner = np.repeat(np.arange(len(earlier)), [len(k.point_idx) for k in earlier])
    shared = np.bincount(owner[np.isin(obs, points)], minlength=len(earlier))
    best = np.argsort(-shared, kind="stable")[:count]
    return [earlier[i] for i in sorted(best) if shared[i] > 0]


def estimate_intrinsics(result: TrackingResult, camera: Camera, opts: CompletionOptions) -> GlobalBA:
    """The camera estimated from the map when it is not calibrated; ``result`` is not modified.

    BA with the focal and ``k1`` as unknowns (``bundle_adjust``'s bordered system and guard) on at most
    ``opts.intrinsics_keyframes`` keyframes of the largest segment, evenly spread: intrinsics need
    views, not all of them (150 keyframes cost a 600-frame clip 25 CPU-s, more than tracking it). An
    earlier estimate (``estimated``, radial) is estimated again from its pinhole part.

    Returns:
        The estimated camera (or ``camera``), the statuses and standard deviations; no solves.
    """
    out = GlobalBA([], camera)
    if not (opts.refine_focal and camera.intrinsics_source in _REFINED_SOURCE) or not result.keyframes:
        return out
    seg_of_kf = np.array([result.segment_id[k.frame_idx] for k in result.keyframes], dtype=np.int64)
    segments, counts = np.unique(seg_of_kf, return_counts=True)
    kfs = [k for k, s in zip(result.keyframes, seg_of_kf, strict=True) if s == segments[np.argmax(counts)]]
    if len(kfs) < 2:
        return out
    spread = np.linspace(0, len(kfs) - 1, min(len(kfs), opts.intrinsics_keyframes))
    keep = np.unique(spread.round().astype(int))
    kfs = [copy.deepcopy(kfs[i]) for i in keep]
    base = replace(camera, model="pinhole", dist=())
    for k in kfs:
        k.xy = _renormalised(k.xy, camera, base)
    res = refine_keyframes(
        kfs,
        result.points_in_world.copy(),
        base.focal_px,
        1,
        opts.ba,
        opts.inlier_px,
        refine_focal=True,
        refine_radial=opts.refine_radial,
    )
    return out if res is None else _with_intrinsics(out, base, res)


def _with_intrinsics(out: GlobalBA, camera: Camera, res: BAResult) -> GlobalBA:
    """``out`` with the intrinsics outcome of ``res`` (the estimated camera when the focal was accepted)."""
    std_px = res.focal_scale_std * camera.focal_px
    out = replace(
        out,
        focal_status=res.focal_status,
        focal_std_px=std_px,
        radial_status=res.radial_status,
        radial_k1_std=res.radial_k1_std,
    )
    if res.focal_status != "refined":
        return out
    radial = res.radial_status == "refined"
    estimated = replace(
        camera,
        fx=camera.fx * res.focal_scale,
        fy=camera.fy * res.focal_scale,
        intrinsics_source="estimated",
        model="radtan" if radial else camera.model,
        dist=(res.radial_k1, 0.0, 0.0, 0.0) if radial else camera.dist,
    )
    return replace(out, camera=estimated)


def _renormalised(xy: np.ndarray, given: Camera, other: Camera) -> np.ndarray:
    """Observations ``(N, 2)`` normalised with the ``given`` camera, normalised with ``other`` instead."""
    return other.cam_ray_from_img(given.img_from_cam(np.column_stack([xy, np.ones(len(xy))])))


def complete_poses(
    result: TrackingResult,
    features: Sequence[FrameFeatures],
    camera: Camera,
    opts: CompletionOptions | None = None,
) -> CompletionResult:
    """A pose for every frame from the (bundle-adjusted) keyframes, map and cached features.

    Args:
        result: output of ``track_episode``, usually after ``bundle_adjust_keyframes``.
        features: the per-frame features tracking consumed, indexed by frame.
        camera: intrinsics.
        opts: options.

    Returns:
        Per-frame poses, quality flags and diagnostics.
    """
    opts = opts or CompletionOptions()
    n = len(result.state)
    tracked_wfc = result.world_from_cam
    wfc = np.full((n, 4, 4), np.nan)
    quality = np.full(n, PoseQuality.INTERPOLATED, np.int8)
    inliers = np.zeros(n, np.int32)
    err = np.full(n, np.nan)
    correction = np.full((n, 4, 4), np.nan)  # world_new_from_world_old of the latest keyframe
    lookup = _PointLookup(result)
    for k in result.keyframes:
        f = k.frame_idx
        if len(k.point_idx) < opts.min_inliers or not _keyframe_holds(
            k, features[f], lookup, result, camera, opts
        ):
            continue
        wfc[f] = invert_rigid_matrices(k.cam_from_world)
        quality[f], inliers[f] = PoseQuality.KEYFRAME, len(k.point_idx)
        correction[f] = wfc[f] @ invert_rigid_matrices(tracked_wfc[f])
    kf_frames = np.nonzero(quality == PoseQuality.KEYFRAME)[0]
    last_corr, last_seg = np.eye(4), -1
    for f in range(n):
        seg = int(result.segment_id[f])
        if seg != last_seg:
            last_corr, last_seg = np.eye(4), seg
        if np.isfinite(correction[f]).all():
            last_corr = correction[f]
            continue
        state = result.state[f]
        if state in (TrackingState.STATIC, TrackingState.ROTATION_ONLY):
            wfc[f], quality[f] = last_corr @ tracked_wfc[f], PoseQuality.ROTATION_ONLY
            inliers[f] = result.num_inliers[f]
            continue
        if state != TrackingState.TRACKING:
            continue
        start = invert_rigid_matrices(last_corr @ tracked_wfc[f])
        pidx = lookup.points_of(features[f].track_ids, seg)
        have = pidx >= 0
        if np.count_nonzero(have) < opts.min_inliers:
            continue
        xy = camera.cam_ray_from_img(features[f].uv_px[have].astype(np.float64))
        prior = _neighbour_prior(f, kf_frames, wfc, result.segment_id, opts)
        starts = [start] if prior is None else [start, prior.cam_from_world]
        x_in_world = result.points_in_world[pidx[have]]
        fits = [
            optimize_pose(s, x_in_world, xy, camera.focal_px, opts.ba, opts.inlier_px, prior) for s in starts
        ]
        # two starts (tracked, and between the keyframes): the one that explains more points wins (a
        # motion-only fit can settle in a wrong minimum: 111 of ~200 points at 1.9 px, 0.8 m off on KITTI)
        fit = max(fits, key=lambda x: (np.count_nonzero(x.inliers), -x.rms_px))
        if np.count_nonzero(fit.inliers) >= opts.min_inliers:
            wfc[f] = invert_rigid_matrices(fit.cam_from_world)
            n_in = int(np.count_nonzero(fit.inliers))
            quality[f], inliers[f], err[f] = PoseQuality.MOTION_ONLY, n_in, fit.rms_px
    measured = quality >= PoseQuality.MOTION_ONLY
    wfc[:, :3, 3] = smooth_camera_path(wfc[:, :3, 3], measured, result.segment_id, opts.path)
    _place_unmeasured_centres(wfc, quality, result.segment_id)
    _fill_gaps(wfc)
    return CompletionResult(
        wfc, quality, result.state.copy(), result.is_keyframe.copy(), inliers, err, result.segment_id.copy()
    )


def _keyframe_holds(
    kf: Keyframe,
    feat: FrameFeatures,
    lookup: _PointLookup,
    result: TrackingResult,
    camera: Camera,
    opts: CompletionOptions,
) -> bool:
    """Does the keyframe's BA pose explain its frame's tracks nearly as well as a fit to them does?"""
    pidx = lookup.points_of(feat.track_ids, int(result.segment_id[kf.frame_idx]))
    have = pidx >= 0
    if np.count_nonzero(have) < opts.min_inliers:
        return True  # nothing better to fit: BA's pose stands
    xy = camera.cam_ray_from_img(feat.uv_px[have].astype(np.float64))
    x_in_world = result.points_in_world[pidx[have]]
    x_in_cam = x_in_world @ kf.cam_from_world[:3, :3].T + kf.cam_from_world[:3, 3]
    z = np.where(x_in_cam[:, 2] > 0, x_in_cam[:, 2], np.nan)  # behind the camera: never explained
    err_px = camera.focal_px * np.linalg.norm(x_in_cam[:, :2] / z[:, None] - xy, axis=1)
    explained = np.count_nonzero(err_px <= opts.inlier_px)  # NaN compares False
    fit = optimize_pose(kf.cam_from_world, x_in_world, xy, camera.focal_px, opts.ba, opts.inlier_px)
    return bool(explained >= opts.keyframe_min_explained * np.count_nonzero(fit.inliers))


def _neighbour_prior(
    frame: int, kf_frames: np.ndarray, wfc: np.ndarray, segment_id: np.ndarray, opts: CompletionOptions
) -> PosePrior | None:
    """The pose interpolated between the keyframes before and after ``frame`` (same map), as a prior."""
    after = int(np.searchsorted(kf_frames, frame))
    if after == 0 or after == len(kf_frames):
        return None
    a, b = kf_frames[after - 1], kf_frames[after]
    if segment_id[a] != segment_id[frame] or segment_id[b] != segment_id[frame]:
        return None
    mid = interpolate_rigid(wfc[a], wfc[b], np.array([(frame - a) / (b - a)]))[0]
    spacing = float(np.linalg.norm(wfc[b, :3, 3] - wfc[a, :3, 3]))
    if spacing <= 0:
        return None
    return PosePrior(
        invert_rigid_matrices(mid), opts.prior_centre_fraction * spacing, np.deg2rad(opts.prior_rotation_deg)
    )


def _place_unmeasured_centres(wfc: np.ndarray, quality: np.ndarray, segment_id: np.ndarray) -> None:
    """Give rotation-only frames the centre their map's posed frames imply (in place).

    Their rotation was measured (tracking state static or rotation_only), their centre only held at the
    last one tracking knew, which need not be the map's: a real desk clip held its first 11 still frames
    at the origin while the map, made later, put the same still head 0.7 units away. Between two posed
    frames of the map a centre is interpolated; before the first or after the last it is held there.
    """
    turning = quality == PoseQuality.ROTATION_ONLY
    for seg in np.unique(segment_id[turning]):
        mine = np.flatnonzero((quality >= PoseQuality.MOTION_ONLY) & (segment_id == seg))
        if len(mine) == 0:
            continue
        frames = np.flatnonzero(turning & (segment_id == seg))
        for axis in range(3):  # np.interp holds the end values beyond the first and last posed frame
            wfc[frames, axis, 3] = np.interp(frames, mine, wfc[mine, axis, 3])


class _PointLookup:
    """(map, track id) -> map point, aliases included (tracks relocalised or merged onto a point)."""

    def __init__(self, result: TrackingResult) -> None:
        alias_track = np.fromiter(result.point_aliases.keys(), np.int64, len(result.point_aliases))
        alias_point = np.fromiter(result.point_aliases.values(), np.int64, len(result.point_aliases))
        track = np.concatenate([result.point_track_id, alias_track])
        point = np.concatenate([np.arange(len(result.point_track_id)), alias_point])
        seg = result.point_segment[point]
        self.order = np.lexsort((track, seg))
        self.key_seg, self.key_track, self.point = seg[self.order], track[self.order], point[self.order]

    def points_of(self, track_ids: np.ndarray, segment: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.key_seg, segment), np.searchsorted(self.key_seg, segment, side="right")
        tracks = self.key_track[lo:hi]
        if len(tracks) == 0:
            return np.full(len(track_ids), -1, np.int64)
        pos = np.minimum(np.searchsorted(tracks, track_ids), len(tracks) - 1)
        found = tracks[pos] == track_ids
        return np.where(found, self.point[lo:hi][pos], -1)


def _fill_gaps(wfc: np.ndarray) -> None:
    """Interpolate NaN poses between posed neighbours; hold the nearest pose at the ends (in place)."""
    ok = np.isfinite(wfc).all(axis=(1, 2))
    if not ok.any():
        return
    idx = np.nonzero(ok)[0]
    for f in np.nonzero(~ok)[0]:
        nxt = int(np.searchsorted(idx, f))
        if nxt == 0 or nxt == len(idx):
            wfc[f] = wfc[idx[min(nxt, len(idx) - 1)]]
            continue
        a, b = idx[nxt - 1], idx[nxt]
        wfc[f] = interpolate_rigid(wfc[a], wfc[b], np.array([(f - a) / (b - a)]))[0]
