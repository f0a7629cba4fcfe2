"""Place recognition while tracking: join maps that see the same place, close loops within a map.

Every ``place_check_every_frames`` frames (a frame with descriptors, made a keyframe) the current
frame's descriptors are matched against the points of the atlas that it is not tracking: the
points of other maps and the points of its own map that no recent keyframe observes
(``relocalisation.localise``: appearance match, PnP + RANSAC; on a large map only the points of the
keyframes most alike the frame, ``place_index``). The current map's points of the
matched tracks and the recognised points are then pairs of one place; the frame's pose in both
and the pairs' depths give the similarity between them (``joining.similarity_from_views``):

- another map: the younger of the two maps moves into the older one's frame (the episode's world
  is its first map's), its id is replaced, and the duplicate points are merged (ORB-SLAM's map
  merging);
- the same map: a loop. A similarity that hardly moves anything only merges the duplicate points
  (which ties the two ends together for global BA); a real correction is spread over the keyframes
  of the loop by a Sim(3) pose graph (``pose_graph``), points and frame poses move with their
  keyframes, then the duplicates are merged (ORB-SLAM's loop correction).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.joining import JoinOptions, SegmentJoin, similarity_from_views
from pose_core.camera_poses.keyframe_map import MERGED, Atlas
from pose_core.camera_poses.place_index import RetrievalOptions
from pose_core.camera_poses.pose_graph import PoseGraphOptions, optimise_sim3_graph, rigid_from_sim3
from pose_core.camera_poses.relocalisation import Localisation, PlaceOptions, localise
from pose_core.geometry.rigid3 import invert_rigid_matrices, so3_log
from pose_core.geometry.sim3 import cam_from_world_after_sim3, sim3_inverse, sim3_parts, transform_points

__all__ = ["LoopOptions", "PlaceMatch", "apply_place_match", "recognise_place", "relocalise"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopOptions:
    """Knobs of relocalisation, place recognition, map merging and loop correction."""

    # appearance matching and PnP
    place: PlaceOptions = field(default_factory=PlaceOptions)
    # keyframe retrieval: a large candidate set is narrowed to the points of the keyframes most alike
    retrieval: RetrievalOptions = field(default_factory=RetrievalOptions)
    # similarity fit between the two point sets of one place
    join: JoinOptions = field(default_factory=JoinOptions)
    # loop correction
    pose_graph: PoseGraphOptions = field(default_factory=PoseGraphOptions)
    # points observed by the newest this many keyframes of the current map are not loop candidates
    recent_keyframes: int = 10
    # a loop whose similarity turns the current keyframe by less than this, degrees ...
    min_correction_deg: float = 0.5
    # ... and moves it by less than this fraction of its median scene depth (and changes the scale by
    # less than this fraction) only merges the duplicate points
    min_correction_rel: float = 0.01
    # only points seen with this much parallax (degrees) measure a loop's scale
    min_scale_parallax_deg: float = 2.0
    # a bridge (a turn followed by rotation alone) keeps its rotation; its scale and translation get
    # these weights
    bridge_scale_weight: float = 1e-3
    bridge_translation_weight: float = 0.05
    # after a map's first loop correction, a later loop moves only the keyframes since the previous
    # correction but at least the newest this many (and any back to a bridge it spans): a revisit keeps
    # the corrections of the revisits before it, and a correction's cost stays bounded on long footage
    max_corrected_keyframes: int = 100


@dataclass(frozen=True)
class PlaceMatch:
    """A recognised place: the current map's points and the recognised points of ``target``.

    Attributes:
        target: map of the recognised points.
        localisation: the frame posed against them.
        current_idx: points of the current map for the pairs, ``(K,)``.
        target_idx: the recognised points, ``(K,)``.
        target_from_current: similarity fitted to the pairs, ``(4, 4)``.
        inliers: pairs that agree with it.
    """

    target: int
    localisation: Localisation
    current_idx: np.ndarray
    target_idx: np.ndarray
    target_from_current: np.ndarray
    inliers: int


def relocalise(
    atlas: Atlas,
    feat: FrameFeatures,
    xy: np.ndarray,
    focal_px: float,
    opts: LoopOptions,
    predicted: tuple[int, np.ndarray, int] | None = None,
) -> tuple[int, Localisation] | None:
    """Pose ``feat`` (tracks at normalised ``xy (N, 2)``) in the map whose points it sees best.

    Args:
        atlas: the maps.
        feat: the frame's tracks and descriptors.
        xy: undistorted normalised coordinates of its tracks, ``(N, 2)``.
        focal_px: focal length, pixels.
        opts: matching options.
        predicted: the map tracked last, a predicted pose in it ``(4, 4)`` and the frames since its
            last pose: matching by projection there is tried first (a short loss), then every map.

    Returns:
        The map and the localisation (``query_idx`` indexes ``feat``'s tracks, ``point_idx`` the
        atlas points, all of that map), or None.
    """
    loc = None
    if predicted is not None:
        seg, cfw, frames = predicted
        cand = _described_points(atlas, atlas.points.segment[: atlas.points.n] == seg)
        for radius_px in opts.place.projection_radii_px:
            radius = (radius_px + frames * opts.place.projection_radius_growth_px) / focal_px
            loc = _localise(feat, xy, cand, atlas, focal_px, opts, (cfw, radius))
            if loc is not None:
                break
    if loc is None:
        cand = _described_points(atlas, np.ones(atlas.points.n, bool))
        cand = _retrieved(atlas, feat, cand, np.ones(len(atlas.keyframes), bool), opts)
        loc = _localise(feat, xy, cand, atlas, focal_px, opts)
    if loc is None:
        return None
    seg = _majority_segment(atlas, loc)
    sel = atlas.points.segment[loc.point_idx] == seg
    if np.count_nonzero(sel) < opts.place.min_inliers:
        return None
    return seg, Localisation(
        loc.cam_from_world, loc.query_idx[sel], loc.point_idx[sel], loc.matches, loc.rms_px
    )


def recognise_place(
    atlas: Atlas, feat: FrameFeatures, xy: np.ndarray, segment: int, focal_px: float, opts: LoopOptions
) -> PlaceMatch | None:
    """Look for the place ``feat`` shows among the points the current map ``segment`` is not tracking.

    Returns:
        The recognised place with a similarity to it, or None.
    """
    pts = atlas.points
    recent = np.zeros(pts.n, bool)
    eligible = np.ones(len(atlas.keyframes), bool)
    for k in atlas.segment_keyframes(segment)[-opts.recent_keyframes :]:
        recent[atlas.keyframes[k].point_idx] = True
        eligible[k] = False
    cand = _retrieved(atlas, feat, _described_points(atlas, ~recent), eligible, opts)
    loc = _localise(feat, xy, cand, atlas, focal_px, opts)
    if loc is None:
        return None
    target = _majority_segment(atlas, loc)
    sel = pts.segment[loc.point_idx] == target
    current = pts.lookup(feat.track_ids[loc.query_idx[sel]], segment)
    ok = current >= 0
    ok[ok] &= current[ok] != loc.point_idx[sel][ok]
    cur_idx, tgt_idx = current[ok], loc.point_idx[sel][ok]
    if len(cur_idx) < opts.join.min_shared_points:
        return None
    fit = similarity_from_views(
        atlas.keyframes[-1].cam_from_world,
        loc.cam_from_world,
        pts.points[cur_idx],
        pts.points[tgt_idx],
        opts.join,
        _well_triangulated(atlas, cur_idx, opts),
        scale_may_jump=target != segment or _has_bridge(atlas, segment),
    )
    if fit is None:
        return None
    sim, keep = fit
    return PlaceMatch(target, loc, cur_idx[keep], tgt_idx[keep], sim, int(np.count_nonzero(keep)))


def apply_place_match(
    atlas: Atlas, match: PlaceMatch, segment: int, frame_idx: int, opts: LoopOptions
) -> SegmentJoin | None:
    """Join map ``segment`` to the recognised map, or close the loop within it; in place.

    The current frame must be the newest keyframe of ``segment``. Returns what was done (None when a
    loop needed no correction and only duplicate points were merged).
    """
    scale = sim3_parts(match.target_from_current)[0]
    report = SegmentJoin(segment, match.target, frame_idx, len(match.current_idx), match.inliers, scale)
    if match.target != segment:
        older, younger = min(match.target, segment), max(match.target, segment)
        sim = match.target_from_current if younger == segment else sim3_inverse(match.target_from_current)
        _move_map(atlas, younger, older, sim)
        keep, drop = (
            (match.target_idx, match.current_idx)
            if older == match.target
            else (match.current_idx, match.target_idx)
        )
        atlas.merge_points(drop, keep)
        logger.info(
            "frame %d: map %d joined to map %d (%d points, scale %.3f)",
            frame_idx,
            younger,
            older,
            match.inliers,
            scale,
        )
        return SegmentJoin(younger, older, frame_idx, len(match.current_idx), match.inliers, scale)
    needs = _correction_needed(atlas, match, opts)
    if needs:
        _correct_loop(atlas, match, segment, opts)
        logger.info(
            "frame %d: loop closed in map %d (%d points, scale %.3f)",
            frame_idx,
            segment,
            match.inliers,
            scale,
        )
    atlas.merge_points(match.current_idx, match.target_idx)
    return report if needs else None


def _has_bridge(atlas: Atlas, segment: int) -> bool:
    """Whether map ``segment`` holds a bridge no loop has resolved yet: its scale after it is a guess."""
    keyframes = set(atlas.segment_keyframes(segment))
    return any(after in keyframes for _, after in atlas.bridges)


def _well_triangulated(atlas: Atlas, point_idx: np.ndarray, opts: LoopOptions) -> np.ndarray:
    """Which points ``(K,)`` were seen with ``min_scale_parallax_deg`` from their first and newest keyframes.

    Their depth, hence a scale measured on them, is well determined.
    """
    pts = atlas.points
    first = np.stack([atlas.keyframes[r].cam_from_world for r in pts.ref_keyframe[point_idx]])
    centres = invert_rigid_matrices(first)[:, :3, 3]
    newest = invert_rigid_matrices(atlas.keyframes[-1].cam_from_world)[:3, 3]
    a, b = centres - pts.points[point_idx], newest - pts.points[point_idx]
    cos = np.sum(a * b, axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))) >= opts.min_scale_parallax_deg


def _described_points(atlas: Atlas, allowed: np.ndarray) -> np.ndarray:
    pts = atlas.points
    n = pts.n
    ok = allowed[:n] & pts.has_descriptor[:n] & (pts.segment[:n] != MERGED)
    return np.nonzero(ok)[0]


def _retrieved(
    atlas: Atlas, feat: FrameFeatures, cand: np.ndarray, eligible: np.ndarray, opts: LoopOptions
) -> np.ndarray:
    """The candidate points ``cand (P,)`` that the keyframes most alike ``feat`` observe.

    Only when there are more than ``retrieval.exhaustive_max_points`` and the index has its
    vocabulary (`place_index`); ``eligible (K,)`` says which keyframes may be retrieved.
    """
    if len(cand) <= opts.retrieval.exhaustive_max_points:
        return cand
    top = atlas.place_index.query(feat.described()[1], eligible, opts.retrieval)
    if top is None:
        return cand
    seen = np.zeros(atlas.points.n, bool)
    for k in top.tolist():
        seen[atlas.keyframes[k].point_idx] = True
    return cand[seen[cand]]


def _localise(
    feat: FrameFeatures,
    xy: np.ndarray,
    cand: np.ndarray,
    atlas: Atlas,
    focal_px: float,
    opts: LoopOptions,
    predicted: tuple[np.ndarray, float] | None = None,
) -> Localisation | None:
    """``localise`` of ``feat``'s described tracks against candidate points; indices into feat / atlas."""
    idx, desc = feat.described()
    if len(idx) < opts.place.min_inliers or len(cand) < opts.place.min_inliers:
        return None
    pts = atlas.points
    both = np.concatenate([cand, cand])  # each point by its latest and its first look
    looks = np.concatenate([pts.descriptor[cand], pts.first_descriptor[cand]])
    loc = localise(xy[idx], desc, pts.points[both], looks, focal_px, opts.place, predicted=predicted)
    if loc is None:
        return None
    point_idx, first = np.unique(
        both[loc.point_idx], return_index=True
    )  # a point matched by both looks: once
    return Localisation(loc.cam_from_world, idx[loc.query_idx][first], point_idx, loc.matches, loc.rms_px)


