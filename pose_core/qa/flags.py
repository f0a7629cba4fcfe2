"""Quality flags of one episode: per-frame signals in, pass/fail with reasons out.

A customer must be able to trust an episode without watching it, so the pipeline flags the faults
that make an episode useless as training data: the camera lost, its monocular scale jumping, its
metric scale too uncertain, a jittery camera or hand path, hands swapping identity, too few frames
with the wearer's hands, or a clip too short to learn from. Every check has its threshold in
`QAThresholds` (conf `qa.thresholds`).

Convention:
    Arrays are per frame in frame order, `F` frames. Camera centres are in map units (monocular:
    arbitrary scale), so camera checks are scale free (ratios). Hand checks look at wrists in the
    camera frame, which is metric whether or not the episode has a metric map scale (the hand fit's
    depth comes from the hand-size prior; only the camera path is in map units): a world-frame wrist
    of an episode without a scale mixes metres (hand about the camera) with map units (camera path)
    and has no unit a threshold could use. NaN marks a missing value (no pose, hand not seen).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from pose_core.errors import ShapeError
from pose_core.identities import WEARER_HANDS

__all__ = ["FLAG_CODES", "EpisodeSignals", "QAResult", "QAThresholds", "evaluate_episode", "path_jitter"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

#: Every flag code, in the order reasons are reported.
FLAG_CODES: tuple[str, ...] = (
    "too_short",
    "tracking_lost",
    "scale_jump",
    "scale_uncertain",
    "pose_jitter",
    "hand_jitter",
    "identity_switches",
    "low_hand_coverage",
)


@dataclass(frozen=True)
class QAThresholds:
    """Limits of the quality checks; an episode passes when no check exceeds its limit."""

    # too_short: episodes shorter than this many seconds fail.
    min_duration_s: float = 2.0
    # tracking_lost: fails when more than this fraction of frames has no tracked camera pose
    # (tracking state lost, or no pose at all) ...
    max_lost_fraction: float = 0.1
    # ... or when one run of such frames lasts at least this many seconds.
    max_lost_run_s: float = 0.5
    # scale_jump: the camera's median speed over `scale_window_s` after a tracking segment starts
    # against the window before it; a ratio above this (either way) is a jump of the monocular scale.
    # Real speed changes confound it: on the synthetic walk (0.3 mm noise) a restart without a jump
    # exceeds 2.0 in ~8 % of positions, and a 3x jump stays below it in ~10 % (0.2 s windows).
    max_scale_ratio: float = 2.0
    # Window each side of a segment start for the scale check, seconds.
    scale_window_s: float = 0.2
    # Speeds below this fraction of the episode's median speed are "at rest": no scale is observable.
    rest_speed_fraction: float = 0.25
    # scale_uncertain: the metric scale's relative standard error (`hands_world.metres_per_unit_std`
    # over `metres_per_unit`) above this fails. At 10 %, once the camera is 50 cm from where its path
    # started, world-frame hands are off by ~5 cm per standard error; the hands' scale carries the
    # hand-size prior's 7 %, the IMU and stereo scales are refused above 2.5 % and 10 % spread.
    # Episodes without a scale, or whose scale has no standard error (a user's value), are not checked.
    max_scale_rel_std: float = 0.1
    # pose_jitter: RMS of the camera path's second difference over the RMS of its first difference
    # (scale free; smooth head motion at 30 Hz gives ~0.1, white noise ~1.7).
    max_pose_jitter: float = 1.2
    # hand_jitter: median acceleration of a wearer's wrist between consecutive frames in the camera
    # frame, m/s^2 (metric with or without a map scale; the camera path's jitter is pose_jitter's).
    max_hand_jitter_mps2: float = 25.0
    # identity_switches: more than this many switches of a hand identity fail. A switch is a hand
    # taking over another identity's path (a left/right swap, a hand relabelled while in view), not
    # a hand that leaves the view and comes back under its own identity.
    max_identity_switches: int = 0
    # A hand continues the path of the identity whose last wrist position (camera frame) is nearest,
    # within this distance, metres (one-to-one per frame) ...
    switch_gate_m: float = 0.1
    # ... seen at most this many seconds earlier: older positions are forgotten, so a hand that
    # returns after a longer absence continues no path and switches nothing.
    switch_window_s: float = 0.5
    # low_hand_coverage: fails when fewer than this fraction of frames show a wearer hand
    # (observed or safely gap-filled).
    min_hand_coverage: float = 0.3

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_lost_fraction <= 1.0 or not 0.0 <= self.min_hand_coverage <= 1.0:
            raise ValueError("qa.thresholds: max_lost_fraction and min_hand_coverage must be in [0, 1]")
        if self.max_scale_ratio <= 1.0:
            raise ValueError(f"qa.thresholds.max_scale_ratio must be > 1, got {self.max_scale_ratio}")
        if self.max_scale_rel_std <= 0:
            raise ValueError(f"qa.thresholds.max_scale_rel_std must be > 0, got {self.max_scale_rel_std}")
        if self.scale_window_s <= 0 or self.min_duration_s < 0 or self.max_lost_run_s <= 0:
            raise ValueError("qa.thresholds: scale_window_s, max_lost_run_s must be > 0, min_duration_s >= 0")
        if self.switch_gate_m <= 0 or self.switch_window_s <= 0:
            raise ValueError("qa.thresholds: switch_gate_m and switch_window_s must be > 0")


@dataclass(frozen=True)
class EpisodeSignals:
    """What the checks look at, per frame (`F` frames in frame order).

    Attributes:
        ts_s: presentation times, seconds, `(F,)`.
        camera_centre: camera centre in world, map units, `(F, 3)`; NaN rows where no pose.
        tracked: the pose comes from tracking (not lost, not missing), `(F,)`.
        segment_id: tracking segment (a new one starts after each loss), `(F,)`.
        wrists_cam_m: wrist positions in the camera frame, metres, of every hand identity (the
            wearer's and other people's), each `(F, 3)`; NaN where absent.
        wearer: the identities that are the wearer's hands (jitter and coverage look at these).
        scale_rel_std: relative standard error of the episode's metric scale; NaN when it has no
            scale or its scale has no standard error.
    """

    ts_s: FloatArray
    camera_centre: FloatArray
    tracked: BoolArray
    segment_id: NDArray[np.int64]
    wrists_cam_m: dict[str, FloatArray] = field(default_factory=dict)
    wearer: tuple[str, ...] = WEARER_HANDS
    scale_rel_std: float = float("nan")

    def __post_init__(self) -> None:
        n = len(self.ts_s)
        if self.camera_centre.shape != (n, 3) or self.tracked.shape != (n,) or self.segment_id.shape != (n,):
            raise ShapeError(
                "EpisodeSignals: camera_centre, tracked, segment_id",
                (self.camera_centre.shape, self.tracked.shape, self.segment_id.shape),
                f"({n}, 3), ({n},), ({n},)",
            )
        for name, w in self.wrists_cam_m.items():
            if w.shape != (n, 3):
                raise ShapeError(f"EpisodeSignals: wrists_cam_m[{name!r}]", w.shape, f"({n}, 3)")


@dataclass(frozen=True)
class QAResult:
    """The verdict on one episode.

    Attributes:
        passed: no check failed.
        flags: codes of the failed checks, in `FLAG_CODES` order.
        reasons: one sentence per flag, with the measured value and its limit.
        metrics: the measured values (duration_s, lost_fraction, max_scale_ratio, scale_rel_std,
            pose_jitter, hand_jitter_mps2, identity_switches, hand_coverage); NaN where not measurable.
        frame_flags: per check, the frames that triggered it, each `(F,)` bool (for the timeline).
    """

    passed: bool
    flags: tuple[str, ...]
    reasons: tuple[str, ...]
    metrics: dict[str, float]
    frame_flags: dict[str, BoolArray]


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """[start, stop) of each run of True in `mask`."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def _frame_period(ts_s: FloatArray) -> float:
    steps = np.diff(ts_s)
    return float(np.median(steps)) if len(steps) and np.median(steps) > 0 else 1.0 / 30.0


