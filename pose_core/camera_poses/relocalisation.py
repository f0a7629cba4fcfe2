"""Find a frame in an existing map by appearance: ORB matching to map points, then PnP + RANSAC.

Tracking keys map points by KLT track id; once the tracks are gone (a fast turn, a covered lens, a
cut) only appearance can say which map points a new frame sees. ``localise`` matches the frame's
track descriptors to the descriptors of candidate map points (Hamming distance, a ratio test that
does not count a second match on a near-duplicate point, one match per map point), then fits a pose
with PnP inside RANSAC and refines it by robust motion-only optimisation. The same query serves
relocalisation after a loss, loop detection (candidates: points not seen recently) and place
recognition between maps (candidates: another map's points), as in ORB-SLAM's relocalisation and
place recognition, by direct 2-D/3-D matching; on a large map the callers first narrow the
candidates to the points of the keyframes a bag-of-words keyframe database returns (`place_index`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np
from scipy.spatial import cKDTree

from pose_core.camera_poses.ba import BAOptions, optimize_pose

__all__ = ["Localisation", "PlaceOptions", "localise", "match_by_projection", "match_descriptors"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlaceOptions:
    """Knobs of appearance matching and its geometric check."""

    # a match needs a Hamming distance at most this, bits of 256
    max_hamming: int = 64
    # ... and below this fraction of the second best (unless the second best is a near-duplicate point)
    ratio: float = 0.85
    # two map points closer than this fraction of the candidates' spread are duplicates of one place
    duplicate_rel_dist: float = 0.01
    # RANSAC threshold of PnP, pixels
    ransac_px: float = 4.0
    # RANSAC iterations of PnP
    ransac_iterations: int = 1000
    # inliers (after refinement) needed to accept a pose
    min_inliers: int = 30
    # search radii of matching by projection from a predicted pose, pixels, tried in turn (small first:
    # fewer look-alikes compete); each grows by `projection_radius_growth_px` per frame since the last pose
    projection_radii_px: tuple[float, ...] = (15.0, 40.0, 100.0)
    projection_radius_growth_px: float = 2.0
    # inliers needed when matching by projection (the prediction already rules out most wrong poses)
    min_inliers_predicted: int = 20
    # the RANSAC pose is refined by this many motion-only iterations; inliers then within this, pixels
    refine_iterations: int = 5
    inlier_px: float = 3.0
    # ... and the fraction of the matches they must be
    min_inlier_ratio: float = 0.15


@dataclass(frozen=True)
class Localisation:
    """A frame posed against map points by appearance.

    Attributes:
        cam_from_world: pose in the candidates' world frame, ``(4, 4)``.
        query_idx: index into the query's tracks of each inlier, ``(K,)``.
        point_idx: the map point each inlier sees, ``(K,)``.
        matches: descriptor matches before the geometric check.
        rms_px: RMS reprojection error of the inliers, pixels.
    """

    cam_from_world: np.ndarray
    query_idx: np.ndarray
    point_idx: np.ndarray
    matches: int
    rms_px: float


def match_descriptors(
    query: np.ndarray, train: np.ndarray, train_xyz: np.ndarray, opts: PlaceOptions
) -> tuple[np.ndarray, np.ndarray]:
    """Matches from query descriptors ``(Q, 32)`` to train descriptors ``(T, 32)`` at points ``(T, 3)``.

    Returns:
        Query and train indices of the accepted matches, ``(M,)`` each, at most one per train row.
    """
    if len(query) == 0 or len(train) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(query, train, k=2)
    pairs = np.array(
        [
            [m[0].queryIdx, m[0].trainIdx, m[1].trainIdx, m[0].distance, m[1].distance]
            for m in knn
            if len(m) == 2
        ],
        float,
    ).reshape(-1, 5)
    qi, ti, t2 = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64), pairs[:, 2].astype(np.int64)
    d1, d2 = pairs[:, 3], pairs[:, 4]
    spread = float(np.median(np.linalg.norm(train_xyz - np.median(train_xyz, axis=0), axis=1)))
    duplicate = np.linalg.norm(train_xyz[ti] - train_xyz[t2], axis=1) < opts.duplicate_rel_dist * spread
    ok = (d1 <= opts.max_hamming) & ((d1 < opts.ratio * d2) | duplicate)
    qi, ti, d1 = qi[ok], ti[ok], d1[ok]
    best = np.lexsort((d1, ti))  # per train row, the closest query
    first = best[np.r_[True, ti[best][1:] != ti[best][:-1]]] if len(best) else best
    return qi[first], ti[first]


def match_by_projection(
    query_xy: np.ndarray,
    query: np.ndarray,
    points: np.ndarray,
    train: np.ndarray,
    cam_from_world: np.ndarray,
    radius: float,
    opts: PlaceOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Matches where a predicted pose projects the points near the query's tracks.

    ORB-SLAM's search by projection: each query track takes the closest descriptor among the points
    within ``radius`` (normalised units) of it, ratio-tested among them.

    Args:
        query_xy: normalised coordinates of the query tracks, ``(Q, 2)``.
        query: their descriptors, ``(Q, 32)``.
        points: candidate points, world frame, ``(P, 3)``.
        train: their descriptors, ``(P, 32)``.
        cam_from_world: predicted pose, ``(4, 4)``.
        radius: search radius around each projection, normalised units.
        opts: distance and ratio limits.

    Returns:
        Query and point indices of the matches, ``(M,)`` each, at most one per point.
    """
    x_in_cam = points @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
    front = np.nonzero(x_in_cam[:, 2] > 1e-6)[0]
    if len(front) == 0 or len(query_xy) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    proj = x_in_cam[front, :2] / x_in_cam[front, 2:]
    near = cKDTree(proj).query_ball_point(query_xy, radius)
    bits = np.unpackbits(train[front], axis=1)
    matches: list[tuple[int, int, int]] = []  # query, point, Hamming distance
    for q, cands in enumerate(near):
        if not cands:
            continue
        d = np.count_nonzero(bits[cands] != np.unpackbits(query[q]), axis=1)
        order = np.argsort(d)
        if d[order[0]] > opts.max_hamming or (len(d) > 1 and d[order[0]] >= opts.ratio * d[order[1]]):
            continue
        matches.append((q, front[cands[order[0]]], d[order[0]]))
    qi, pi, dist = np.array(matches, np.int64).reshape(-1, 3).T
    best = np.lexsort((dist, pi))
    first = best[np.r_[True, pi[best][1:] != pi[best][:-1]]] if len(best) else best
    return qi[first], pi[first]


