"""Head-mounted camera trajectory and the wearer's body, as C2-smooth functions of time.

Convention:
    World frame of `pose_core.synth.scene` (z up, gravity -z). `world_from_cam` maps OpenCV camera
    coordinates (x right, y down, z forward) to world. Its rotation is
    `Rz(yaw) @ R_LEVEL @ Rx(-pitch_down) @ Rz(roll)`: at yaw = pitch = roll = 0 the camera looks
    along world +y with its x axis along world +x. Positive yaw turns the view to the wearer's left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.synth.smooth import SmoothSignal

__all__ = [
    "HeadTrajectory",
    "TrajectoryOptions",
    "TrajectorySample",
    "after_windows",
    "make_head_trajectory",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
# Quintic steps of a `SmoothSignal`: `(t_start_s, duration_s, delta)` each.
Steps = tuple[tuple[float, float, float], ...]

# Camera axes of the level, yaw-0 camera in world coordinates (columns: cam x, cam y, cam z).
R_LEVEL = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


@dataclass(frozen=True)
class TrajectoryOptions:
    """Knobs of the head and body motion."""

    # Mean head (camera) position (x, y, z), metres, world frame: the wearer leans over the table, so
    # hands on it are 35-55 cm from the camera (as in egocentric video of table work).
    head_position_m: tuple[float, float, float] = (0.0, -0.12, 1.32)
    # Mean downward pitch of the camera, radians (41 deg: the table, the boxes and the far wall in view).
    pitch_down_rad: float = 0.72
    # Slow pitch sway amplitude, radians, and its frequency, Hz.
    pitch_sway_rad: float = 0.10
    pitch_sway_hz: float = 0.23
    # Slow yaw sway amplitude, radians, and its frequency, Hz (the torso follows this, not head turns).
    yaw_sway_rad: float = 0.12
    yaw_sway_hz: float = 0.11
    # Roll sway amplitude, radians, and frequency, Hz.
    roll_sway_rad: float = 0.05
    roll_sway_hz: float = 0.17
    # Walking along the table (world x): each walk moves by a uniform amount in this range, metres ...
    walk_step_range_m: tuple[float, float] = (0.25, 0.5)
    # ... takes this long, seconds ...
    walk_duration_s: float = 1.6
    # ... and the head never leaves [-walk_limit_m, walk_limit_m] around the mean x.
    walk_limit_m: float = 0.45
    # Time between the starts of consecutive walks, seconds (uniform range).
    walk_interval_s: tuple[float, float] = (2.5, 5.0)
    # Vertical head bob amplitude, metres, and its frequency, Hz (about the step rate).
    bob_amplitude_m: float = 0.012
    bob_hz: float = 1.8
    # Forward/back lean amplitude, metres, and frequency, Hz.
    lean_amplitude_m: float = 0.03
    lean_hz: float = 0.3
    # Fast head turns: peak yaw rate, rad/s (180 deg/s) ...
    turn_peak_rate_rad_s: float = 3.14
    # ... turn angle range, radians (uniform; the sign is random) ...
    turn_angle_range_rad: tuple[float, float] = (0.45, 0.8)
    # ... time spent looking away before turning back, seconds (uniform range) ...
    turn_hold_s: tuple[float, float] = (0.2, 0.8)
    # ... time of the first turn and the interval between turn starts, seconds.
    first_turn_s: float = 0.6
    turn_interval_s: tuple[float, float] = (2.5, 4.5)
    # Body: neck base relative to the head in the torso frame (right, forward, up), metres.
    neck_from_head_m: tuple[float, float, float] = (0.0, -0.06, -0.22)
    # Half the shoulder width, metres, and shoulder drop below the neck base, metres.
    shoulder_half_width_m: float = 0.18
    shoulder_drop_m: float = 0.03
    # Walks away from the table and back (0 m: none). Each excursion: the body turns to face a bearing
    # drawn from `excursion_bearing_rad` (relative to facing the table, positive to the wearer's left;
    # pi is straight back), walks `excursion_distance_m` that way, stands a while, turns back to the
    # table and walks back to where it left. Table walks and fast head turns never overlap the body
    # turns; fast head turns go on while walking and standing.
    excursion_distance_m: float = 0.0
    excursion_bearing_rad: tuple[float, float] = (2.85, 3.45)
    # Peak walking speed, m/s (a quintic walk of distance D over T seconds peaks at 15/8 D / T).
    excursion_peak_speed_m_s: float = 1.0
    # Duration of each body turn, seconds; each walk starts half-way through its body turn.
    excursion_turn_s: float = 1.8
    # Time standing at the far point, seconds (uniform range).
    excursion_dwell_s: tuple[float, float] = (1.0, 2.0)
    # Mean downward pitch while away from the table, radians (people look ahead when they walk).
    excursion_pitch_down_rad: float = 0.3
    # Start of the first excursion, and time at the table before the next one, seconds (uniform ranges);
    # an excursion that would not be back by the end of the episode is not made.
    excursion_start_s: tuple[float, float] = (4.0, 6.0)
    excursion_gap_s: tuple[float, float] = (4.0, 8.0)


@dataclass(frozen=True)
class TrajectorySample:
    """The camera's motion at a set of times.

    Attributes:
        ts_s: times, seconds, `(N,)`.
        world_from_cam: camera poses, `(N, 4, 4)`.
        velocity_world: camera centre velocity, m/s, world frame, `(N, 3)`.
        accel_world: camera centre acceleration (without gravity), m/s^2, world frame, `(N, 3)`.
        gyro_cam: angular velocity of the camera in its own frame, rad/s, `(N, 3)`.
    """

    ts_s: FloatArray
    world_from_cam: FloatArray
    velocity_world: FloatArray
    accel_world: FloatArray
    gyro_cam: FloatArray


@dataclass(frozen=True)
class HeadTrajectory:
    """Head pose and body as smooth functions of time.

    Attributes:
        position: x, y, z of the camera centre, metres, world frame.
        yaw: head yaw, radians, including fast turns.
        pitch_down: downward pitch, radians.
        roll: roll about the optical axis, radians.
        torso_yaw: yaw of the torso, radians (the slow part of the head yaw and the body turns).
        options: the options it was made from.
        excursions: `(start_s, end_s)` of each walk away from the table and back (body turns included).
    """

    position: tuple[SmoothSignal, SmoothSignal, SmoothSignal]
    yaw: SmoothSignal
    pitch_down: SmoothSignal
    roll: SmoothSignal
    torso_yaw: SmoothSignal
    options: TrajectoryOptions
    excursions: tuple[tuple[float, float], ...] = ()

    def sample(self, ts_s: FloatArray) -> TrajectorySample:
        """Pose, velocity, acceleration and body-frame angular velocity at `ts_s`.

        Args:
            ts_s: times, seconds, `(N,)`.

        Returns:
            The sampled motion (analytic derivatives, no finite differences).
        """
        ts = _check_times(ts_s)
        pos = [sig.evaluate(ts) for sig in self.position]
        yaw, yaw_d, _ = self.yaw.evaluate(ts)
        pitch, pitch_d, _ = self.pitch_down.evaluate(ts)
        roll, roll_d, _ = self.roll.evaluate(ts)
        r_yaw = _rot(2, yaw)
        r_pitch = _rot(0, -pitch)
        r_roll = _rot(2, roll)
        rot = r_yaw @ R_LEVEL @ r_pitch @ r_roll
        # omega_cam = R_roll^T R_pitch^T R_LEVEL^T (yaw' e_z) + R_roll^T (-pitch' e_x) + roll' e_z.
        ez = np.array([0.0, 0.0, 1.0])
        ex = np.array([1.0, 0.0, 0.0])
        r_roll_t = np.swapaxes(r_roll, 1, 2)
        yaw_term = np.einsum("nij,nkj,lk,l->ni", r_roll_t, r_pitch, R_LEVEL, ez) * yaw_d[:, None]
        pitch_term = (r_roll_t @ ex) * -pitch_d[:, None]
        gyro = yaw_term + pitch_term + ez * roll_d[:, None]
        world_from_cam = np.tile(np.eye(4), (len(ts), 1, 1))
        world_from_cam[:, :3, :3] = rot
        world_from_cam[:, :3, 3] = np.stack([p[0] for p in pos], axis=1)
        return TrajectorySample(
            ts_s=ts,
            world_from_cam=world_from_cam,
            velocity_world=np.stack([p[1] for p in pos], axis=1),
            accel_world=np.stack([p[2] for p in pos], axis=1),
            gyro_cam=gyro,
        )

    def shoulders_world(self, ts_s: FloatArray) -> FloatArray:
        """Wearer-left and wearer-right shoulder positions.

        Args:
            ts_s: times, seconds, `(N,)`.

        Returns:
            Shoulders, metres, world frame, `(N, 2, 3)`; index 0 is wearer-left, 1 wearer-right.
        """
        ts = _check_times(ts_s)
        opts = self.options
        head = np.stack([sig.evaluate(ts)[0] for sig in self.position], axis=1)
        r_torso = _rot(2, self.torso_yaw.evaluate(ts)[0])
        # Torso frame columns: right (world +x at yaw 0), forward (+y), up (+z).
        neck = head + r_torso @ np.asarray(opts.neck_from_head_m)
        side = np.array(
            [
                [-opts.shoulder_half_width_m, 0.0, -opts.shoulder_drop_m],
                [opts.shoulder_half_width_m, 0.0, -opts.shoulder_drop_m],
            ]
        )
        return neck[:, None, :] + np.einsum("nij,sj->nsi", r_torso, side)


def make_head_trajectory(
    duration_s: float, opts: TrajectoryOptions, rng: np.random.Generator, periodic: bool = False
) -> HeadTrajectory:
    """Random head trajectory: sways, head bob, walks along the table, fast head turns, excursions.

    Args:
        duration_s: length of the episode, seconds; events are scheduled within it.
        opts: motion knobs.
        rng: random source (excursions, when enabled, draw first; without them the draws are as before).
        periodic: make the motion repeat with period `duration_s` (a closed loop: the pose and all its
            derivatives at `duration_s` are those at 0): every sway gets a whole number of cycles in
            the period (the nearest to its frequency, at least one), every walk, turn and excursion
            ends within it, and the walks along the table end where they began.

    Returns:
        The trajectory; its yaw reaches `opts.turn_peak_rate_rad_s` during each fast turn.

    Raises:
        ValueError: if `duration_s` is not positive.
    """
    if duration_s <= 0.0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    hx, hy, hz = opts.head_position_m
    away = _excursions(duration_s, opts, rng)
    walks = _walk_steps(duration_s, opts, rng, away.windows, periodic)
    turns = _turn_steps(duration_s, opts, rng, away.body_turns, periodic)
    phase = rng.uniform(0.0, 2.0 * np.pi, 6)

    def rate(frequency_hz: float) -> float:
        """The sway's frequency: periodic, the nearest whole number of cycles in the period (at least 1)."""
        return max(round(frequency_hz * duration_s), 1) / duration_s if periodic else frequency_hz

    yaw_sway = ((opts.yaw_sway_rad, rate(opts.yaw_sway_hz), phase[0]),)
    position = (
        SmoothSignal(hx, ((0.3 * opts.bob_amplitude_m, rate(opts.bob_hz / 2.0), phase[1]),), walks + away.x),
        SmoothSignal(hy, ((opts.lean_amplitude_m, rate(opts.lean_hz), phase[2]),), away.y),
        SmoothSignal(hz, ((opts.bob_amplitude_m, rate(opts.bob_hz), phase[3]),)),
    )
    logger.debug(
        "trajectory: %d walks, %d fast turns, %d excursions over %.2f s",
        len(walks),
        len(turns) // 2,
        len(away.windows),
        duration_s,
    )
    return HeadTrajectory(
        position=position,
        yaw=SmoothSignal(0.0, yaw_sway, turns + away.yaw),
        pitch_down=SmoothSignal(
            opts.pitch_down_rad, ((opts.pitch_sway_rad, rate(opts.pitch_sway_hz), phase[4]),), away.pitch
        ),
        roll=SmoothSignal(0.0, ((opts.roll_sway_rad, rate(opts.roll_sway_hz), phase[5]),)),
        torso_yaw=SmoothSignal(0.0, yaw_sway, away.yaw),
        options=opts,
        excursions=away.windows,
    )


