"""Two articulated hands that reach to the table, grasp, carry, release and come back.

Keypoints are the 21 MediaPipe landmarks (0 wrist, 1-4 thumb CMC, MCP, IP, TIP, 5-8 index MCP, PIP,
DIP, TIP, 9-12 middle, 13-16 ring, 17-20 pinky), metres, in the world frame of
`pose_core.synth.scene`. Hand index 0 is the wearer's left hand, 1 the wearer's right hand.

Convention:
    Each hand has a palm frame: `fwd` (wrist towards the middle finger), `thumb` (towards the thumb
    side, in the palm plane) and `back` (out of the back of the hand). Fingers flex towards `-back`.
    A wrist is the blend `(1 - w) * rest + w * task` of a rest pose that moves with the torso and a
    task path on the table (its x moves with the head, so the wearer can walk while grasping),
    with an engagement weight `w` in [0, 1]; the wrist is then held within
    arm's reach of its shoulder by a smooth (C2) saturation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.hands.skeleton import FINGER_LENGTHS_M, FINGER_MCP_M, THUMB_CMC_M, THUMB_LENGTHS_M
from pose_core.synth.scene import SceneOptions
from pose_core.synth.smooth import SmoothSignal
from pose_core.synth.trajectory import HeadTrajectory, after_windows

__all__ = ["HandMotion", "HandOptions", "make_hand_motion"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# In-palm splay of each finger when open, radians (towards the thumb side positive).
_FINGER_SPLAY_RAD = np.array([0.14, 0.0, -0.10, -0.24])


@dataclass(frozen=True)
class HandOptions:
    """Knobs of the hand model and of the reach-grasp-release cycles."""

    # Hand size factor (1.0: adult hand, 0.19 m wrist to middle fingertip).
    hand_scale: float = 1.0
    # Longest shoulder-to-wrist distance, metres; the wrist saturates smoothly from 85 % of it.
    arm_reach_m: float = 0.68
    # Rest wrist position from the shoulder in the torso frame (inwards, forward, up), metres.
    rest_from_shoulder_m: tuple[float, float, float] = (0.06, 0.30, -0.15)
    # Wrist height above the table top while grasping, metres.
    grasp_height_m: float = 0.085
    # Extra height of the approach point above the grasp point and of the carry arc, metres.
    approach_height_m: float = 0.06
    # Grasp target, relative to the shoulder: outward offset range and forward range (world y), metres.
    target_outward_m: tuple[float, float] = (-0.15, 0.05)
    target_y_m: tuple[float, float] = (0.08, 0.26)
    # Carry displacement between grasp and release along x and y, metres (uniform ranges).
    carry_dx_m: tuple[float, float] = (-0.12, 0.12)
    carry_dy_m: tuple[float, float] = (-0.08, 0.08)
    # Keep-out margin around the boxes on the table and inside the table edge, metres.
    target_margin_m: float = 0.06
    # Phase durations, seconds: reach, lower, close, carry, open, return.
    reach_s: float = 0.9
    lower_s: float = 0.3
    close_s: float = 0.35
    carry_s: float = 1.0
    open_s: float = 0.3
    return_s: float = 0.9
    # Idle time between cycles, seconds (uniform range); the left hand starts later by `left_delay_s`.
    idle_s: tuple[float, float] = (0.3, 1.5)
    first_start_s: float = 0.2
    left_delay_s: float = 1.2
    # Finger curl: 0 straight, 1 fist. Open value, and grasp value range (uniform per grasp).
    curl_open: float = 0.12
    curl_grasp: tuple[float, float] = (0.45, 0.8)
    # Joint flexion at curl = 1 for MCP, PIP, DIP, radians.
    flexion_max_rad: tuple[float, float, float] = (1.4, 1.75, 1.2)
    # Fingers' pitch below horizontal at rest and when engaged, radians.
    pitch_rest_rad: float = 0.2
    pitch_engaged_rad: float = 0.15
    # Roll of the palm about `fwd`, thumb up positive, at rest and when engaged, radians.
    roll_rest_rad: float = 0.3
    roll_engaged_rad: float = 0.15
    # Heading of the hand turned inwards from the shoulder-to-wrist direction (seen from above), radians.
    yaw_inward_rad: float = 0.4
    # Arm drawn from the wrist back towards the body (forearm and upper arm in one): length, metres,
    # and rise above horizontal, radians.
    forearm_length_m: float = 0.45
    forearm_elevation_rad: float = 0.25
    # Bringing a hand close to the lens (as when looking at something held up to the face): the first
    # visit starts at a time drawn from `lens_first_s` (None: never), the next ones `lens_interval_s`
    # after the previous one ends (uniform ranges). The hands take turns, wearer-right first; a visit
    # waits until the wearer is back at the table, and is left out when it would not end in time.
    lens_first_s: tuple[float, float] | None = None
    lens_interval_s: tuple[float, float] = (6.0, 10.0)
    # Wrist at the lens relative to the camera centre, torso frame (inwards, forward, up), metres.
    lens_wrist_m: tuple[float, float, float] = (0.04, 0.13, -0.185)
    # Raise, hold (uniform range) and lower durations, seconds.
    lens_raise_s: float = 0.7
    lens_hold_s: tuple[float, float] = (0.8, 1.6)
    lens_lower_s: float = 0.7
    # Fingers' pitch below horizontal (negative: raised), palm roll and heading turned inwards from the
    # torso's forward direction at the lens, radians (the back of the hand faces the camera).
    lens_pitch_rad: float = -1.0
    lens_roll_rad: float = 0.2
    lens_yaw_inward_rad: float = 0.3
    # Rise of the drawn arm above horizontal at the lens, radians (negative: the elbow below the wrist).
    lens_forearm_elevation_rad: float = -0.9


@dataclass(frozen=True)
class HandMotion:
    """Smooth motion of both hands.

    Attributes:
        engagement: per hand, weight of the task path against the rest pose, in [0, 1].
        task: per hand, the task path, metres: x relative to the head's x, y and z in the world frame.
        curl: per hand, finger curl (0 straight, 1 fist).
        trajectory: the head/body the hands are attached to.
        options: the options used.
        lens: per hand, weight of the pose at the lens against the rest of the motion, in [0, 1]
            (no steps: the hand never goes there).
    """

    engagement: tuple[SmoothSignal, SmoothSignal]
    task: tuple[
        tuple[SmoothSignal, SmoothSignal, SmoothSignal], tuple[SmoothSignal, SmoothSignal, SmoothSignal]
    ]
    curl: tuple[SmoothSignal, SmoothSignal]
    trajectory: HeadTrajectory
    options: HandOptions
    lens: tuple[SmoothSignal, SmoothSignal] = (SmoothSignal(), SmoothSignal())

    def grip_curl(self, ts_s: FloatArray) -> FloatArray:
        """Finger curl of each hand at `ts_s`, `(N, 2)` in [0, 1]."""
        return np.stack([c.evaluate(np.asarray(ts_s, np.float64))[0] for c in self.curl], axis=1)

    def keypoints_world(self, ts_s: FloatArray) -> FloatArray:
        """The 21 keypoints of both hands.

        Args:
            ts_s: times, seconds, `(N,)`.

        Returns:
            Keypoints, metres, world frame, `(N, 2, 21, 3)`; hand 0 wearer-left, 1 wearer-right.
        """
        ts = np.asarray(ts_s, np.float64)
        wrists, frames = self._wrists_and_frames(ts)
        out = np.empty((len(ts), 2, 21, 3))
        for hand in (0, 1):
            local = _hand_local(self.curl[hand].evaluate(ts)[0], self.options)
            out[:, hand] = wrists[:, hand, None, :] + np.einsum("nkc,ncj->nkj", local, frames[:, hand])
        return out

    def elbows_world(self, ts_s: FloatArray) -> FloatArray:
        """Where each drawn arm ends: `forearm_length_m` from the wrist, back towards the body.

        The arm runs from the wrist towards its shoulder as seen from above, raised by
        `forearm_elevation_rad`, so it enters the egocentric view from below.

        Args:
            ts_s: times, seconds, `(N,)`.

        Returns:
            Elbow positions, metres, world frame, `(N, 2, 3)`; hand 0 wearer-left, 1 wearer-right.
        """
        ts = np.asarray(ts_s, np.float64)
        wrists, _ = self._wrists_and_frames(ts)
        back = self.trajectory.shoulders_world(ts)[..., :2] - wrists[..., :2]
        back /= np.maximum(np.linalg.norm(back, axis=-1, keepdims=True), 1e-12)
        opts = self.options
        direction = _arm_direction(back, opts.forearm_elevation_rad)
        for hand in (0, 1):
            if self.lens[hand].steps:  # the arm hangs from a hand raised to the lens
                v = self._lens_weight(hand, ts)
                rise = (1.0 - v) * opts.forearm_elevation_rad + v * opts.lens_forearm_elevation_rad
                direction[:, hand] = _arm_direction(back[:, hand], rise[:, None])
        return wrists + opts.forearm_length_m * direction

    def _lens_weight(self, hand: int, ts: FloatArray) -> FloatArray:
        """Weight of the pose at the lens of `hand`, `(N,)` in [0, 1]."""
        return np.clip(self.lens[hand].evaluate(ts)[0], 0.0, 1.0)

    def _wrists_and_frames(self, ts: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Wrist positions `(N, 2, 3)` and palm frames (rows fwd, thumb, back) `(N, 2, 3, 3)`, world."""
        opts = self.options
        shoulders = self.trajectory.shoulders_world(ts)
        torso_yaw = self.trajectory.torso_yaw.evaluate(ts)[0]
        c, s = np.cos(torso_yaw), np.sin(torso_yaw)
        right_dir = np.stack([c, s, np.zeros_like(c)], axis=1)
        fwd_dir = np.stack([-s, c, np.zeros_like(c)], axis=1)
        head_x = self.trajectory.position[0].evaluate(ts)[0]
        head = np.stack([head_x] + [sig.evaluate(ts)[0] for sig in self.trajectory.position[1:]], axis=1)
        wrists = np.empty((len(ts), 2, 3))
        frames = np.empty((len(ts), 2, 3, 3))
        for hand, side in ((0, -1.0), (1, 1.0)):
            inward, forward, up = opts.rest_from_shoulder_m
            rest = shoulders[:, hand] + (-side * inward) * right_dir + forward * fwd_dir
            rest[:, 2] += up
            w = np.clip(self.engagement[hand].evaluate(ts)[0], 0.0, 1.0)[:, None]
            task = np.stack([sig.evaluate(ts)[0] for sig in self.task[hand]], axis=1)
            task[:, 0] += head_x
            target = (1.0 - w) * rest + w * task
            pitch = (1.0 - w[:, 0]) * opts.pitch_rest_rad + w[:, 0] * opts.pitch_engaged_rad
            roll = (1.0 - w[:, 0]) * opts.roll_rest_rad + w[:, 0] * opts.roll_engaged_rad
            # Towards the lens by weight v (all 0 for a hand that never goes: then each blend is exact).
            v = self._lens_weight(hand, ts)
            lens_in, lens_fwd, lens_up = opts.lens_wrist_m
            lens = head + (-side * lens_in) * right_dir + lens_fwd * fwd_dir
            lens[:, 2] += lens_up
            target = (1.0 - v[:, None]) * target + v[:, None] * lens
            pitch = (1.0 - v) * pitch + v * opts.lens_pitch_rad
            roll = (1.0 - v) * roll + v * opts.lens_roll_rad
            wrists[:, hand] = _limit_reach(shoulders[:, hand], target, opts.arm_reach_m)
            reach = wrists[:, hand] - shoulders[:, hand]
            heading = np.arctan2(reach[:, 1], reach[:, 0]) + side * opts.yaw_inward_rad
            facing = torso_yaw + np.pi / 2.0 + side * opts.lens_yaw_inward_rad  # torso forward, turned in
            heading = heading + v * np.angle(np.exp(1j * (facing - heading)))
            frames[:, hand] = _palm_frame(heading, pitch, roll, side)
        return wrists, frames


