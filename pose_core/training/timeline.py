"""Action timeline of one hand: labelled segments from wrist speed, grip aperture and a contact cue.

Signals (per stretch of frames where the hand is present): the wrist position (origin of
`wrist_from_keypoints`) and the grip aperture (`grip_aperture_from_keypoints`, thumb tip to index
tip), both Savitzky-Golay smoothed over `smooth_s`, give the wrist speed and the aperture rate.
Two hysteresis states follow: *moving* (speed) and *closed* (aperture).

Labels:
- ``grasp``: the closing of the grip that leads into a closed stretch, from the frame the aperture
  starts closing faster than `aperture_rate_mps` to the frame it stops; ``manipulate``: the rest of
  the closed stretch; ``release``: its reopening, measured the same way.
- Contact cue (a proxy: there is no object model): a closed stretch counts as holding something only
  when the wrist was slow while the grip closed (median speed <= `contact_max_speed_mps`). A hand
  that closes while moving fast (a fist in passing) stays ``move``/``idle``.
- Frames outside holds: ``idle`` when still, otherwise ``reach`` (moving, directly followed by a
  grasp), ``retract`` (moving, directly after a release) or ``move``.
- ``missing``: frames without the hand (kept at any length).
Non-missing segments shorter than `min_segment_s` are absorbed by their previous (else next)
neighbour that is neither grasp, release nor missing (by an event only when between two events);
grasp and release themselves are never absorbed (they are bounded by the aperture rate, not by
thresholds that flicker).

Speeds are in world units per second: metres only when the world frame is metric
(`hands_world.scale_source` other than ``none``); the aperture is metric either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.signal import savgol_filter

from pose_core.errors import ShapeError
from pose_core.retarget.wrist import grip_aperture_from_keypoints, wrist_from_keypoints

__all__ = ["LABELS", "Segment", "Timeline", "TimelineOptions", "segment_hand"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

LABELS = ("idle", "reach", "grasp", "manipulate", "release", "retract", "move", "missing")
_IDLE, _REACH, _GRASP, _MANIP, _RELEASE, _RETRACT, _MOVE, _MISSING = range(len(LABELS))
_EVENTS = (_GRASP, _RELEASE)  # never absorbed
_MIN_WINDOW = 3  # Savitzky-Golay window (quadratic fit) needs at least 3 samples


@dataclass(frozen=True)
class TimelineOptions:
    """Thresholds of the action timeline (see the module docstring for how they are used)."""

    # Savitzky-Golay window (quadratic) for wrist position and grip aperture, seconds.
    smooth_s: float = 0.3
    # A still hand starts moving when its wrist speed rises above this, m/s.
    move_start_mps: float = 0.08
    # A moving hand is still again when its wrist speed falls below this, m/s.
    move_stop_mps: float = 0.04
    # An open grip closes when the thumb-index aperture falls below this, metres.
    close_aperture_m: float = 0.05
    # A closed grip opens when the aperture rises above this, metres.
    open_aperture_m: float = 0.065
    # The aperture changing faster than this counts as closing (grasp) or opening (release), m/s.
    aperture_rate_mps: float = 0.05
    # Contact proxy: a grip closing counts as a grasp only when the median wrist speed meanwhile is
    # at most this, m/s.
    contact_max_speed_mps: float = 0.25
    # Segments shorter than this (except grasp, release and missing) join a neighbour, seconds.
    min_segment_s: float = 0.25

    def __post_init__(self) -> None:
        if not (self.move_stop_mps <= self.move_start_mps and self.close_aperture_m <= self.open_aperture_m):
            raise ValueError(
                "actions.timeline: need move_stop_mps <= move_start_mps and "
                "close_aperture_m <= open_aperture_m"
            )


@dataclass(frozen=True)
class Segment:
    """Frames `start` (first) to `stop` (one past the last), indices into the input arrays."""

    label: str
    start: int
    stop: int


@dataclass(frozen=True)
class Timeline:
    """One hand's segments in time order (covering every frame) and the signals behind them.

    Attributes:
        segments: consecutive, non-overlapping, from frame 0 to F.
        wrist_speed: smoothed wrist speed, world units per second, `(F,)`; NaN where missing.
        grip_aperture_m: smoothed thumb-index aperture, metres, `(F,)`; NaN where missing.
    """

    segments: tuple[Segment, ...]
    wrist_speed: FloatArray
    grip_aperture_m: FloatArray


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """`(value, start, stop)` of each run of equal values of a 1-D integer/bool array."""
    if len(values) == 0:
        return []
    edges = np.flatnonzero(np.diff(values.astype(np.int64))) + 1
    starts = np.concatenate([[0], edges])
    stops = np.concatenate([edges, [len(values)]])
    return [(int(values[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]


def _hysteresis(x: FloatArray, enter: float, leave: float) -> NDArray[np.bool_]:
    """On when `x` rises above `enter`, off again when it falls below `leave` (`leave <= enter`)."""
    state, out = False, np.zeros(len(x), bool)
    for i, v in enumerate(x):
        state = v > leave if state else v > enter
        out[i] = state
    return out


def _signals(kp: FloatArray, ts: FloatArray, is_right: bool, opts: TimelineOptions) -> tuple[FloatArray, ...]:
    """Wrist speed, aperture and aperture rate `(n,)` of one present stretch `kp (n, 21, 3)`."""
    n = len(ts)
    wrist = wrist_from_keypoints(kp, is_right)[:, :3, 3]
    aperture = grip_aperture_from_keypoints(kp)
    dt = float(np.median(np.diff(ts))) if n > 1 else 1.0
    window = min(n if n % 2 else n - 1, max(_MIN_WINDOW, 2 * round(opts.smooth_s / dt / 2) + 1))
    if window < _MIN_WINDOW:
        return np.zeros(n), aperture, np.zeros(n)
    velocity = savgol_filter(wrist, window, 2, deriv=1, delta=dt, axis=0)
    smooth_aperture = savgol_filter(aperture, window, 2)
    rate = savgol_filter(aperture, window, 2, deriv=1, delta=dt)
    return np.linalg.norm(velocity, axis=1), smooth_aperture, rate


def _walk(rate: FloatArray, start: int, step: int, sign: float, limit: float, bound: int) -> int:
    """From `start`, step while `sign * rate` exceeds `limit` and before `bound`; the last index reached."""
    i = start
    while (i > bound if step < 0 else i < bound) and sign * rate[i + (step if step < 0 else 0)] > limit:
        i += step
    return i


def _label_stretch(
    speed: FloatArray, aperture: FloatArray, rate: FloatArray, opts: TimelineOptions
) -> np.ndarray:
    """Label codes `(n,)` of one present stretch (before short segments are absorbed)."""
    n = len(speed)
    codes = np.where(_hysteresis(speed, opts.move_start_mps, opts.move_stop_mps), _MOVE, _IDLE)
    closed = _hysteresis(-aperture, -opts.close_aperture_m, -opts.open_aperture_m)
    free_from = 0  # holds never reach back into the previous one
    for value, c0, c1 in _runs(closed):
        if not value:
            continue
        g0 = _walk(rate, c0, -1, -1.0, opts.aperture_rate_mps, free_from)
        g1 = max(_walk(rate, c0, 1, -1.0, opts.aperture_rate_mps, c1), c0 + 1)
        if np.median(speed[g0:g1]) > opts.contact_max_speed_mps:
            continue  # closed in passing, not around an object
        r0, r1 = n, n
        if c1 < n:
            r0 = _walk(rate, c1, -1, 1.0, opts.aperture_rate_mps, g1)
            r1 = max(_walk(rate, c1, 1, 1.0, opts.aperture_rate_mps, n), c1 + 1)
            codes[r0:r1] = _RELEASE
        codes[g0:g1] = _GRASP
        codes[g1:r0] = _MANIP
        free_from = r1
    return codes


def _absorber(runs: list[tuple[int, int, int]], i: int) -> int | None:
    """The label that absorbs run `i`: the previous run's, else the next's.

    An event (grasp, release) absorbs only when both neighbours are events; missing never does.
    """
    for excluded in ((*_EVENTS, _MISSING), (_MISSING,)):
        for j in (i - 1, i + 1):
            if 0 <= j < len(runs) and runs[j][0] not in excluded:
                return runs[j][0]
    return None


def _absorb_short(codes: np.ndarray, min_frames: int) -> np.ndarray:
    """Short runs (not events or missing) take a neighbour's label, shortest first (see `_absorber`)."""
    codes = codes.copy()
    while True:
        runs = _runs(codes)
        short = sorted(
            (b - a, i) for i, (v, a, b) in enumerate(runs)
            if b - a < min_frames and v not in (*_EVENTS, _MISSING) and _absorber(runs, i) is not None
        )  # fmt: skip
        if not short:
            return codes
        i = short[0][1]
        codes[runs[i][1] : runs[i][2]] = _absorber(runs, i)