@dataclass(frozen=True)
class _Excursions:
    """Quintic steps of the walks away from the table and back, and when they happen.

    Attributes:
        windows: `(start_s, end_s)` of each excursion.
        body_turns: `(start_s, end_s)` of each body turn (two per excursion).
        x: steps of the head's world x, metres.
        y: steps of the head's world y, metres.
        yaw: steps of the head and torso yaw, radians.
        pitch: steps of the downward pitch, radians.
    """

    windows: tuple[tuple[float, float], ...] = ()
    body_turns: tuple[tuple[float, float], ...] = ()
    x: Steps = ()
    y: Steps = ()
    yaw: Steps = ()
    pitch: Steps = ()


def _excursions(duration_s: float, opts: TrajectoryOptions, rng: np.random.Generator) -> _Excursions:
    """Turn away, walk, stand, turn back, walk back: as many times as fit; no draws when disabled."""
    dist = opts.excursion_distance_m
    if dist <= 0.0:
        return _Excursions()
    walk_s = 15.0 / 8.0 * dist / opts.excursion_peak_speed_m_s
    turn_s = opts.excursion_turn_s
    lift = opts.excursion_pitch_down_rad - opts.pitch_down_rad
    windows, body_turns = [], []
    x, y, yaw, pitch = [], [], [], []
    t = rng.uniform(*opts.excursion_start_s)
    while True:
        bearing = rng.uniform(*opts.excursion_bearing_rad)
        turn = float(np.angle(np.exp(1j * bearing)))  # the shorter way round, (-pi, pi]
        back = t + turn_s / 2.0 + walk_s + rng.uniform(*opts.excursion_dwell_s)  # start of the turn back
        end = back + turn_s / 2.0 + walk_s
        if end > duration_s:
            break
        # Facing yaw psi looks along (-sin psi, cos psi): the walk goes where the body faces.
        dx, dy = -dist * np.sin(bearing), dist * np.cos(bearing)
        x += [(t + turn_s / 2.0, walk_s, float(dx)), (back + turn_s / 2.0, walk_s, float(-dx))]
        y += [(t + turn_s / 2.0, walk_s, float(dy)), (back + turn_s / 2.0, walk_s, float(-dy))]
        yaw += [(t, turn_s, turn), (back, turn_s, -turn)]
        pitch += [(t, turn_s, lift), (end - turn_s, turn_s, -lift)]
        windows.append((t, end))
        body_turns += [(t, t + turn_s), (back, back + turn_s)]
        t = end + rng.uniform(*opts.excursion_gap_s)
    return _Excursions(tuple(windows), tuple(body_turns), tuple(x), tuple(y), tuple(yaw), tuple(pitch))