def make_hand_motion(
    duration_s: float,
    trajectory: HeadTrajectory,
    scene: SceneOptions,
    opts: HandOptions,
    rng: np.random.Generator,
    periodic: bool = False,
) -> HandMotion:
    """Schedule reach-grasp-carry-release cycles (and visits to the lens) for both hands.

    No cycle overlaps the trajectory's excursions (the wearer is away from the table), and the two
    hands are never at the lens together.

    Args:
        duration_s: episode length, seconds.
        trajectory: head and body motion (shoulders come from it).
        scene: table and box geometry (grasp targets lie on the table, away from the boxes).
        opts: hand knobs.
        rng: random source.
        periodic: every cycle and visit ends by `duration_s` (the hands are back at rest, open), so the
            motion repeats with that period when `trajectory` does.

    Returns:
        The motion of both hands.
    """
    visits = _lens_visits(duration_s, trajectory, opts, rng)
    engagement, task, curl, lens = [], [], [], []
    for hand, side in ((0, -1.0), (1, 1.0)):
        own = tuple((start, end) for h, start, end in visits if h == hand)
        e, p, c = _schedule(
            duration_s,
            side,
            opts.first_start_s + opts.left_delay_s * (hand == 0),
            trajectory,
            scene,
            opts,
            rng,
            trajectory.excursions + own,
            periodic,
        )
        engagement.append(e)
        task.append(p)
        curl.append(c)
        raise_s, lower_s = opts.lens_raise_s, opts.lens_lower_s
        steps = [((start, raise_s, 1.0), (end - lower_s, lower_s, -1.0)) for start, end in own]
        lens.append(SmoothSignal(0.0, (), tuple(step for pair in steps for step in pair)))
    return HandMotion(
        (engagement[0], engagement[1]),
        (task[0], task[1]),
        (curl[0], curl[1]),
        trajectory,
        opts,
        (lens[0], lens[1]),
    )