def _majority_segment(atlas: Atlas, loc: Localisation) -> int:
    segs, counts = np.unique(atlas.points.segment[loc.point_idx], return_counts=True)
    return int(segs[np.argmax(counts)])


def _move_map(atlas: Atlas, source: int, target: int, target_from_source: np.ndarray) -> None:
    """Move every keyframe, point and frame pose of map ``source`` into map ``target``'s frame."""
    for k in atlas.segment_keyframes(source):
        kf = atlas.keyframes[k]
        kf.cam_from_world = cam_from_world_after_sim3(kf.cam_from_world, target_from_source)
        atlas.keyframe_segment[k] = target
    idx = atlas.segment_points(source)
    atlas.points.points[idx] = transform_points(target_from_source, atlas.points.points[idx])
    atlas.points.segment[idx] = target
    for row in atlas.rows:
        if row.segment == source:
            row.cam_from_world = cam_from_world_after_sim3(row.cam_from_world, target_from_source)
            row.segment = target
    atlas.loop_anchors.pop(source, None)  # the joined map keeps the older map's last correction


def _correction_needed(atlas: Atlas, match: PlaceMatch, opts: LoopOptions) -> bool:
    """Whether the loop's similarity moves the current keyframe by more than the noise floor."""
    kf = atlas.keyframes[-1]
    moved = cam_from_world_after_sim3(kf.cam_from_world, match.target_from_current)
    rel = moved @ invert_rigid_matrices(kf.cam_from_world)
    depth = np.median(
        (atlas.points.points[match.current_idx] @ kf.cam_from_world[:3, :3].T + kf.cam_from_world[:3, 3])[
            :, 2
        ]
    )
    angle = np.degrees(np.linalg.norm(so3_log(rel[None, :3, :3])[0]))
    shift = np.linalg.norm(rel[:3, 3]) / max(depth, 1e-9)
    scale = abs(np.log(sim3_parts(match.target_from_current)[0]))
    return bool(
        angle > opts.min_correction_deg or shift > opts.min_correction_rel or scale > opts.min_correction_rel
    )