def after_windows(t: float, span_s: float, windows: tuple[tuple[float, float], ...]) -> float:
    """Earliest time >= `t` at which `[time, time + span_s]` overlaps none of `windows` (start_s, end_s)."""
    moved = True
    while moved:
        moved = False
        for start, end in windows:
            if t < end and t + span_s > start:
                t, moved = end, True
    return t


def _walk_steps(
    duration_s: float,
    opts: TrajectoryOptions,
    rng: np.random.Generator,
    blocked: tuple[tuple[float, float], ...],
    periodic: bool = False,
) -> Steps:
    """Quintic steps of the walk along x, kept within +-walk_limit_m, outside `blocked` windows.

    `periodic`: every walk ends by `duration_s` and a last one walks back to the start (walks are dropped
    from the end until that return fits).
    """
    steps = []
    x = 0.0
    t = rng.uniform(*opts.walk_interval_s) / 2.0
    horizon = duration_s - opts.walk_duration_s if periodic else duration_s
    while t < horizon:
        clear = after_windows(t, opts.walk_duration_s, blocked)
        if clear != t:
            t = clear
            continue
        dist = rng.uniform(*opts.walk_step_range_m)
        direction = -np.sign(x) if abs(x) + dist > opts.walk_limit_m else rng.choice((-1.0, 1.0))
        if x == 0.0 and direction == 0.0:
            direction = 1.0
        steps.append((t, opts.walk_duration_s, float(direction * dist)))
        x += direction * dist
        t += rng.uniform(*opts.walk_interval_s)
    if periodic:
        return tuple(_walked_back(steps, duration_s, opts.walk_duration_s, blocked))
    return tuple(steps)