def _lens_visits(
    duration_s: float, trajectory: HeadTrajectory, opts: HandOptions, rng: np.random.Generator
) -> list[tuple[int, float, float]]:
    """`(hand, start_s, end_s)` of each visit to the lens; no draws when visits are off."""
    if opts.lens_first_s is None:
        return []
    visits: list[tuple[int, float, float]] = []
    hand = 1
    t = rng.uniform(*opts.lens_first_s)
    while True:
        span = opts.lens_raise_s + rng.uniform(*opts.lens_hold_s) + opts.lens_lower_s
        t = after_windows(t, span, trajectory.excursions)
        if t + span > duration_s:
            return visits
        visits.append((hand, t, t + span))
        hand = 1 - hand
        t += span + rng.uniform(*opts.lens_interval_s)


def _schedule(  # noqa: PLR0913, PLR0917 - private step of make_hand_motion
    duration_s: float,
    side: float,
    start_s: float,
    trajectory: HeadTrajectory,
    scene: SceneOptions,
    opts: HandOptions,
    rng: np.random.Generator,
    busy: tuple[tuple[float, float], ...],
    periodic: bool = False,
) -> tuple[SmoothSignal, tuple[SmoothSignal, SmoothSignal, SmoothSignal], SmoothSignal]:
    """Engagement, task path and curl signals of one hand (side -1 left, +1 right).

    No cycle overlaps a `busy` window `(start_s, end_s)` (the wearer away, the hand at the lens);
    `periodic`: every cycle ends by `duration_s`.
    """
    grasp_z = scene.table_center_m[2] + opts.grasp_height_m
    lift = opts.approach_height_m
    eng_steps: list[tuple[float, float, float]] = []
    xyz_steps: list[list[tuple[float, float, float]]] = [[], [], []]
    curl_steps: list[tuple[float, float, float]] = []
    cycle_s = opts.reach_s + opts.lower_s + opts.close_s + opts.carry_s + opts.open_s + opts.return_s
    first = None
    pos = np.zeros(3)
    t = start_s
    horizon = duration_s - cycle_s if periodic else duration_s
    while (t := after_windows(t, cycle_s, busy)) < horizon:
        shoulder_x = float(trajectory.shoulders_world(np.array([t]))[0, int(side > 0), 0])
        grasp = _pick_target(shoulder_x, side, grasp_z, scene, opts, rng)
        place = _pick_target(
            grasp[0] + rng.uniform(*opts.carry_dx_m),
            0.0,
            grasp_z,
            scene,
            opts,
            rng,
            y=grasp[1] + rng.uniform(*opts.carry_dy_m),
        )
        # Task x is stored relative to the head's x: the hand walks along with the wearer.
        head_x = np.array([float(trajectory.position[0].evaluate(np.array([t]))[0][0]), 0.0, 0.0])
        grasp, place = grasp - head_x, place - head_x
        approach = grasp + [0.0, 0.0, lift]
        if first is None:
            first = approach
        else:  # Jump to the new approach point while the hand is at rest (weight 0).
            for k in range(3):
                xyz_steps[k].append((t - opts.idle_s[0] / 2, opts.idle_s[0] / 4, float(approach[k] - pos[k])))
        pos = approach
        eng_steps.append((t, opts.reach_s, 1.0))
        t += opts.reach_s
        xyz_steps[2].append((t, opts.lower_s, -lift))
        t += opts.lower_s
        grip = rng.uniform(*opts.curl_grasp)
        curl_steps.append((t, opts.close_s, grip - opts.curl_open))
        t += opts.close_s
        # Carry: move horizontally while the height rises and falls back (two z steps).
        for k in range(2):
            xyz_steps[k].append((t, opts.carry_s, float(place[k] - grasp[k])))
        xyz_steps[2].append((t, opts.carry_s / 2, lift))
        xyz_steps[2].append((t + opts.carry_s / 2, opts.carry_s / 2, -lift))
        pos = np.array([place[0], place[1], grasp_z])
        t += opts.carry_s
        curl_steps.append((t, opts.open_s, opts.curl_open - grip))
        t += opts.open_s
        xyz_steps[2].append((t, opts.open_s, lift))
        pos = pos + [0.0, 0.0, lift]
        eng_steps.append((t, opts.return_s, -1.0))
        t += opts.return_s + rng.uniform(*opts.idle_s) + opts.idle_s[0]
    origin = np.zeros(3) if first is None else first
    task = tuple(SmoothSignal(float(origin[k]), (), tuple(xyz_steps[k])) for k in range(3))
    return (
        SmoothSignal(0.0, (), tuple(eng_steps)),
        (task[0], task[1], task[2]),
        SmoothSignal(opts.curl_open, (), tuple(curl_steps)),
    )