def _correct_loop(atlas: Atlas, match: PlaceMatch, segment: int, opts: LoopOptions) -> None:
    """Correct the map for the loop; move its keyframes, points and frames.

    A Sim(3) pose graph spreads the correction over the keyframes after the loop's keyframe. Once a map
    has been corrected for a loop, a later loop holds the keyframes up to that correction (they agree
    with the places they recognised; the drift the new loop measures accrued since), but always frees
    at least the newest ``max_corrected_keyframes``: on a path that revisits one place lap after lap,
    spreading each revisit's correction back to the first lap undid the corrections of the revisits
    before, and cost a solve over every lap each time; holding everything up to the last correction
    crammed a correction onto a few keyframes and broke tracking (`bench.loop_closures`' notes). A
    bridge inside the loop (a turn followed by rotation alone, after which the map went on at a
    guessed scale) is by far its least known link: the keyframes back to the oldest bridge are always
    free, its scale and translation are nearly free in the graph, the solve starts with the whole
    correction on the newest bridge, and the loop resolves the bridges it spans. Without bridges the
    correction spreads evenly along the free keyframes (ORB-SLAM's essential graph).
    """
    kf_ids = atlas.segment_keyframes(segment)
    current = len(kf_ids) - 1
    obs = [atlas.keyframes[k].point_idx for k in kf_ids]
    owner = np.repeat(np.arange(len(kf_ids)), [len(o) for o in obs])
    seen = np.bincount(owner[np.isin(np.concatenate(obs), match.target_idx)], minlength=len(kf_ids))
    loop = int(np.argmax(seen[:-1])) if current > 0 else 0
    cfw = np.stack([atlas.keyframes[k].cam_from_world for k in kf_ids])
    bridges = set(atlas.bridges)
    bridged = [i for i in range(loop + 1, current + 1) if (kf_ids[i - 1], kf_ids[i]) in bridges]
    held = _held_until(atlas, segment, kf_ids, loop, bridged, opts)
    start = cfw.copy()
    if bridged:  # the newest bridge takes the whole correction to begin with
        start[bridged[-1] :] = cfw[bridged[-1] :] @ sim3_inverse(match.target_from_current)
        for i in bridged:
            atlas.bridges.remove((kf_ids[i - 1], kf_ids[i]))
    new_sim = _loop_pose_graph(cfw, loop, held, match.target_from_current, start, bridged, opts)
    # world_new_from_world_old of each keyframe: its new similarity pose undone after its old rigid one
    correction = np.stack([sim3_inverse(s) @ c for s, c in zip(new_sim, cfw, strict=True)])
    rigid, _ = rigid_from_sim3(new_sim)
    for i, k in enumerate(kf_ids):
        atlas.keyframes[k].cam_from_world = rigid[i]
    pts = atlas.points
    idx = atlas.segment_points(segment)
    slot = np.full(len(atlas.keyframes), -1)
    slot[kf_ids] = np.arange(len(kf_ids))
    ref = slot[pts.ref_keyframe[idx]]
    for i in np.unique(ref[ref > held]):
        sel = idx[ref == i]
        pts.points[sel] = transform_points(correction[i], pts.points[sel])
    kf_frames = np.array([atlas.keyframes[k].frame_idx for k in kf_ids])
    first_moved = int(kf_frames[held + 1]) if held < current else len(atlas.rows)
    for f in range(first_moved, len(atlas.rows)):  # frames up to the last held keyframe stay
        row = atlas.rows[f]
        if row.segment != segment or row.is_keyframe:
            continue
        i = int(np.searchsorted(kf_frames, f, side="right")) - 1
        row.cam_from_world = cam_from_world_after_sim3(row.cam_from_world, correction[i])
    for k in kf_ids:
        atlas.rows[atlas.keyframes[k].frame_idx].cam_from_world = atlas.keyframes[k].cam_from_world
    atlas.loop_anchors[segment] = kf_ids[current]