def _steps(centre: FloatArray, tracked: BoolArray) -> FloatArray:
    """Camera step length into each frame, `(F,)`; NaN where it or the previous frame is untracked."""
    step = np.full(len(centre), np.nan)
    ok = tracked[1:] & tracked[:-1]
    step[1:][ok] = np.linalg.norm(np.diff(centre, axis=0)[ok], axis=1)
    return step


def _scale_ratio(
    step: FloatArray, segment_id: NDArray[np.int64], window: int, rest_fraction: float
) -> FloatArray:
    """Per segment start, the camera's median speed after over before it (>= 1 either way), else NaN.

    A monocular map has one scale per segment; a new segment (after a loss) starts a new map whose
    scale completion has to match. Inside a segment, speed changes are real motion: head motion
    changes speed 4-6x within half a second (measured on the synthetic walk), so only segment
    starts are checked. Steps that straddle the boundary are not used; speeds below
    `rest_fraction` of the median moving speed are at rest, where no scale is observable (a floor
    from every step, held centres included, could be 0 and gave ratios of 1e14 on a real clip).
    """
    ratio = np.full(len(step), np.nan)
    moving = step[np.isfinite(step) & (step > 0)]  # held centres (static, rotation-only) do not move
    if not len(moving):
        return ratio
    floor = rest_fraction * float(np.median(moving))
    same = np.concatenate([[False], segment_id[1:] == segment_id[:-1]])
    inside = np.where(same, step, np.nan)
    for b in np.flatnonzero(~same[1:]) + 1:
        before = inside[max(0, b - window) : b]
        after = inside[b + 1 : b + 1 + window]
        if not np.isfinite(before).any() or not np.isfinite(after).any():
            continue
        lo, hi = sorted((float(np.nanmedian(before)), float(np.nanmedian(after))))
        if lo > floor:
            ratio[b] = hi / lo
    return ratio