def _pick_target(  # noqa: PLR0913, PLR0917 - private sampler
    x_ref: float,
    side: float,
    z: float,
    scene: SceneOptions,
    opts: HandOptions,
    rng: np.random.Generator,
    y: float | None = None,
) -> FloatArray:
    """A point on the table at height `z`, near `x_ref`, clear of the boxes (best of 20 tries)."""
    tc, half, margin = (
        np.asarray(scene.table_center_m),
        np.asarray(scene.table_size_m) / 2,
        opts.target_margin_m,
    )
    best, best_clear = np.zeros(3), -np.inf
    for _ in range(20):
        x = x_ref + side * rng.uniform(*opts.target_outward_m) if side else x_ref
        yy = rng.uniform(*opts.target_y_m) if y is None else y
        x = float(np.clip(x, tc[0] - half[0] + margin, tc[0] + half[0] - margin))
        yy = float(np.clip(yy, tc[1] - half[1] + margin, tc[1] + half[1] - margin))
        clear = min(
            (max(abs(x - tc[0] - b[0]) - b[2] / 2, abs(yy - tc[1] - b[1]) - b[3] / 2) for b in scene.boxes),
            default=np.inf,
        )
        if clear > best_clear:
            best, best_clear = np.array([x, yy, z]), clear
        if clear > margin:
            break
        y = None if y is None else y + rng.uniform(-0.05, 0.05)
    return best


