"""Metric scale of a monocular map from the wearer's hands resting on static scene structure.

Monocular tracking gives the map and the camera path in arbitrary units; the hands stage places every
hand in metres in the camera frame (a canonical adult hand posed on its keypoints, `metric_fit`). Where
a hand rests on a surface of the map, both measure the same distance: the camera's distance to that
surface is `c_u` map units (from the map) and, the hand touching it, the distance of the hand's
lowest point along the surface normal in metres. Their ratio is metres per map unit.

How (`scale_from_hand_contact`), per wearer-hand observation in a frame whose camera centre was
measured (keyframe or motion-only, not held or interpolated):

1. **Support plane.** Map points that lie in front of the camera and whose image position is within
   `support_radius_m` of a hand keypoint (measured at that keypoint's depth, so the region is ~the same
   patch of table near and far) are the hand's surroundings. A plane `n . X = c_u` (camera frame, map
   units, `n` unit and pointing away from the camera, `c_u > 0`) is fitted to them by RANSAC with an
   inlier band of `plane_tol` times their median depth (scale free) and refined on its inliers. It is
   kept with at least `min_plane_points` inliers spread in two directions (not a line of points along
   a table edge) and seen at less than `max_incidence_deg` from its normal (a grazing plane's distance
   is ill-conditioned). The fitted hand's own orientation is not used: on the real desk clip its palm
   plane was 50-90 degrees off the desk it rested on.
2. **The hand on the plane.** `h_m = max_k n . x_k` over the hand's 21 keypoints (metres): the keypoint
   nearest the plane, the lowest point of a hand resting on it. Touching: `s c_u = h_m + contact_offset_m`,
   so this observation says `s = (h_m + contact_offset_m) / c_u`.
3. **Slow in the world.** The palm's world speed (wrist and finger bases, Savitzky-Golay derivative over
   `speed_window_s`) at the current scale is at most `max_hand_speed_mps`: a resting or pressing hand,
   not one reaching or carrying.

**Moments.** Such observations of one hand at most `max_gap_s` apart make a contact moment of at
least `min_moment_observations` spanning `min_moment_s` (split every `max_moment_s`); a moment's
value is the median of its observations' scales. A hand held still above the surface, or a plane of
other points (a box, a cup) gives a moment with another value, so the moments are reconciled: the
scale that puts the most moments' hands within `contact_tol_m` of their surfaces is the start; then
the median of those in contact, until the set stops changing. Evidence is judged in metres, at the
hand's size: no threshold depends on the map's units.

**Uncertainty.** The moments in contact are the independent measurements (frames within one share
the fit's and the map's errors): their part of the relative standard error is `1.2533 s_log / sqrt(n)`
(the median's efficiency, `s_log` the standard deviation of their log values), times
`t_{0.975, n-1} / 1.96` so that +-1.96 standard errors is a 95 % interval with few moments. Contact
itself is known only to `contact_tol_m`: a hand counted in contact may hover up to that, which
biases the scale low by up to `contact_tol_m / h` (`h` the hands' median distance to their planes,
metres) in every moment alike; its standard deviation as a uniform error, `contact_tol_m / (h
sqrt(12))`, is added in quadrature (`rel_std_fit`). The hand fit's size prior adds
`hand_size_rel_std` (one wearer's frames share their hand size, so it never averages out); `rel_std`
is all three in quadrature. Refused (`metres_per_unit` None, with the reason)
with fewer than `min_moments` moments in contact or a fit error above `max_rel_std`.

Convention:
    `world_from_cam` `(F, 4, 4)` maps camera to world coordinates, translation in map units; camera
    frame OpenCV (x right, y down, z forward); hand keypoints in the camera frame, metres, MediaPipe
    order; map points in the world frame, map units.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.signal import savgol_filter
from scipy.stats import t as student_t

from pose_core.errors import ShapeError
from pose_core.hands.estimator import RIGID_PALM

__all__ = [
    "ContactMoment",
    "HandScale",
    "HandScaleInputs",
    "HandScaleOptions",
    "SupportPlane",
    "fit_support_plane",
    "scale_from_hand_contact",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# Keypoints of the rigid palm (wrist and the four finger bases): their mean is the hand's position for
# the speed test (fingers curl while a resting hand stays put).
_PALM = np.array(RIGID_PALM)
# The median's standard error over the mean's for normal data (sqrt(pi / 2)).
_MEDIAN_EFFICIENCY = 1.2533


@dataclass(frozen=True)
class HandScaleOptions:
    """Settings of the metric scale from hands resting on the map's surfaces."""

    # Estimate the scale from the hands (needs the map's points: fusion stacks `ba_points`).
    enabled: bool = True
    # Map points whose image position is within this distance of a hand keypoint, measured at the
    # keypoint's depth, are the hand's surroundings, metres (a hand's length: enough table around a
    # hand for a plane where the table has little texture).
    support_radius_m: float = 0.15
    # Only map points seen in at least this many keyframes (well triangulated) are used.
    min_point_observations: int = 3
    # RANSAC inlier band of the support plane, as a fraction of its points' median depth (2 %: ~1 cm
    # at arm's length; monocular points near the camera are a few mm to a cm off).
    plane_tol: float = 0.02
    # Fewest inliers of a support plane.
    min_plane_points: int = 8
    # The inliers' second principal spread over their first must reach this (0: a line of points,
    # e.g. a table edge, which does not fix a plane).
    min_plane_spread: float = 0.15
    # Largest angle between the ray to the hand's contact keypoint and the plane's normal, degrees.
    max_incidence_deg: float = 80.0
    # RANSAC draws per support plane.
    ransac_iterations: int = 100
    # Height of the lowest hand keypoint above the surface it touches, metres. MediaPipe's fingertip
    # keypoints sit at the end of the finger, within a few mm of what it presses; 0 leaves that ~1 %
    # (5 mm at 50 cm, the scale too small) inside the hand-size term.
    contact_offset_m: float = 0.0
    # Savitzky-Golay window of the palm's world velocity, seconds.
    speed_window_s: float = 0.3
    # A hand resting or pressing moves at most this fast in the world, m/s (reaching and carrying
    # hands move at 0.3-1 m/s; the fit's depth noise leaves a few cm/s on a still hand).
    max_hand_speed_mps: float = 0.1
    # A moment in contact: its hand's lowest keypoint within this distance of its support plane at
    # the scale, metres: twice the noise of one moment's hand depth at arm's length (~1 cm: 2-3 % of
    # 40 cm on real fits). A hand held still within this of a surface counts as touching it: the scale
    # can be low by up to this over the hand's distance (the contact term of the standard error).
    contact_tol_m: float = 0.02
    # Usable observations of a hand at most this far apart belong to one moment, seconds (a frame
    # or two without a plane or over the speed limit does not end a rest).
    max_gap_s: float = 0.2
    # A contact moment has at least this many observations spanning at least this long, seconds (a
    # hand that only pauses, at the turn of a reach, is shorter) ...
    min_moment_observations: int = 3
    min_moment_s: float = 0.2
    # ... and a longer rest is split into moments of at most this long, seconds (the camera moves and
    # the fit's noise changes over a second).
    max_moment_s: float = 1.0
    # Refuse with fewer moments in contact than this.
    min_moments: int = 3
    # Refuse when the fit's relative standard error (without the size prior) is above this.
    max_rel_std: float = 0.05
    # Relative spread of the wearer's true hand size about the canonical prior the fit uses (depth,
    # hence this scale, is proportional to it): ~7 % is one standard deviation of adult hand length,
    # men and women pooled, in anthropometric surveys. Shared by all frames of a wearer.
    hand_size_rel_std: float = 0.07

    def __post_init__(self) -> None:
        problems = []
        positive = {
            "support_radius_m": self.support_radius_m,
            "plane_tol": self.plane_tol,
            "speed_window_s": self.speed_window_s,
            "max_hand_speed_mps": self.max_hand_speed_mps,
            "contact_tol_m": self.contact_tol_m,
            "max_moment_s": self.max_moment_s,
            "max_gap_s": self.max_gap_s,
            "max_rel_std": self.max_rel_std,
        }
        problems += [f"{k} must be > 0, got {v}" for k, v in positive.items() if not v > 0]
        if self.min_plane_points < 3 or self.min_moments < 2 or self.min_moment_observations < 1:
            problems.append("min_plane_points must be >= 3, min_moments >= 2, min_moment_observations >= 1")
        if not 0.0 < self.max_incidence_deg < 90.0 or self.hand_size_rel_std < 0:
            problems.append("max_incidence_deg must be in (0, 90) and hand_size_rel_std >= 0")
        if problems:
            raise ValueError("hand scale options: " + "; ".join(problems))