def _name_motion(codes: np.ndarray) -> list[Segment]:
    """Segments of the final codes, with moving runs named reach / retract / move by their neighbours."""
    runs = _runs(codes)
    out = []
    for i, (value, a, b) in enumerate(runs):
        label = value
        if value == _MOVE:
            if i + 1 < len(runs) and runs[i + 1][0] == _GRASP:
                label = _REACH
            elif i > 0 and runs[i - 1][0] == _RELEASE:
                label = _RETRACT
        out.append(Segment(LABELS[label], a, b))
    return out


def segment_hand(
    keypoints: FloatArray, ts_s: FloatArray, present: NDArray[np.bool_], is_right: bool, opts: TimelineOptions
) -> Timeline:
    """Segment one hand's trajectory into labelled actions (see the module docstring).

    Args:
        keypoints: MediaPipe keypoints in the world frame, metres, `(F, 21, 3)`; ignored where absent.
        ts_s: frame times, seconds, increasing, `(F,)`; roughly uniform (the smoothing uses the median step).
        present: the hand is there (observed or gap-filled), `(F,)`; non-finite keypoints count as absent.
        is_right: True for a right hand (only the wrist frame's axes depend on it).
        opts: thresholds.

    Returns:
        The timeline: segments covering frames 0..F in order, and the smoothed signals.

    Raises:
        ShapeError: the arrays' shapes disagree.

    Example:
        >>> kp = np.zeros((10, 21, 3)); kp[:, 5] = [0.09, 0.02, 0]; kp[:, 17] = [0.08, -0.04, 0]
        >>> kp[:, 8] = [0.1, 0.0, 0.08]
        >>> tl = segment_hand(kp, np.arange(10) / 30, np.ones(10, bool), True, TimelineOptions())
        >>> [(s.label, s.start, s.stop) for s in tl.segments]
        [('idle', 0, 10)]
    """
    kp = np.asarray(keypoints, np.float64)
    ts = np.asarray(ts_s, np.float64)
    n = len(ts)
    if kp.shape != (n, 21, 3) or np.shape(present) != (n,):
        raise ShapeError(f"keypoints / present for {n} frame times", kp.shape, f"({n}, 21, 3) and ({n},)")
    present = np.asarray(present, bool) & np.isfinite(kp).all(axis=(1, 2))
    codes = np.full(n, _MISSING)
    speed, aperture = np.full(n, np.nan), np.full(n, np.nan)
    for value, a, b in _runs(present):
        if value:
            speed[a:b], aperture[a:b], rate = _signals(kp[a:b], ts[a:b], is_right, opts)
            codes[a:b] = _label_stretch(speed[a:b], aperture[a:b], rate, opts)
    dt = float(np.median(np.diff(ts))) if n > 1 else 1.0
    codes = _absorb_short(codes, round(opts.min_segment_s / dt))
    return Timeline(tuple(_name_motion(codes)), speed, aperture)