def localise(
    query_xy: np.ndarray,
    query_desc: np.ndarray,
    points: np.ndarray,
    point_desc: np.ndarray,
    focal_px: float,
    opts: PlaceOptions,
    seed: int = 0,
    predicted: tuple[np.ndarray, float] | None = None,
) -> Localisation | None:
    """Pose of a frame against candidate map points by appearance.

    Args:
        query_xy: undistorted normalised coordinates of the frame's described tracks, ``(Q, 2)``.
        query_desc: their descriptors, ``(Q, 32)`` uint8.
        points: candidate map points, world frame, ``(P, 3)``.
        point_desc: their descriptors, ``(P, 32)`` uint8.
        focal_px: focal length, pixels (turns pixel thresholds into normalised ones).
        opts: matching, RANSAC and refinement options.
        seed: seed of OpenCV's RNG (reproducible RANSAC).
        predicted: a predicted pose ``(4, 4)`` and search radius (normalised units): matches are then
            searched by projection (``match_by_projection``), not over every candidate.

    Returns:
        The pose and its inlier matches (indices into ``query_*`` and ``points``), or None when too
        few matches survive (a normal outcome: the frame shows somewhere else).
    """
    if predicted is None:
        qi, pi = match_descriptors(query_desc, point_desc, points, opts)
    else:
        qi, pi = match_by_projection(
            query_xy, query_desc, points, point_desc, predicted[0], predicted[1], opts
        )
    need = opts.min_inliers if predicted is None else opts.min_inliers_predicted
    if len(qi) < need:
        return None
    cv2.setRNGSeed(seed)
    ok, rvec, tvec, inl = cv2.solvePnPRansac(
        points[pi].astype(np.float64),
        query_xy[qi].astype(np.float64),
        np.eye(3),
        None,
        iterationsCount=opts.ransac_iterations,
        reprojectionError=opts.ransac_px / focal_px,
        confidence=0.999,
        flags=cv2.SOLVEPNP_AP3P,
    )
    if not ok or inl is None or len(inl) < need:
        return None
    cfw = np.eye(4)
    cfw[:3, :3], cfw[:3, 3] = cv2.Rodrigues(rvec)[0], tvec.ravel()
    ransac_in = (
        inl.ravel()
    )  # refined on RANSAC's inliers: a robust fit over every match drifts when half are wrong
    refine = BAOptions(max_iterations=opts.refine_iterations)
    cfw = optimize_pose(
        cfw, points[pi[ransac_in]], query_xy[qi[ransac_in]], focal_px, refine, opts.inlier_px
    ).cam_from_world
    fit = optimize_pose(cfw, points[pi], query_xy[qi], focal_px, BAOptions(max_iterations=0), opts.inlier_px)
    n_in = int(np.count_nonzero(fit.inliers))
    if n_in < need or n_in < opts.min_inlier_ratio * len(qi):
        return None
    return Localisation(fit.cam_from_world, qi[fit.inliers], pi[fit.inliers], len(qi), fit.rms_px)