@dataclass(frozen=True)
class SupportPlane:
    """A plane `n . X = c_u` fitted to map points, camera frame, map units.

    Attributes:
        normal: unit normal pointing away from the camera, `(3,)`.
        distance: the camera's distance to the plane `c_u`, map units (> 0).
        inliers: which of the given points support it, `(M,)` bool.
    """

    normal: FloatArray
    distance: float
    inliers: NDArray[np.bool_]


@dataclass(frozen=True)
class HandScaleInputs:
    """What the hand scale looks at (F posed frames, N hand observations, P map points).

    Attributes:
        ts_s: frame times, seconds, `(F,)`.
        world_from_cam: camera poses, translation in map units, `(F, 4, 4)`.
        measured: the frame's camera centre was measured (not held or interpolated), `(F,)` bool.
        camera_k: pinhole intrinsics of the hand keypoints' images, pixels, `(3, 3)`.
        points_world: map points, world frame, map units, `(P, 3)`.
        frame_pos: each observation's frame (index into the frames), `(N,)` int.
        hand_id: each observation's hand (its identity), `(N,)`.
        keypoints_cam: metric hand fits, camera frame, metres, `(N, 21, 3)`.
        keypoints_px: the fits' image keypoints, pixels, `(N, 21, 2)`.
    """

    ts_s: FloatArray
    world_from_cam: FloatArray
    measured: NDArray[np.bool_]
    camera_k: FloatArray
    points_world: FloatArray
    frame_pos: NDArray[np.int64]
    hand_id: np.ndarray
    keypoints_cam: FloatArray
    keypoints_px: FloatArray

    def __post_init__(self) -> None:
        f, n = len(self.ts_s), len(self.frame_pos)
        if (
            self.world_from_cam.shape != (f, 4, 4)
            or self.measured.shape != (f,)
            or self.camera_k.shape != (3, 3)
            or self.points_world.ndim != 2
            or self.points_world.shape[1:] != (3,)
            or self.hand_id.shape != (n,)
            or self.keypoints_cam.shape != (n, 21, 3)
            or self.keypoints_px.shape != (n, 21, 2)
        ):
            raise ShapeError(
                "HandScaleInputs",
                self.keypoints_cam.shape,
                f"({f}, 4, 4) poses, (P, 3) points, ({n}, 21, 3) hands",
            )