def _held_until(
    atlas: Atlas, segment: int, kf_ids: list[int], loop: int, bridged: list[int], opts: LoopOptions
) -> int:
    """Position in ``kf_ids`` of the newest keyframe a loop correction holds in place (see `_correct_loop`).

    The loop's keyframe, or, when the map was corrected for a loop before, that correction's keyframe
    but no later than ``max_corrected_keyframes`` before the current one; never past the oldest bridge
    in the loop (``bridged``: positions of keyframes after a bridge).
    """
    current = len(kf_ids) - 1
    held = loop
    anchor = atlas.loop_anchors.get(segment)
    if anchor is not None:
        at = int(np.searchsorted(kf_ids, anchor))  # kf_ids ascend
        if at < len(kf_ids) and kf_ids[at] == anchor:
            held = max(loop, min(at, current - opts.max_corrected_keyframes))
    return min(held, bridged[0] - 1) if bridged else held


def _loop_pose_graph(
    cfw: np.ndarray,
    loop: int,
    held: int,
    target_from_current: np.ndarray,
    start: np.ndarray,
    bridged: list[int],
    opts: LoopOptions,
) -> np.ndarray:
    """Similarity poses ``(K, 4, 4)`` of the map's keyframes after a Sim(3) pose graph closes the loop.

    ``cfw`` are the map's keyframe poses ``(K, 4, 4)``, oldest first; those up to position ``held``
    are held; ``bridged`` lists the positions of the keyframes that follow a bridge.
    """
    current = len(cfw) - 1
    steps = (1, 2)  # odometry edges and their skip-one neighbours keep the local shape
    src = np.concatenate([*(np.arange(len(cfw) - s) for s in steps), [loop]])
    dst = np.concatenate([*(np.arange(s, len(cfw)) for s in steps), [current]])
    measured = cfw[dst[:-1]] @ invert_rigid_matrices(cfw[src[:-1]])
    corrected = cfw[current] @ sim3_inverse(target_from_current)  # cam_from_world in the old frame
    loop_edge = corrected @ invert_rigid_matrices(cfw[loop])
    fixed = np.arange(len(cfw)) <= held
    weight = np.ones((len(src), 7))
    for i in bridged:
        spans = (src[:-1] < i) & (dst[:-1] >= i)
        weight[:-1][spans, 0] = opts.bridge_scale_weight
        weight[:-1][spans, 4:] = opts.bridge_translation_weight
    return optimise_sim3_graph(
        cfw, src, dst, np.concatenate([measured, loop_edge[None]]), fixed, opts.pose_graph, weight, start
    )
