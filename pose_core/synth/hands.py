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

from pose_core.hands.skeleton import BONES as FINGER_BONES
from pose_core.hands.skeleton import FINGER_LENGTHS_M, FINGER_MCP_M, THUMB_CMC_M, THUMB_LENGTHS_M
from pose_core.synth.scene import SceneOptions
from pose_core.synth.smooth import SmoothSignal
from pose_core.synth.trajectory import HeadTrajectory

__all__ = ["FINGER_BONES", "HandMotion", "HandOptions", "make_hand_motion"]

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
    # Heading of the hand turned inwards from the shoulder-to-wrist direction, radians.
    yaw_inward_rad: float = 0.4
    # Arm drawn from the wrist back towards the body (forearm and upper arm in one): length, metres,
    # and rise above horizontal, radians.
    forearm_length_m: float = 0.45
    forearm_elevation_rad: float = 0.25


@dataclass(frozen=True)
class HandMotion:
    """Smooth motion of both hands.

    Attributes:
        engagement: per hand, weight of the task path against the rest pose, in [0, 1].
        task: per hand, the task path, metres: x relative to the head's x, y and z in the world frame.
        curl: per hand, finger curl (0 straight, 1 fist).
        trajectory: the head/body the hands are attached to.
        options: the options used.
    """

    engagement: tuple[SmoothSignal, SmoothSignal]
    task: tuple[
        tuple[SmoothSignal, SmoothSignal, SmoothSignal], tuple[SmoothSignal, SmoothSignal, SmoothSignal]
    ]
    curl: tuple[SmoothSignal, SmoothSignal]
    trajectory: HeadTrajectory
    options: HandOptions

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
        up = self.options.forearm_elevation_rad
        direction = np.concatenate([np.cos(up) * back, np.full(back.shape[:-1] + (1,), np.sin(up))], axis=-1)
        return wrists + self.options.forearm_length_m * direction

    def _wrists_and_frames(self, ts: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Wrist positions `(N, 2, 3)` and palm frames (rows fwd, thumb, back) `(N, 2, 3, 3)`, world."""
        opts = self.options
        shoulders = self.trajectory.shoulders_world(ts)
        torso_yaw = self.trajectory.torso_yaw.evaluate(ts)[0]
        c, s = np.cos(torso_yaw), np.sin(torso_yaw)
        right_dir = np.stack([c, s, np.zeros_like(c)], axis=1)
        fwd_dir = np.stack([-s, c, np.zeros_like(c)], axis=1)
        head_x = self.trajectory.position[0].evaluate(ts)[0]
        wrists = np.empty((len(ts), 2, 3))
        frames = np.empty((len(ts), 2, 3, 3))
        for hand, side in ((0, -1.0), (1, 1.0)):
            inward, forward, up = opts.rest_from_shoulder_m
            rest = shoulders[:, hand] + (-side * inward) * right_dir + forward * fwd_dir
            rest[:, 2] += up
            w = np.clip(self.engagement[hand].evaluate(ts)[0], 0.0, 1.0)[:, None]
            task = np.stack([sig.evaluate(ts)[0] for sig in self.task[hand]], axis=1)
            task[:, 0] += head_x
            wrists[:, hand] = _limit_reach(shoulders[:, hand], (1.0 - w) * rest + w * task, opts.arm_reach_m)
            pitch = (1.0 - w[:, 0]) * opts.pitch_rest_rad + w[:, 0] * opts.pitch_engaged_rad
            roll = (1.0 - w[:, 0]) * opts.roll_rest_rad + w[:, 0] * opts.roll_engaged_rad
            frames[:, hand] = _palm_frame(
                wrists[:, hand] - shoulders[:, hand], pitch, roll, side, opts.yaw_inward_rad
            )
        return wrists, frames


def make_hand_motion(
    duration_s: float,
    trajectory: HeadTrajectory,
    scene: SceneOptions,
    opts: HandOptions,
    rng: np.random.Generator,
) -> HandMotion:
    """Schedule reach-grasp-carry-release cycles for both hands.

    Args:
        duration_s: episode length, seconds.
        trajectory: head and body motion (shoulders come from it).
        scene: table and box geometry (grasp targets lie on the table, away from the boxes).
        opts: hand knobs.
        rng: random source.

    Returns:
        The motion of both hands.
    """
    engagement, task, curl = [], [], []
    for hand, side in ((0, -1.0), (1, 1.0)):
        e, p, c = _schedule(
            duration_s,
            side,
            opts.first_start_s + opts.left_delay_s * (hand == 0),
            trajectory,
            scene,
            opts,
            rng,
        )
        engagement.append(e)
        task.append(p)
        curl.append(c)
    return HandMotion(
        (engagement[0], engagement[1]), (task[0], task[1]), (curl[0], curl[1]), trajectory, opts
    )


def _schedule(  # noqa: PLR0913, PLR0917 - private step of make_hand_motion
    duration_s: float,
    side: float,
    start_s: float,
    trajectory: HeadTrajectory,
    scene: SceneOptions,
    opts: HandOptions,
    rng: np.random.Generator,
) -> tuple[SmoothSignal, tuple[SmoothSignal, SmoothSignal, SmoothSignal], SmoothSignal]:
    """Engagement, task path and curl signals of one hand (side -1 left, +1 right)."""
    grasp_z = scene.table_center_m[2] + opts.grasp_height_m
    lift = opts.approach_height_m
    eng_steps: list[tuple[float, float, float]] = []
    xyz_steps: list[list[tuple[float, float, float]]] = [[], [], []]
    curl_steps: list[tuple[float, float, float]] = []
    first = None
    pos = np.zeros(3)
    t = start_s
    while t < duration_s:
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


def _limit_reach(shoulder: FloatArray, wrist: FloatArray, reach_m: float) -> FloatArray:
    """Pull `wrist` (N, 3) towards `shoulder` (N, 3) so it stays within `reach_m`, smoothly (C2)."""
    d = wrist - shoulder
    r = np.linalg.norm(d, axis=1, keepdims=True)
    knee = 0.85 * reach_m
    span = reach_m - knee
    r_limited = np.where(r > knee, knee + span * np.tanh((r - knee) / span), r)
    return shoulder + d * (r_limited / np.maximum(r, 1e-12))


def _palm_frame(
    reach: FloatArray, pitch: FloatArray, roll: FloatArray, side: float, yaw_in: float
) -> FloatArray:
    """Palm axes (fwd, thumb, back) as rows, world frame, `(N, 3, 3)`.

    `fwd` points along the horizontal part of `reach` (shoulder to wrist) turned inwards by `yaw_in`
    (towards the other hand; `side` is -1 for the left hand, +1 for the right), pitched down by `pitch`;
    `back` starts vertical and the palm is rolled about `fwd` by `roll` (thumb up for positive roll).
    """
    heading = np.arctan2(reach[:, 1], reach[:, 0]) + side * yaw_in
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
