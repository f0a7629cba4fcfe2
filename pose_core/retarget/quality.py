"""Quality of a robot's retargeted data: which steps are valid, the figures, pass or fail with reasons.

A robot dataset is worth training on only where its steps follow a hand that was there and that the
robot reached. Like `pose_core.qa` for the hand dataset, the figures here decide which episodes a
robot's dataset leaves out (thresholds in `QualityThresholds`, conf `retarget.quality`).

Convention:
    Per control step of one followed hand, its *hand state* is ``observed`` or ``filled`` (a
    hands_world row, measured or gap-filled: the step is *valid*), ``missing`` (no row: nothing is
    invented there) or ``beyond_reach`` (a row whose wrist is farther from the camera than a human
    arm reaches: a failed hand fit, not motion to follow). Reachability, errors and violations are
    counted over valid steps; an episode's figures pool the steps of all its followed hands.
    The *position error* is the tool's distance to the hand's own target (the wrist as `hands_world`
    has it, through the base pose and workspace scaling: what a replay of the joints through FK is
    compared with); the *tracking error* is its distance to the smoothed target the arm was asked to
    follow (`pose_core.retarget.smoothing`), and ``target_shift`` how far smoothing moved that target
    from the hand. Position error <= tracking error + shift, step by step. Orientation errors are
    against the smoothed target. Metres in the robot's base frame (after workspace scaling), radians.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError

__all__ = [
    "HAND_STATES",
    "QUALITY_FLAGS",
    "QualityThresholds",
    "RetargetFigures",
    "evaluate_quality",
    "hand_states",
    "joint_violations",
    "retarget_figures",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

#: A step's hand: valid (observed, filled) or not (missing, beyond_reach).
HAND_STATES: tuple[str, ...] = ("observed", "filled", "missing", "beyond_reach")
VALID_STATES: tuple[str, ...] = ("observed", "filled")
#: Every quality flag, in the order reasons are reported.
QUALITY_FLAGS: tuple[str, ...] = ("refused", "low_valid", "position_error", "limit_violations")
_LIMIT_SLACK = 1e-6  # relative slack of the speed and acceleration checks (float rounding)


@dataclass(frozen=True)
class QualityThresholds:
    """Limits of a robot's data per episode; an episode is left out of the robot dataset past any of them."""

    # low_valid: fails below this share of valid steps (hand observed or gap-filled, within reach),
    # pooled over the followed hands (HumanNet keeps episodes with more than 60 % valid frames).
    min_valid_fraction: float = 0.6
    # position_error: fails when the 95th percentile of the tool's position error to the hand (not to the
    # smoothed target) over valid steps is above this, metres (arms; HumanNet's retargeting-error filter
    # is 15 mm).
    max_position_error_p95_m: float = 0.015

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_valid_fraction <= 1.0 or self.max_position_error_p95_m <= 0:
            raise ValueError("retarget.quality: min_valid_fraction in [0, 1], max_position_error_p95_m > 0")