def _arm_direction(back: FloatArray, rise: float | FloatArray) -> FloatArray:
    """Unit vectors along the horizontal `back` (`(..., 2)`, unit) raised by `rise` radians, `(..., 3)`."""
    return np.concatenate([np.cos(rise) * back, np.full(back.shape[:-1] + (1,), np.sin(rise))], axis=-1)


def _limit_reach(shoulder: FloatArray, wrist: FloatArray, reach_m: float) -> FloatArray:
    """Pull `wrist` (N, 3) towards `shoulder` (N, 3) so it stays within `reach_m`, smoothly (C2)."""
    d = wrist - shoulder
    r = np.linalg.norm(d, axis=1, keepdims=True)
    knee = 0.85 * reach_m
    span = reach_m - knee
    r_limited = np.where(r > knee, knee + span * np.tanh((r - knee) / span), r)
    return shoulder + d * (r_limited / np.maximum(r, 1e-12))


def _palm_frame(heading: FloatArray, pitch: FloatArray, roll: FloatArray, side: float) -> FloatArray:
    """Palm axes (fwd, thumb, back) as rows, world frame, `(N, 3, 3)`.

    `fwd` points along the world heading `heading` (radians from +x towards +y), pitched down by
    `pitch`; `back` starts vertical and the palm is rolled about `fwd` by `roll` (thumb up for positive
    roll; `side` is -1 for the left hand, +1 for the right).
    """
    horiz = np.stack([np.cos(heading), np.sin(heading), np.zeros_like(heading)], axis=1)
    up = np.array([0.0, 0.0, 1.0])
    fwd = np.cos(pitch)[:, None] * horiz - np.sin(pitch)[:, None] * up
    back0 = np.sin(pitch)[:, None] * horiz + np.cos(pitch)[:, None] * up
    thumb0 = side * np.cross(back0, fwd)
    # Roll in the (thumb, back) plane: the thumb turns towards `back0` (up) for positive roll.
    cr, sr = np.cos(roll)[:, None], np.sin(roll)[:, None]
    thumb = cr * thumb0 + sr * back0
    back = cr * back0 - sr * thumb0
    return np.stack([fwd, thumb, back], axis=1)