@dataclass(frozen=True)
class ContactMoment:
    """One run of slow observations of a hand over a support plane.

    Attributes:
        hand_id: the hand.
        frame_pos: its observations' frames (indices into the frames), `(K,)`.
        metres_per_unit: the median of its observations' scales.
        hand_distance_m: median distance of the hand's lowest keypoint along the plane normal, metres.
        plane_distance_units: median camera-to-plane distance `c_u`, map units.
        in_contact: the hand is within `contact_tol_m` of its plane at the chosen scale.
    """

    hand_id: object
    frame_pos: NDArray[np.int64]
    metres_per_unit: float
    hand_distance_m: float
    plane_distance_units: float
    in_contact: bool


@dataclass(frozen=True)
class HandScale:
    """The hands' answer for one episode.

    Attributes:
        metres_per_unit: metres per map unit; None when refused (see `reason`).
        rel_std: relative standard error, fit and hand-size prior together; inf when refused.
        rel_std_fit: the fit's part (spread of the moments in contact and the contact tolerance),
            without the hand-size prior; inf when unknown.
        moments: every moment found (in contact or not), in time order per hand.
        observations_with_plane: observations that had a support plane.
        reason: why the scale was refused; None when it was not.
    """

    metres_per_unit: float | None
    rel_std: float
    rel_std_fit: float
    moments: tuple[ContactMoment, ...]
    observations_with_plane: int
    reason: str | None

    @property
    def moments_in_contact(self) -> int:
        """Moments that gave the scale."""
        return sum(m.in_contact for m in self.moments)