def path_jitter(path: FloatArray) -> tuple[float, BoolArray]:
    """RMS second over RMS first difference of a path `(F, 3)` (QA's pose_jitter), and big kicks."""
    d1 = np.diff(path, axis=0)
    d2 = path[2:] - 2.0 * path[1:-1] + path[:-2]
    n1 = np.linalg.norm(d1, axis=1)
    n2 = np.linalg.norm(d2, axis=1)
    n1, n2_ok = n1[np.isfinite(n1)], np.isfinite(n2)
    kicks = np.zeros(len(path), bool)
    if len(n1) < 2 or not n2_ok.any():
        return float("nan"), kicks
    rms1 = float(np.sqrt(np.mean(n1**2)))
    if rms1 == 0.0:
        return float("nan"), kicks
    kicks[1:-1] = n2_ok & (np.nan_to_num(n2) > 2.0 * rms1)
    return float(np.sqrt(np.mean(n2[n2_ok] ** 2)) / rms1), kicks


def _hand_jitter(wrists: list[FloatArray], dt: float, n: int) -> tuple[float, BoolArray]:
    """Worst wearer's median wrist acceleration (m/s^2) and the frames above twice that median."""
    worst, frames = float("nan"), np.zeros(n, bool)
    for w in wrists:
        accel = np.full(n, np.nan)
        accel[1:-1] = np.linalg.norm(w[2:] - 2.0 * w[1:-1] + w[:-2], axis=1) / dt**2
        if np.isfinite(accel).sum() < 3:
            continue
        median = float(np.nanmedian(accel))
        if not median <= worst:  # the first measurable hand, or a worse one (NaN-safe)
            worst, frames = median, np.nan_to_num(accel) > 2.0 * median
    return worst, frames


def _identity_switches(
    wrists: dict[str, FloatArray], wearer: tuple[str, ...], gate_m: float, window: int, n: int
) -> NDArray[np.int64]:
    """Per frame, how many identities took over another identity's path with a wearer hand involved, `(F,)`.

    Each frame's hands are matched one to one (Hungarian, wrist distance, gated by `gate_m`) to the
    last positions of the identities seen within `window` frames; a hand matched to another
    identity's last position continues that hand under a new label. A hand's own track restarting
    (it left the view and returned) matches nothing or itself and is not a switch.
    """
    names = sorted(wrists)
    present: dict[str, BoolArray] = {k: np.all(np.isfinite(w), axis=1) for k, w in wrists.items()}
    counts = np.zeros(n, np.int64)
    last_frame: dict[str, int] = {}
    for f in range(n):
        now = [k for k in names if present[k][f]]
        recent = [k for k in names if k in last_frame and f - last_frame[k] <= window]
        if now and recent:
            here = np.array([wrists[k][f] for k in now])
            before = np.array([wrists[k][last_frame[k]] for k in recent])
            dist = np.linalg.norm(here[:, None] - before[None], axis=-1)
            rows, cols = linear_sum_assignment(np.where(dist <= gate_m, dist, gate_m + 1e6))
            pairs = [(now[r], recent[c]) for r, c in zip(rows, cols, strict=True) if dist[r, c] <= gate_m]
            counts[f] = sum(a != b and (a in wearer or b in wearer) for a, b in pairs)
        last_frame.update(dict.fromkeys(now, f))
    return counts