def _hand_local(curl: FloatArray, opts: HandOptions) -> FloatArray:
    """Keypoints in the palm frame (fwd, thumb, back), metres, `(N, 21, 3)`, for finger curl `(N,)`."""
    n = len(curl)
    scale = opts.hand_scale
    local = np.zeros((n, 21, 3))
    flex = np.asarray(opts.flexion_max_rad)[None, :] * curl[:, None]  # (N, 3) per joint
    for f in range(4):
        splay = _FINGER_SPLAY_RAD[f] * (1.0 - curl)
        phi = np.cumsum(flex, axis=1)  # cumulative flexion of the three phalanges
        seg = (
            np.stack(
                [np.cos(phi) * np.cos(splay)[:, None], np.cos(phi) * np.sin(splay)[:, None], -np.sin(phi)],
                axis=2,
            )
            * FINGER_LENGTHS_M[f][None, :, None]
        )
        base = 5 + 4 * f
        local[:, base, :2] = FINGER_MCP_M[f]
        local[:, base + 1 : base + 4] = local[:, base : base + 1] + np.cumsum(seg, axis=1)
    # Thumb: opposes (swings towards the fingers and the palm side) as the hand closes.
    psi = 0.95 - 0.5 * curl
    tilt = 0.35 + 0.4 * curl
    phi = tilt[:, None] + np.cumsum(np.stack([np.zeros(n), 0.5 * curl, 0.8 * curl], axis=1), axis=1)
    seg = (
        np.stack(
            [np.cos(phi) * np.cos(psi)[:, None], np.cos(phi) * np.sin(psi)[:, None], -np.sin(phi)], axis=2
        )
        * THUMB_LENGTHS_M[None, :, None]
    )
    local[:, 1] = THUMB_CMC_M
    local[:, 2:5] = local[:, 1:2] + np.cumsum(seg, axis=1)
    return local * scale