def fit_support_plane(
    points_cam: FloatArray, opts: HandScaleOptions, rng: np.random.Generator
) -> SupportPlane | None:
    """A plane through map points by RANSAC (inliers within `plane_tol` of their median depth).

    Args:
        points_cam: points in the camera frame, map units, `(M, 3)`, in front of the camera.
        opts: `plane_tol`, `min_plane_points`, `min_plane_spread`, `ransac_iterations`.
        rng: random source of the RANSAC draws.

    Returns:
        The plane, or None when no plane has enough inliers spread in two directions (or it passes
        through the camera).
    """
    m = len(points_cam)
    if m < max(3, opts.min_plane_points):
        return None
    tol = opts.plane_tol * float(np.median(points_cam[:, 2]))
    draws = np.stack([rng.choice(m, 3, replace=False) for _ in range(opts.ransac_iterations)])
    a, b, c = (points_cam[draws[:, i]] for i in range(3))
    normals = np.cross(b - a, c - a)
    norm = np.linalg.norm(normals, axis=1)
    ok = norm > 1e-12
    if not ok.any():
        return None
    normals = normals[ok] / norm[ok, None]
    offsets = np.einsum("ij,ij->i", normals, a[ok])
    inliers = np.abs(points_cam @ normals.T - offsets) <= tol  # (M, T)
    best = inliers[:, int(np.argmax(inliers.sum(axis=0)))]
    for _ in range(2):  # least-squares refinement on the inliers, then their new set
        if best.sum() < opts.min_plane_points:
            return None
        centre = points_cam[best].mean(axis=0)
        _, spread, vt = np.linalg.svd(points_cam[best] - centre, full_matrices=False)
        normal = vt[2]
        best = np.abs((points_cam - centre) @ normal) <= tol
    if best.sum() < opts.min_plane_points or spread[1] < opts.min_plane_spread * spread[0]:
        return None
    distance = float(normal @ centre)
    if distance < 0:
        normal, distance = -normal, -distance
    if distance <= tol:
        return None
    return SupportPlane(normal, distance, best)


def _observation_planes(inp: HandScaleInputs, opts: HandScaleOptions) -> tuple[FloatArray, FloatArray]:
    """Per observation: hand distance along its plane's normal (m) and the plane's distance (units).

    NaN where the frame's centre was not measured, or no support plane holds.
    """
    n = len(inp.frame_pos)
    hand_m, plane_u = np.full(n, np.nan), np.full(n, np.nan)
    rng = np.random.default_rng(0)
    focal = float(inp.camera_k[0, 0])
    cos_max = np.cos(np.radians(opts.max_incidence_deg))
    for i in np.flatnonzero(inp.measured[inp.frame_pos]):
        cam_from_world = np.linalg.inv(inp.world_from_cam[inp.frame_pos[i]])
        pts = inp.points_world @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
        pts = pts[pts[:, 2] > 1e-9]
        kp, px = inp.keypoints_cam[i], inp.keypoints_px[i]
        if not len(pts) or not (kp[:, 2] > 0).all():
            continue
        uv = pts[:, :2] / pts[:, 2:] * np.diag(inp.camera_k)[:2] + inp.camera_k[:2, 2]
        radius_px = focal * opts.support_radius_m / kp[:, 2]  # (21,)
        near = (np.linalg.norm(uv[:, None] - px[None], axis=-1) <= radius_px).any(axis=1)
        plane = fit_support_plane(pts[near], opts, rng)
        if plane is None:
            continue
        along = kp @ plane.normal
        low = int(np.argmax(along))
        if along[low] <= 0 or along[low] < cos_max * np.linalg.norm(kp[low]):
            continue
        hand_m[i], plane_u[i] = along[low], plane.distance
    return hand_m, plane_u