@dataclass(frozen=True)
class RetargetFigures:
    """Figures of one or more followed hands' steps (NaN where no valid step has the value).

    Attributes:
        steps: control steps.
        valid_steps: steps with a hand to follow (observed or filled).
        filled_steps: of those, gap-filled.
        missing_steps: steps without a hand.
        beyond_reach_steps: steps whose hand is beyond a human arm's reach of the camera.
        reachable_steps: valid steps within the profile's tolerances.
        position_error_median_m: tool position error to the hand's target over valid steps, median.
        position_error_p95_m: ... 95th percentile.
        tracking_error_median_m: tool position error to the smoothed target, median.
        tracking_error_p95_m: ... 95th percentile.
        approach_error_median_rad: approach-axis error, median (NaN for dexterous hands).
        approach_error_p95_rad: ... 95th percentile.
        closing_error_median_rad: closing-axis error, median.
        closing_error_p95_rad: ... 95th percentile.
        target_shift_p95_m: how far smoothing moved the targets from the hands, 95th percentile.
        limit_violations: joint values outside their limits.
        speed_violations: joint steps beyond the speed limits.
        acceleration_violations: joint second steps beyond the acceleration limits.
    """

    steps: int
    valid_steps: int
    filled_steps: int
    missing_steps: int
    beyond_reach_steps: int
    reachable_steps: int
    position_error_median_m: float
    position_error_p95_m: float
    tracking_error_median_m: float
    tracking_error_p95_m: float
    approach_error_median_rad: float
    approach_error_p95_rad: float
    closing_error_median_rad: float
    closing_error_p95_rad: float
    target_shift_p95_m: float
    limit_violations: int
    speed_violations: int
    acceleration_violations: int

    @property
    def valid_fraction(self) -> float:
        """Valid steps over all steps (0 without steps)."""
        return self.valid_steps / self.steps if self.steps else 0.0

    @property
    def reachable_fraction(self) -> float:
        """Reachable steps over valid steps (NaN without valid steps)."""
        return self.reachable_steps / self.valid_steps if self.valid_steps else float("nan")

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures and both fractions, JSON-ready (NaN becomes None)."""
        out = {**asdict(self), "valid_fraction": self.valid_fraction,
               "reachable_fraction": self.reachable_fraction}
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}


def hand_states(present: BoolArray, filled: BoolArray, wrist_to_camera_m: FloatArray,
                max_hand_distance_m: float) -> NDArray[np.object_]:
    """Hand state per step (see the module's Convention).

    Args:
        present: the step has a hands_world row for the hand, ``(S,)``.
        filled: that row is gap-filled, ``(S,)``.
        wrist_to_camera_m: wrist distance from the camera centre, metres, ``(S,)`` (NaN: unknown, kept).
        max_hand_distance_m: farther than this, the hand is beyond reach.

    Returns:
        ``(S,)`` object array of `HAND_STATES`.

    Raises:
        ShapeError: on mismatched shapes.
    """
    present = np.asarray(present, bool)
    if np.shape(filled) != present.shape or np.shape(wrist_to_camera_m) != present.shape:
        raise ShapeError("present, filled, wrist_to_camera_m", (present.shape, np.shape(filled),
                                                                np.shape(wrist_to_camera_m)), "(S,) each")
    out = np.full(present.shape, "missing", dtype=object)
    out[present] = np.where(np.asarray(filled, bool)[present], "filled", "observed")
    out[present & (np.asarray(wrist_to_camera_m) > max_hand_distance_m)] = "beyond_reach"
    return out


def joint_violations(q: FloatArray, dt: float, bounds: tuple[FloatArray, FloatArray], velocity: FloatArray,
                     acceleration: FloatArray) -> tuple[int, int, int]:
    """Joint values outside the limits, steps beyond the speed limits, second steps beyond the accelerations.

    Args:
        q: joints per step ``(S, J)``.
        dt: step period, seconds.
        bounds: ``(lower, upper)`` ``(J,)`` each.
        velocity: speed limits ``(J,)``.
        acceleration: acceleration limits ``(J,)`` (``inf``: none).

    Returns:
        ``(limit, speed, acceleration)`` counts (a relative slack of 1e-6 absorbs float rounding).
    """
    tol, slack = 1e-9, 1.0 + _LIMIT_SLACK
    limit = int(np.sum((q < bounds[0] - tol) | (q > bounds[1] + tol)))
    speed = int(np.sum(np.abs(np.diff(q, axis=0)) > velocity * dt * slack + tol))
    accel = int(np.sum(np.abs(np.diff(q, n=2, axis=0)) > acceleration * dt * dt * slack + tol))
    return limit, speed, accel


def _stat(values: FloatArray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if len(finite) else float("nan")


def retarget_figures(  # noqa: PLR0913 - the per-step arrays and the three counts
    states: NDArray[np.object_],
    reachable: BoolArray,
    position_error_m: FloatArray,
    tracking_error_m: FloatArray,
    approach_error_rad: FloatArray,
    closing_error_rad: FloatArray,
    target_shift_m: FloatArray,
    violations: tuple[int, int, int],
) -> RetargetFigures:
    """Figures of a set of steps (one hand, or several pooled).

    Args:
        states: hand state per step ``(S,)``.
        reachable: per step ``(S,)`` (only valid steps count).
        position_error_m: to the hand's target, per step ``(S,)``.
        tracking_error_m: to the smoothed target, per step ``(S,)`` (a dexterous hand: its position error).
        approach_error_rad: per step ``(S,)`` (NaN for dexterous hands).
        closing_error_rad: per step ``(S,)``.
        target_shift_m: per step ``(S,)``.
        violations: (limit, speed, acceleration) violation counts.

    Returns:
        The figures; errors are taken over valid steps.
    """
    valid = np.isin(states, VALID_STATES)

    def over_valid(values: FloatArray) -> FloatArray:
        return np.asarray(values, np.float64)[valid]

    return RetargetFigures(
        steps=len(states), valid_steps=int(valid.sum()), filled_steps=int(np.sum(states == "filled")),
        missing_steps=int(np.sum(states == "missing")),
        beyond_reach_steps=int(np.sum(states == "beyond_reach")),
        reachable_steps=int(np.sum(np.asarray(reachable, bool) & valid)),
        position_error_median_m=_stat(over_valid(position_error_m), 50),
        position_error_p95_m=_stat(over_valid(position_error_m), 95),
        tracking_error_median_m=_stat(over_valid(tracking_error_m), 50),
        tracking_error_p95_m=_stat(over_valid(tracking_error_m), 95),
        approach_error_median_rad=_stat(over_valid(approach_error_rad), 50),
        approach_error_p95_rad=_stat(over_valid(approach_error_rad), 95),
        closing_error_median_rad=_stat(over_valid(closing_error_rad), 50),
        closing_error_p95_rad=_stat(over_valid(closing_error_rad), 95),
        target_shift_p95_m=_stat(over_valid(target_shift_m), 95),
        limit_violations=int(violations[0]), speed_violations=int(violations[1]),
        acceleration_violations=int(violations[2]),
    )


def evaluate_quality(figures: RetargetFigures, thresholds: QualityThresholds, is_arm: bool,
                     refused: str | None = None) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """Pass or fail an episode's robot data, with one sentence per failed check.

    Args:
        figures: the episode's pooled figures.
        thresholds: the limits.
        is_arm: the position-error check applies to arms only (a dexterous hand's error is a keypoint
            vector error, not a tool position).
        refused: why the robot was not retargeted at all (e.g. no metric scale), or None.

    Returns:
        ``(passed, flags, reasons)``; flags in `QUALITY_FLAGS` order.
    """
    found: dict[str, str] = {}
    if refused is not None:
        found["refused"] = f"retarget refused: {refused}"
    elif figures.valid_fraction < thresholds.min_valid_fraction:
        found["low_valid"] = (
            f"valid steps {100 * figures.valid_fraction:.0f} % < {100 * thresholds.min_valid_fraction:.0f} % "
            f"(retarget.quality.min_valid_fraction): {figures.missing_steps} of {figures.steps} steps "
            f"without a hand, {figures.beyond_reach_steps} with a hand beyond reach of the camera")
    if (refused is None and is_arm and figures.valid_steps
            and not figures.position_error_p95_m <= thresholds.max_position_error_p95_m):
        found["position_error"] = (
            f"tool position error to the hand p95 {1e3 * figures.position_error_p95_m:.1f} mm (to the "
            f"smoothed target {1e3 * figures.tracking_error_p95_m:.1f} mm, smoothing shift p95 "
            f"{1e3 * figures.target_shift_p95_m:.1f} mm) > "
            f"{1e3 * thresholds.max_position_error_p95_m:.1f} mm (retarget.quality.max_position_error_p95_m)")
    broken = figures.limit_violations + figures.speed_violations + figures.acceleration_violations
    if broken:
        found["limit_violations"] = (
            f"{figures.limit_violations} joint limit, {figures.speed_violations} speed and "
            f"{figures.acceleration_violations} acceleration violations")
    flags = tuple(f for f in QUALITY_FLAGS if f in found)
    return not flags, flags, tuple(found[f] for f in flags)
