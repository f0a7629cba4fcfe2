"""A hand's world-frame track smoothed by a motion model that knows how a monocular fit errs.

A monocular hand fit is precise across the image and poor along the camera ray: its depth comes
from the hand's apparent size, and on real and rendered footage it is off by 5-20 % from frame to
frame (centimetres at arm's length) while the image position is off by a few pixels (millimetres).
A fixed-window polynomial filter treats both alike: strong enough for the depth noise, it bends the
hand's real motion; mild enough for the motion, it leaves the depth jitter. Here each hand is a
constant-velocity point set (white-noise acceleration) observed through an anisotropic noise model,
and a Rauch-Tung-Striebel smoother combines the frames:

- The measurement noise of an observation is ``sigma_ray`` along its ray from the camera centre and
  ``sigma_across`` across it, both proportional to the hand's range. Both are estimated per track
  from the track itself, from third differences of the range's logarithm and of the ray's direction
  over consecutive frames (white noise of std s gives third differences of std ``sqrt(20) s``; the
  hand's own motion adds a jerk of millimetres per frame at 30 fps), so footage with better or
  worse fits is weighed as it is, with floors from the options.
- The acceleration spectral density is chosen per segment by the innovations' likelihood (of the
  palm's mean point) over a grid: quick reaches get a loose model, slow handling a tight one.
- An observation whose depth is improbable (a bad fit's jump along its ray) is down-weighted by its
  normalised innovation along the ray (a robust Kalman update), not allowed to pull the track;
  innovations across the ray are the hand moving and stay Gaussian, so the likelihood of a model
  too stiff for a quick reach stays low.
- A fit that explains its own keypoints worse than the track's fits do has a depth in doubt: the
  shape posed onto the keypoints does not match them, and its distance is what trades off the
  mismatch. Its noise along the ray grows with its reprojection residual relative to the hand's size
  in the image, over the track's median of that ratio (`residual_ray_power`). The gate above only
  catches a single improbable depth; a real desk clip's right hand, grasping a glass, had fits
  alternating for runs of 1-4 frames between 0.19 m at 8-10 px and 0.34-0.43 m at 17-22 px while its
  size in the image stayed within 10 %, which the motion model alone followed as motion.
- All 21 keypoints of a hand share one ray, one noise model and hence one gain: the hand's own
  articulation passes through unfiltered across the image and filtered along the ray with the rest
  of the hand.

Gaps longer than `TemporalOptions.max_gap_s` split a track: what comes after may be another
reach (or another hand) and is not tied to what came before. Gaps are not filled here
(`pose_core.hands.gaps` decides what may be filled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.geometry.motion_model import THIRD_DIFF_GAIN, constant_velocity_step, position_block

__all__ = ["TemporalOptions", "TrackNoise", "estimate_track_noise", "fit_ray_scales", "smooth_hand_track"]

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

#: Keypoints whose mean gives a hand's ray: the wrist and the finger bases (the palm; fingertips move
#: with the grasp, the palm with the hand).
_PALM = (0, 5, 9, 13, 17)


@dataclass(frozen=True)
class TemporalOptions:
    """Knobs of the hands' temporal model."""

    # Smooth each hand's track with the motion model (false keeps every frame's fit as it is).
    enabled: bool = True
    # Observed frames further apart than this start a new track segment, seconds.
    max_gap_s: float = 0.5
    # Range of the hand's acceleration spectral density searched per segment, m^2/s^3 (white-noise
    # acceleration: q lets a hand's speed wander by sqrt(q) m/s in a second; slow handling ~0.1, a
    # quick reach 10-100). The innovations' likelihood picks one per segment.
    accel_psd_min: float = 0.01
    accel_psd_max: float = 1000.0
    # Number of candidates in that range, spaced evenly in log (11: half a decade apart).
    accel_psd_candidates: int = 11
    # Each step takes the candidate most likely over this window around it, seconds.
    model_window_s: float = 0.5
    # Floors of the estimated measurement noise: relative along the ray, and pixels across it.
    min_sigma_ray_rel: float = 0.005
    min_sigma_across_px: float = 0.5
    # An observation whose normalised innovation along its ray (1 degree of freedom) exceeds this has
    # its noise along the ray inflated by the excess (chi-square 99 %: 6.63). Only the ray: a bad fit
    # errs in depth, while a large innovation across the ray is the hand moving, which the motion model
    # must follow.
    outlier_chi2: float = 6.63
    # Fewest observations in a segment for the noise estimate; shorter tracks take the episode's.
    min_noise_samples: int = 8
    # A fit whose reprojection residual over its palm size in the image is k > 1 times the track's
    # median has its noise along the ray multiplied by k ** this (0: every fit alike). 2: the depth a
    # misfit shape takes errs faster than the misfit grows (a real desk clip: twice the residual, twice
    # the depth; see the module's docstring).
    residual_ray_power: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.accel_psd_min <= self.accel_psd_max or self.accel_psd_candidates < 1:
            raise ValueError(
                "accel_psd_min must be > 0 and <= accel_psd_max, accel_psd_candidates >= 1; got "
                f"{self.accel_psd_min}, {self.accel_psd_max}, {self.accel_psd_candidates}"
            )
        if self.max_gap_s <= 0 or self.outlier_chi2 <= 0:
            raise ValueError(
                f"max_gap_s and outlier_chi2 must be > 0, got {self.max_gap_s}, {self.outlier_chi2}"
            )