def _palm_speed(inp: HandScaleInputs, scale: float, opts: HandScaleOptions) -> FloatArray:
    """World speed of each observation's palm at `scale` metres per unit, m/s; NaN where unknown."""
    speed = np.full(len(inp.frame_pos), np.nan)
    dt = float(np.median(np.diff(inp.ts_s))) if len(inp.ts_s) > 1 else 1.0
    window = max(3, int(round(opts.speed_window_s / dt)) | 1)
    palm = inp.keypoints_cam[:, _PALM].mean(axis=1)
    pose = inp.world_from_cam[inp.frame_pos]
    world = np.einsum("nij,nj->ni", pose[:, :3, :3], palm) + scale * pose[:, :3, 3]
    for hand in np.unique(inp.hand_id):
        mine = np.flatnonzero(inp.hand_id == hand)
        mine = mine[np.argsort(inp.frame_pos[mine], kind="stable")]
        breaks = np.flatnonzero(np.diff(inp.frame_pos[mine]) != 1) + 1
        for run in np.split(mine, breaks):
            if len(run) >= window:
                velocity = savgol_filter(world[run], window, 2, deriv=1, delta=dt, axis=0)
                speed[run] = np.linalg.norm(velocity, axis=1)
    return speed


def _moments(
    inp: HandScaleInputs, usable: NDArray[np.bool_], hand_m: FloatArray, plane_u: FloatArray,
    opts: HandScaleOptions,
) -> list[tuple[object, NDArray[np.int64], float, float, float]]:  # fmt: skip
    """Runs of usable observations per hand: (hand, observations, value, hand_m, plane_u) each."""
    out = []
    dt = float(np.median(np.diff(inp.ts_s))) if len(inp.ts_s) > 1 else 0.0  # a frame's own duration
    for hand in np.unique(inp.hand_id[usable]):
        mine = np.flatnonzero(usable & (inp.hand_id == hand))
        mine = mine[np.argsort(inp.frame_pos[mine], kind="stable")]
        breaks = np.flatnonzero(np.diff(inp.ts_s[inp.frame_pos[mine]]) > opts.max_gap_s) + 1
        for run in np.split(mine, breaks):
            ts = inp.ts_s[inp.frame_pos[run]]
            chunk = np.floor((ts - ts[0]) / opts.max_moment_s).astype(int)
            for k in np.unique(chunk):
                part = run[chunk == k]
                span = float(np.ptp(inp.ts_s[inp.frame_pos[part]])) + dt
                if len(part) >= opts.min_moment_observations and span >= opts.min_moment_s - 1e-9:
                    value = float(np.median((hand_m[part] + opts.contact_offset_m) / plane_u[part]))
                    out.append(
                        (hand, part, value, float(np.median(hand_m[part])), float(np.median(plane_u[part])))
                    )
    return out


def _consensus(values: FloatArray, hand_m: FloatArray, plane_u: FloatArray, opts: HandScaleOptions
               ) -> tuple[float, NDArray[np.bool_]]:  # fmt: skip
    """The scale putting the most moments in contact, refined as the median of those; and which are."""

    def contact(scale: float) -> NDArray[np.bool_]:
        return np.abs(scale * plane_u - hand_m - opts.contact_offset_m) <= opts.contact_tol_m

    counts = [contact(v).sum() for v in values]
    best = values[np.asarray(counts) == max(counts)]
    scale = float(np.median(best))
    inside = contact(scale)
    for _ in range(20):
        if not inside.any():
            break
        scale = float(np.median(values[inside]))
        again = contact(scale)
        if (again == inside).all():
            break
        inside = again
    return scale, inside