def evaluate_episode(signals: EpisodeSignals, thresholds: QAThresholds) -> QAResult:  # noqa: PLR0914
    """Run every check on one episode.

    Args:
        signals: the episode's per-frame signals.
        thresholds: the limits.

    Returns:
        The verdict with reasons, measured values and per-frame trigger masks.
    """
    th = thresholds
    ts = np.asarray(signals.ts_s, np.float64)
    n = len(ts)
    dt = _frame_period(ts)
    duration = float(ts[-1] - ts[0] + dt) if n else 0.0
    centre = np.asarray(signals.camera_centre, np.float64)
    tracked = np.asarray(signals.tracked, bool) & np.isfinite(centre).all(axis=1)

    lost = ~tracked
    lost_runs = _runs(lost)
    longest_lost_s = max((stop - start for start, stop in lost_runs), default=0) * dt
    lost_fraction = float(lost.mean()) if n else 1.0

    window = max(2, round(th.scale_window_s / dt))
    segment = np.asarray(signals.segment_id, np.int64)
    ratio = _scale_ratio(_steps(centre, tracked), segment, window, th.rest_speed_fraction)
    worst_ratio = float(np.nanmax(ratio)) if np.isfinite(ratio).any() else float("nan")
    pose_jitter, pose_kicks = path_jitter(np.where(tracked[:, None], centre, np.nan))
    wearer = [w for k, w in signals.wrists_cam_m.items() if k in signals.wearer]
    hand_jitter, hand_kicks = _hand_jitter(wearer, dt, n)
    window_frames = max(1, round(th.switch_window_s / dt))
    switch = _identity_switches(signals.wrists_cam_m, signals.wearer, th.switch_gate_m, window_frames, n)
    present = np.zeros(n, bool)
    for w in wearer:
        present |= np.isfinite(w).all(axis=1)
    coverage = float(present.mean()) if n else 0.0

    metrics = {
        "duration_s": duration,
        "lost_fraction": lost_fraction,
        "longest_lost_s": float(longest_lost_s),
        "max_scale_ratio": worst_ratio,
        "scale_rel_std": float(signals.scale_rel_std),
        "pose_jitter": pose_jitter,
        "hand_jitter_mps2": hand_jitter,
        "identity_switches": float(switch.sum()),
        "hand_coverage": float(coverage),
    }
    checks = {
        "too_short": (
            duration < th.min_duration_s,
            f"{duration:.2f} s long, shorter than {th.min_duration_s:g} s",
            np.zeros(n, bool),
        ),
        "tracking_lost": (
            lost_fraction > th.max_lost_fraction or longest_lost_s >= th.max_lost_run_s,
            f"camera not tracked in {lost_fraction:.0%} of frames (limit {th.max_lost_fraction:.0%}), "
            f"longest gap {longest_lost_s:.2f} s (limit {th.max_lost_run_s:g} s)",
            lost,
        ),
        "scale_jump": (
            worst_ratio > th.max_scale_ratio,
            f"camera speed changes {worst_ratio:.1f}x across the tracking restart at frame "
            f"{int(np.nanargmax(ratio)) if np.isfinite(ratio).any() else -1} "
            f"(limit {th.max_scale_ratio:g}x): the monocular scale jumped",
            np.nan_to_num(ratio) > th.max_scale_ratio,
        ),
        "scale_uncertain": (
            signals.scale_rel_std > th.max_scale_rel_std,
            f"metric scale uncertain: relative standard error {signals.scale_rel_std:.1%} "
            f"(limit {th.max_scale_rel_std:.0%})",
            np.zeros(n, bool),
        ),
        "pose_jitter": (
            pose_jitter > th.max_pose_jitter,
            f"camera path jitter {pose_jitter:.2f} (limit {th.max_pose_jitter:g})",
            pose_kicks,
        ),
        "hand_jitter": (
            hand_jitter > th.max_hand_jitter_mps2,
            f"median wrist acceleration {hand_jitter:.1f} m/s^2 in the camera frame "
            f"(limit {th.max_hand_jitter_mps2:g} m/s^2)",
            hand_kicks,
        ),
        "identity_switches": (
            int(switch.sum()) > th.max_identity_switches,
            f"{int(switch.sum())} hand identity switches: a hand took over another identity's path "
            f"(limit {th.max_identity_switches})",
            switch > 0,
        ),
        "low_hand_coverage": (
            coverage < th.min_hand_coverage,
            f"a wearer hand in {coverage:.0%} of frames (limit {th.min_hand_coverage:.0%})",
            ~present,
        ),
    }
    failed = [code for code in FLAG_CODES if checks[code][0]]
    return QAResult(
        passed=not failed,
        flags=tuple(failed),
        reasons=tuple(checks[code][1] for code in failed),
        metrics=metrics,
        frame_flags={code: np.asarray(checks[code][2], bool) for code in FLAG_CODES},
    )
