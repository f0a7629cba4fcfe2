"""Gap filling that invents nothing: short misses of one hand identity, filled only when safe.

A gap (frames with no observation of an identity between two observations of it) is filled only when
both ends are trusted observations, the gap lasts at most `max_gap_s`, and the filled keypoints pass
every check: depth range, inside or just outside the field of view, wrist displacement and speed, and
deviation from a smoothed path through the trusted frames around the gap. Otherwise the gap stays
empty and the reason is recorded. The fill is a cubic Hermite curve per keypoint coordinate in the
world frame, with end velocities from the neighbouring trusted frames.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.interpolate import CubicHermiteSpline

from pose_core.errors import ShapeError

__all__ = ["Gap", "GapFillResult", "GapOptions", "fill_gaps"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GapOptions:
    """Rules of gap filling."""

    # Longest gap filled, seconds (missing frames x frame interval; 0.2 s = 6 frames at 30 fps).
    max_gap_s: float = 0.2
    # Filled wrists must lie this far in front of the camera, metres.
    min_depth_m: float = 0.1
    max_depth_m: float = 1.5
    # Filled wrists may project outside the image by at most this fraction of its width / height.
    fov_margin: float = 0.1
    # Largest wrist displacement between the two ends of a gap, metres.
    max_wrist_step_m: float = 0.35
    # Largest wrist speed along the filled path (including the steps to both ends), metres per second.
    max_wrist_speed_mps: float = 3.0
    # Largest distance of a filled wrist from the smoothed path through the context frames, metres.
    max_path_deviation_m: float = 0.03
    # Trusted frames used on each side for end velocities and the smoothed path.
    context_frames: int = 3


@dataclass(frozen=True)
class Gap:
    """One gap: frames `start..stop-1` missing; `filled` or the `reason` it was left."""

    start: int
    stop: int
    filled: bool
    reason: str


@dataclass(frozen=True)
class GapFillResult:
    """Keypoints with safe gaps filled.

    Attributes:
        keypoints_world: `(F, 21, 3)` metres; observed frames unchanged, filled frames set, others NaN.
        filled: frames that were filled, `(F,)` bool.
        gaps: every gap and what happened to it.
    """

    keypoints_world: np.ndarray
    filled: np.ndarray
    gaps: list[Gap]


def _context(trusted: np.ndarray, observed: np.ndarray, end: int, step: int, count: int) -> list[int]:
    """Up to `count` consecutive trusted frames from `end` outwards (step -1 or +1)."""
    frames: list[int] = []
    i = end
    while 0 <= i < len(trusted) and observed[i] and trusted[i] and len(frames) < count:
        frames.append(i)
        i += step
    return frames


def _check(  # noqa: PLR0913, PLR0917 -- private step of fill_gaps
    wrists: np.ndarray, ts: np.ndarray, smooth: np.ndarray, cam_from_world: np.ndarray, camera_k: np.ndarray,
    image_size: tuple[int, int], opts: GapOptions,
) -> str:  # fmt: skip
    """Reason a fill is unsafe, or "" when it passes. `wrists` includes both ends, `(G + 2, 3)`."""
    if np.linalg.norm(wrists[-1] - wrists[0]) > opts.max_wrist_step_m:
        return "wrist_step"
    speed = np.linalg.norm(np.diff(wrists, axis=0), axis=-1) / np.diff(ts)
    if speed.max() > opts.max_wrist_speed_mps:
        return "wrist_speed"
    if np.linalg.norm(wrists[1:-1] - smooth, axis=-1).max() > opts.max_path_deviation_m:
        return "path_deviation"
    in_cam = np.einsum("gij,gj->gi", cam_from_world[:, :3, :3], wrists[1:-1]) + cam_from_world[:, :3, 3]
    depth = in_cam[:, 2]
    if (depth < opts.min_depth_m).any() or (depth > opts.max_depth_m).any():
        return "depth_range"
    px = in_cam[:, :2] / depth[:, None] * np.diag(camera_k)[:2] + camera_k[:2, 2]
    size = np.asarray(image_size, np.float64)
    if ((px < -opts.fov_margin * size) | (px > (1.0 + opts.fov_margin) * size)).any():
        return "field_of_view"
    return ""


def fill_gaps(  # noqa: PLR0913, PLR0917 -- the gap rules need the camera, its poses and the frame times
    ts_s: np.ndarray,
    keypoints_world: np.ndarray,
    trusted: np.ndarray,
    world_from_cam: np.ndarray,
    camera_k: np.ndarray,
    image_size: tuple[int, int],
    opts: GapOptions | None = None,
) -> GapFillResult:
    """Fill the safe gaps of one hand identity.

    Args:
        ts_s: frame times, seconds, `(F,)` increasing.
        keypoints_world: world-frame keypoints, metres, `(F, 21, 3)`; NaN rows are misses.
        trusted: observations good enough to anchor a fill (score and fit residual checked by the
            caller), `(F,)` bool.
        world_from_cam: camera poses, metric, `(F, 4, 4)`.
        camera_k: pinhole intrinsics, pixels, `(3, 3)`.
        image_size: (width, height), pixels.
        opts: the rules.

    Returns:
        Keypoints with the safe gaps filled, the filled flags and every gap's outcome.
    """
    opts = opts or GapOptions()
    n = len(ts_s)
    if keypoints_world.shape != (n, 21, 3) or trusted.shape != (n,) or world_from_cam.shape != (n, 4, 4):
        raise ShapeError(
            "keypoints_world / trusted / world_from_cam", keypoints_world.shape, f"({n}, 21, 3) etc."
        )
    observed = np.isfinite(keypoints_world).all(axis=(1, 2))
    out = np.where(observed[:, None, None], keypoints_world, np.nan)
    filled = np.zeros(n, bool)
    gaps: list[Gap] = []
    obs_idx = np.flatnonzero(observed)
    dt = float(np.median(np.diff(ts_s))) if n > 1 else 0.0
    cam_from_world = np.linalg.inv(world_from_cam)
    for left, right in zip(obs_idx[:-1], obs_idx[1:], strict=True):
        if right - left < 2:
            continue
        start, stop = int(left) + 1, int(right)
        reason = _gap_reason(ts_s, trusted, left, right, dt, opts)
        if not reason:
            before = _context(trusted, observed, int(left), -1, opts.context_frames)[::-1]
            after = _context(trusted, observed, int(right), +1, opts.context_frames)
            fill = _hermite(ts_s, keypoints_world, before, after, np.arange(start, stop))
            smooth = _smooth_path(ts_s, keypoints_world[:, 0], before + after, np.arange(start, stop))
            wrists = np.concatenate([keypoints_world[left, :1], fill[:, 0], keypoints_world[right, :1]])
            reason = _check(
                wrists, ts_s[left : right + 1], smooth, cam_from_world[start:stop], camera_k, image_size, opts
            )
            if not reason:
                out[start:stop] = fill
                filled[start:stop] = True
        gaps.append(Gap(start, stop, not reason, reason))
    logger.debug("gaps: %d, filled %d", len(gaps), sum(g.filled for g in gaps))
    return GapFillResult(out, filled, gaps)


def _gap_reason(  # noqa: PLR0913, PLR0917 -- private step of fill_gaps
    ts_s: np.ndarray, trusted: np.ndarray, left: int, right: int, dt: float, opts: GapOptions
) -> str:
    """Reason a gap is not eligible at all ("" when it is)."""
    if not (trusted[left] and trusted[right]):
        return "untrusted_end"
    if ts_s[right] - ts_s[left] - dt > opts.max_gap_s + 1e-6:
        return "too_long"
    return ""


def _hermite(
    ts: np.ndarray, kp: np.ndarray, before: list[int], after: list[int], frames: np.ndarray
) -> np.ndarray:
    """Cubic Hermite fill between the last frame of `before` and the first of `after`, `(G, 21, 3)`."""
    a, b = before[-1], after[0]
    secant = (kp[b] - kp[a]) / (ts[b] - ts[a])
    vel_a = (kp[a] - kp[before[-2]]) / (ts[a] - ts[before[-2]]) if len(before) > 1 else secant
    vel_b = (kp[after[1]] - kp[b]) / (ts[after[1]] - ts[b]) if len(after) > 1 else secant
    spline = CubicHermiteSpline([ts[a], ts[b]], np.stack([kp[a], kp[b]]), np.stack([vel_a, vel_b]))
    return spline(ts[frames])


def _smooth_path(ts: np.ndarray, wrist: np.ndarray, context: list[int], frames: np.ndarray) -> np.ndarray:
    """Least-squares polynomial (degree <= 2) through the context wrists, at the gap's frames, `(G, 3)`."""
    t0 = ts[context[0]]
    degree = min(2, len(context) - 1)
    coeffs = np.polynomial.polynomial.polyfit(ts[context] - t0, wrist[context], degree)
    return np.polynomial.polynomial.polyval(ts[frames] - t0, coeffs).T