def _refused(reason: str, moments: tuple[ContactMoment, ...], with_plane: int) -> HandScale:
    logger.info("hand scale refused: %s", reason)
    return HandScale(None, float("inf"), float("inf"), moments, with_plane, reason)


def scale_from_hand_contact(inp: HandScaleInputs, opts: HandScaleOptions) -> HandScale:
    """Metres per map unit from the wearer's hands resting on mapped surfaces (module docstring).

    Args:
        inp: the episode's frames, map points and wearer-hand observations.
        opts: thresholds.

    Returns:
        The estimate; `metres_per_unit` is None with a `reason` when the evidence is too thin.
    """
    hand_m, plane_u = _observation_planes(inp, opts)
    with_plane = np.isfinite(hand_m) & np.isfinite(plane_u)
    if with_plane.sum() < opts.min_moment_observations:
        return _refused(
            f"{int(with_plane.sum())} hand observations have a support plane of map points "
            f"(need {opts.min_moment_observations}); no surface near the hands is mapped",
            (), int(with_plane.sum()),
        )  # fmt: skip
    scale = float(np.median((hand_m[with_plane] + opts.contact_offset_m) / plane_u[with_plane]))
    found: list[tuple[object, NDArray[np.int64], float, float, float]] = []
    inside = np.zeros(0, bool)
    for _ in range(2):  # speeds at the median of all observations, then at the consensus of the moments
        slow = with_plane & (_palm_speed(inp, scale, opts) <= opts.max_hand_speed_mps)
        found = _moments(inp, slow, hand_m, plane_u, opts)
        if not found:
            inside = np.zeros(0, bool)
            break
        values, hm, pu = (np.array([m[i] for m in found]) for i in (2, 3, 4))
        scale, inside = _consensus(values, hm, pu, opts)
    moments = tuple(
        ContactMoment(m[0], inp.frame_pos[m[1]], m[2], m[3], m[4], bool(c))
        for m, c in zip(found, inside, strict=True)
    )
    n = int(inside.sum())
    if n < opts.min_moments:
        return _refused(
            f"{n} moments of a slow hand touching a mapped surface (need {opts.min_moments}; "
            f"{len(found)} slow moments over a support plane, {int(with_plane.sum())} observations with one)",
            moments, int(with_plane.sum()),
        )  # fmt: skip
    contact = [m for m in moments if m.in_contact]
    spread = float(np.std(np.log([m.metres_per_unit for m in contact]), ddof=1))
    rel_std_moments = _MEDIAN_EFFICIENCY * spread / np.sqrt(n) * float(student_t.ppf(0.975, n - 1)) / 1.96
    hand_distance = float(np.median([m.hand_distance_m for m in contact]))
    rel_std_fit = float(np.hypot(rel_std_moments, opts.contact_tol_m / (hand_distance * np.sqrt(12.0))))
    rel_std = float(np.hypot(rel_std_fit, opts.hand_size_rel_std))
    if rel_std_fit > opts.max_rel_std:
        reason = (
            f"the {n} contact moments disagree: the fit's relative standard error {rel_std_fit:.3f} "
            f"is above {opts.max_rel_std}"
        )
        logger.info("hand scale refused: %s", reason)
        return HandScale(None, rel_std, rel_std_fit, moments, int(with_plane.sum()), reason)
    logger.info(
        "hand scale %.5f m/unit, rel_std %.4f (fit %.4f), %d of %d moments in contact, %d observations "
        "with a plane", scale, rel_std, rel_std_fit, n, len(moments), int(with_plane.sum()),
    )  # fmt: skip
    return HandScale(scale, rel_std, float(rel_std_fit), moments, int(with_plane.sum()), None)