def _walked_back(
    steps: list[tuple[float, float, float]],
    duration_s: float,
    walk_s: float,
    blocked: tuple[tuple[float, float], ...],
) -> list[tuple[float, float, float]]:
    """`steps` plus a walk back to x = 0 that ends by `duration_s` outside `blocked`.

    Walks are dropped from the end until the return fits.
    """
    while steps:
        x = sum(step[2] for step in steps)
        if x == 0.0:
            return steps
        last_end = steps[-1][0] + steps[-1][1]
        back = after_windows(last_end, walk_s, blocked)
        if back + walk_s <= duration_s:
            return [*steps, (back, walk_s, -x)]
        steps = steps[:-1]
    return steps


def _turn_steps(
    duration_s: float,
    opts: TrajectoryOptions,
    rng: np.random.Generator,
    blocked: tuple[tuple[float, float], ...],
    periodic: bool = False,
) -> Steps:
    """Pairs of quintic yaw steps (turn away, turn back) peaking at `turn_peak_rate_rad_s`.

    A pair never overlaps a `blocked` window (the longest pair the ranges allow is kept clear);
    `periodic`: every pair ends by `duration_s`.
    """
    steps = []
    longest_turn_s = 15.0 / 8.0 * opts.turn_angle_range_rad[1] / opts.turn_peak_rate_rad_s
    longest_pair_s = 2.6 * longest_turn_s + opts.turn_hold_s[1]
    t = opts.first_turn_s
    horizon = duration_s - longest_pair_s if periodic else duration_s
    while t < horizon:
        clear = after_windows(t, longest_pair_s, blocked)
        if clear != t:
            t = clear
            continue
        angle = rng.uniform(*opts.turn_angle_range_rad) * rng.choice((-1.0, 1.0))
        # A quintic step of size A over T peaks at 15/8 A / T.
        turn_s = 15.0 / 8.0 * abs(angle) / opts.turn_peak_rate_rad_s
        back_s = turn_s * rng.uniform(1.0, 1.6)
        hold = rng.uniform(*opts.turn_hold_s)
        steps.append((t, turn_s, float(angle)))
        steps.append((t + turn_s + hold, back_s, float(-angle)))
        t += rng.uniform(*opts.turn_interval_s)
    return tuple(steps)


def _rot(axis: int, angle: FloatArray) -> FloatArray:
    """Rotations by `angle` (radians, `(N,)`) about coordinate axis `axis`, `(N, 3, 3)`."""
    c, s = np.cos(angle), np.sin(angle)
    i, j = [(1, 2), (2, 0), (0, 1)][axis]
    out = np.zeros((len(angle), 3, 3))
    out[:, axis, axis] = 1.0
    out[:, i, i] = c
    out[:, j, j] = c
    out[:, i, j] = -s
    out[:, j, i] = s
    return out


def _check_times(ts_s: FloatArray) -> FloatArray:
    """Validate a 1-D float time array and return it as float64."""
    ts = np.asarray(ts_s, dtype=np.float64)
    if ts.ndim != 1:
        raise ShapeError("times must be 1-D", ts.shape, "(N,)")
    return ts