@dataclass(frozen=True)
class TrackNoise:
    """Measurement noise of one hand's fits, relative to the hand's range.

    Attributes:
        sigma_ray_rel: std along the camera ray / range (e.g. 0.1 = 10 % of the depth).
        sigma_across_rad: std across the ray / range, radians.
        samples: third differences the estimate used (0: the floors).
    """

    sigma_ray_rel: float
    sigma_across_rad: float
    samples: int


def _palm_rays(keypoints: FloatArray, centres: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Unit rays `(F, 3)` and ranges `(F,)`, metres, from the camera centres to each frame's palm."""
    offset = keypoints[:, _PALM].mean(axis=1) - centres
    rng = np.linalg.norm(offset, axis=1)
    return offset / np.maximum(rng, 1e-9)[:, None], rng


def _robust_std(values: FloatArray) -> float:
    """Std of the bulk of `values` (median absolute deviation about 0, as for differences)."""
    return float(1.4826 * np.median(np.abs(values)))


def estimate_track_noise(
    keypoints: FloatArray, observed: BoolArray, centres: FloatArray, opts: TemporalOptions, focal_px: float
) -> TrackNoise:
    """Measurement noise of a track from runs of four consecutive observed frames.

    Args:
        keypoints: world frame, metres, `(F, 21, 3)` (NaN where not observed).
        observed: frames with a fit, `(F,)`.
        centres: camera centres, world frame, metres, `(F, 3)`.
        opts: floors and the fewest samples.
        focal_px: focal length of the fitted images, pixels (for the floor across the ray).

    Returns:
        The noise; the floors when fewer than `opts.min_noise_samples` third differences exist.
    """
    floor_across = opts.min_sigma_across_px / focal_px
    quad = observed[:-3] & observed[1:-2] & observed[2:-1] & observed[3:]
    if quad.sum() < opts.min_noise_samples:
        return TrackNoise(opts.min_sigma_ray_rel, floor_across, 0)
    rays, rng = _palm_rays(np.where(observed[:, None, None], keypoints, 0.0), centres)
    d3_range = np.diff(np.log(np.maximum(rng, 1e-9)), n=3)[quad]
    d3_rays = np.diff(rays, n=3, axis=0)[quad]
    # Across the ray: the third difference's two components perpendicular to the (middle) ray.
    mid = rays[1:-2][quad]
    across = d3_rays - np.sum(d3_rays * mid, axis=1, keepdims=True) * mid
    sigma_ray = _robust_std(d3_range) / THIRD_DIFF_GAIN
    # |across| of two Gaussian components has median 1.1774 sigma.
    sigma_across = float(np.median(np.linalg.norm(across, axis=1))) / 1.1774 / THIRD_DIFF_GAIN
    return TrackNoise(
        max(sigma_ray, opts.min_sigma_ray_rel), max(sigma_across, floor_across), int(quad.sum())
    )


def _segments(ts_s: FloatArray, observed: BoolArray, max_gap_s: float) -> list[NDArray[np.int64]]:
    """Observed frame positions split where consecutive observations are more than `max_gap_s` apart."""
    seen = np.flatnonzero(observed)
    if len(seen) == 0:
        return []
    cuts = np.flatnonzero(np.diff(ts_s[seen]) > max_gap_s) + 1
    return np.split(seen, cuts)


def _measurement_noise(ray: FloatArray, rng: float, noise: TrackNoise, ray_scale: float) -> FloatArray:
    """`(3, 3)` covariance, metres^2: `sigma_ray * ray_scale` along `ray`, `sigma_across` across it."""
    s_ray, s_across = noise.sigma_ray_rel * rng * ray_scale, noise.sigma_across_rad * rng
    return s_across**2 * np.eye(3) + (s_ray**2 - s_across**2) * np.outer(ray, ray)


def fit_ray_scales(residual_px: FloatArray, palm_px: FloatArray, power: float) -> FloatArray:
    """Each fit's factor on its noise along the ray, `(N,)` >= 1, from its residual (see `TemporalOptions`).

    Args:
        residual_px: RMS reprojection residual of each fit, pixels, `(N,)`; NaN counts as typical.
        palm_px: the hand's palm size in the image (mean wrist -> finger-base distance), pixels, `(N,)`.
        power: `TemporalOptions.residual_ray_power`.
    """
    misfit = residual_px / np.maximum(palm_px, 1e-9)
    known = np.isfinite(misfit)
    if power <= 0 or not known.any():
        return np.ones(len(residual_px))
    typical = float(np.median(misfit[known]))
    if typical <= 0:
        return np.ones(len(residual_px))
    ratio = np.where(known, misfit / typical, 1.0)
    return np.maximum(ratio, 1.0) ** power


def _across_loglik(innovation: FloatArray, cov: FloatArray, ray: FloatArray) -> float:
    """Gaussian log-likelihood of an innovation `(3,)` across `ray`, under covariance `(3, 3)`.

    Only across: depth errs in bursts a motion model cannot tell from motion, the image position does not.
    """
    basis = np.linalg.svd(ray[None, :])[2][1:]  # (2, 3): orthonormal, perpendicular to the ray
    v, c = basis @ innovation, basis @ cov @ basis.T
    return -0.5 * float(v @ np.linalg.solve(c, v) + np.log(np.linalg.det(c)))


def _rts(  # noqa: PLR0914 - one filter pass and its smoother, kept together for their shared state
    ts_s: FloatArray,
    z: FloatArray,
    rays: FloatArray,
    rng: FloatArray,
    noise: TrackNoise,
    q: FloatArray,
    gate: float,
    ray_scale: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Robust Kalman filter and RTS smoother over one segment.

    Args:
        ts_s: observation times, `(N,)`.
        z: observations, `(N, 3, K)` (K keypoints share the covariance).
        rays: palm rays, unit, `(N, 3)`.
        rng: palm ranges, metres, `(N,)`.
        noise: measurement noise model.
        q: acceleration spectral density of each step (from the previous observation), m^2/s^3, `(N,)`.
        gate: gate of the normalised innovation along the ray (chi-square, 1 dof).
        ray_scale: each observation's factor on the noise along its ray (`fit_ray_scales`), `(N,)`.

    Returns:
        (Smoothed positions `(N, 3, K)`, each observation's innovation log-likelihood across its ray
        `(N,)` (of the keypoints' mean; 0 for the first).)
    """
    n = len(ts_s)
    x = np.zeros((n, 6, z.shape[2]))
    p = np.zeros((n, 6, 6))
    x_pred, p_pred = np.zeros_like(x), np.zeros_like(p)
    trans = np.zeros((n, 6, 6))
    h = position_block()
    loglik = np.zeros(n)
    r0 = _measurement_noise(rays[0], rng[0], noise, ray_scale[0])
    x_pred[0, :3], p_pred[0] = z[0], np.block([[r0, np.zeros((3, 3))], [np.zeros((3, 3)), np.eye(3) * 4.0]])
    for i in range(n):
        if i > 0:
            trans[i], process = constant_velocity_step(float(ts_s[i] - ts_s[i - 1]), float(q[i]))
            x_pred[i] = trans[i] @ x[i - 1]
            p_pred[i] = trans[i] @ p[i - 1] @ trans[i].T + process
        r = _measurement_noise(rays[i], rng[i], noise, ray_scale[i])
        innovation = z[i] - x_pred[i, :3]
        s = p_pred[i, :3, :3] + r
        centre = innovation.mean(axis=1)
        along = float(centre @ rays[i])
        excess = along**2 / float(rays[i] @ s @ rays[i]) / gate
        if excess > 1.0:  # a depth the motion cannot explain: this fit's depth counts for less
            s_ray = noise.sigma_ray_rel * rng[i] * ray_scale[i]
            s = s + (excess - 1.0) * s_ray**2 * np.outer(rays[i], rays[i])
        if i > 0:
            loglik[i] = _across_loglik(centre, s, rays[i])
        gain = p_pred[i][:, :3] @ np.linalg.inv(s)
        x[i] = x_pred[i] + gain @ innovation
        p[i] = (np.eye(6) - gain @ h) @ p_pred[i]
    for i in range(n - 2, -1, -1):
        back = p[i] @ trans[i + 1].T @ np.linalg.inv(p_pred[i + 1])
        x[i] = x[i] + back @ (x[i + 1] - x_pred[i + 1])
        p[i] = p[i] + back @ (p[i + 1] - p_pred[i + 1]) @ back.T
    return x[:, :3], loglik


def _local_accel_psd(  # noqa: PLR0913, PLR0917 - the segment's arrays and the settings
    ts_s: FloatArray,
    palm: FloatArray,
    rays: FloatArray,
    rng: FloatArray,
    noise: TrackNoise,
    grid: FloatArray,
    opts: TemporalOptions,
    ray_scale: FloatArray,
) -> FloatArray:
    """Each step's acceleration spectral density `(N,)`: the grid's most likely within a window around it.

    A hand rests, then reaches in a fraction of a second: one density for the whole segment either
    flattens the reach or passes the rest's noise. Each candidate filters the palm's mean point
    `(N, 3, 1)`; every step takes the candidate whose innovations are most likely over the centred
    window `opts.model_window_s` (a stiff model's innovations grow during a reach, a loose one's
    stay noisy at rest), widened to the window's loosest choice so the smoother sees a reach coming.
    """
    terms = np.stack(
        [
            _rts(ts_s, palm, rays, rng, noise, np.full(len(ts_s), q), opts.outlier_chi2, ray_scale)[1]
            for q in grid
        ]
    )
    half = max(1, int(round(opts.model_window_s / 2 / max(float(np.median(np.diff(ts_s))), 1e-6))))
    kernel = np.ones(2 * half + 1)
    windowed = np.stack([np.convolve(t, kernel, mode="same") for t in terms])
    choice = windowed.argmax(axis=0)
    loosest = choice
    return grid[loosest]


def smooth_hand_track(
    keypoints: FloatArray,
    observed: BoolArray,
    ts_s: FloatArray,
    centres: FloatArray,
    focal_px: float,
    opts: TemporalOptions | None = None,
    ray_scale: FloatArray | None = None,
) -> FloatArray:
    """One hand's world-frame keypoints smoothed by the motion model (see the module's docstring).

    Args:
        keypoints: world frame, metres, `(F, 21, 3)`; rows of unobserved frames are ignored.
        observed: frames with an observation, `(F,)` bool.
        ts_s: frame times, seconds, `(F,)` increasing.
        centres: camera centres at those frames, world frame, metres, `(F, 3)`.
        focal_px: focal length of the images the hands were fitted in, pixels.
        opts: settings.
        ray_scale: each frame's factor on its fit's noise along the ray (`fit_ray_scales`), `(F,)`;
            None: 1 for every frame.

    Returns:
        Smoothed keypoints `(F, 21, 3)`; unobserved frames unchanged.
    """
    opts = opts or TemporalOptions()
    f = len(observed)
    if keypoints.shape != (f, 21, 3) or ts_s.shape != (f,) or centres.shape != (f, 3):
        raise ShapeError("keypoints / ts_s / centres", keypoints.shape, f"({f}, 21, 3), ({f},), ({f}, 3)")
    out = keypoints.copy()
    if not opts.enabled:
        return out
    noise = estimate_track_noise(keypoints, observed, centres, opts, focal_px)
    scales = np.ones(f) if ray_scale is None else np.asarray(ray_scale, np.float64)
    grid = np.geomspace(opts.accel_psd_min, opts.accel_psd_max, opts.accel_psd_candidates)
    for seg in _segments(ts_s, observed, opts.max_gap_s):
        if len(seg) < 3:
            continue
        rays, rng = _palm_rays(keypoints[seg], centres[seg])
        palm = keypoints[seg][:, _PALM].mean(axis=1)[:, :, None]
        q = _local_accel_psd(ts_s[seg], palm, rays, rng, noise, grid, opts, scales[seg])
        smoothed, _ = _rts(
            ts_s[seg], keypoints[seg].transpose(0, 2, 1), rays, rng, noise, q, opts.outlier_chi2, scales[seg]
        )
        out[seg] = smoothed.transpose(0, 2, 1)
    return out
