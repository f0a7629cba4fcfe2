"""Ground truth for retargeting: robot-made joint trajectories and synthetic human hands that follow them.

A hand placed by `keypoints_at_wrists` on ``world_from_wrist_for_targets`` of a robot's own tool poses
(`pose_core.retarget.arm`) is reachable by construction, so retargeting errors are measured against
known joints and tool poses (tests and `bench/retarget.py`).
"""

from __future__ import annotations

import numpy as np

from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.wrist import keypoints_in_wrist, wrist_from_keypoints
from pose_core.synth.hands import HandOptions, make_hand_motion
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

__all__ = ["FPS", "hand_in_wrist", "joint_trajectory", "keypoints_at_wrists", "tcp_poses"]

#: Frame rate of the trajectories, Hz.
FPS = 30.0
_THUMB_TIP, _INDEX_TIP = 4, 8


def joint_trajectory(emb: Embodiment, frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth joints within limits, at most 60 % of the speed limits: ``(ts (F,), q (F, J))``.

    Amplitudes stay below 0.45 rad around home, which keeps the xArm7 wrist (joint6 = 0) and the
    Panda wrist out of their singularities: a path through one is tested separately.
    """
    rng = np.random.default_rng(seed)
    ts = np.arange(frames) / FPS
    room = np.minimum(emb.upper - emb.home, emb.home - emb.lower)
    amp = np.minimum(0.45, 0.45 * room)
    freq = rng.uniform(0.1, 0.5, emb.model.num_joints)
    freq = np.minimum(freq, 0.6 * emb.velocity / (2 * np.pi * np.maximum(amp, 1e-9)))
    phase = rng.uniform(0, 2 * np.pi, emb.model.num_joints)
    q = emb.home + amp * (np.sin(2 * np.pi * freq * ts[:, None] + phase) - np.sin(phase))
    return ts, q


def tcp_poses(emb: Embodiment, q: np.ndarray) -> np.ndarray:
    """Tool poses ``(F, 4, 4)`` of joints ``(F, J)``, robot base frame."""
    return emb.model.forward(q)[:, 0] @ emb.ee_from_tcp


def hand_in_wrist(is_right: bool, seed: int = 0) -> np.ndarray:
    """One synthetic hand's 21 keypoints in its own wrist frame ``(21, 3)`` (`pose_core.synth.hands`).

    The left hand is the right one mirrored (``y -> -y``), so both have the identity as wrist frame.
    """
    rng = np.random.default_rng(seed)
    head = make_head_trajectory(2.0, TrajectoryOptions(), rng)
    motion = make_hand_motion(2.0, head, SceneOptions(), HandOptions(), rng)
    kp = motion.keypoints_world(np.array([0.5]))[0, 1]
    local = keypoints_in_wrist(kp, wrist_from_keypoints(kp, True))
    return local if is_right else local * np.array([1.0, -1.0, 1.0])


def keypoints_at_wrists(world_from_wrist: np.ndarray, is_right: bool, aperture_m: np.ndarray) -> np.ndarray:
    """World keypoints ``(F, 21, 3)`` of a synthetic hand with wrist frames ``world_from_wrist (F, 4, 4)``.

    The thumb tip slides along the thumb-index line so that the grip aperture is ``aperture_m (F,)``.
    """
    local = np.repeat(hand_in_wrist(is_right)[None], len(world_from_wrist), 0)
    index = local[:, _INDEX_TIP]
    direction = local[:, _THUMB_TIP] - index
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    local[:, _THUMB_TIP] = index + aperture_m[:, None] * direction
    rot, origin = world_from_wrist[:, :3, :3], world_from_wrist[:, :3, 3]
    return np.einsum("fij,fkj->fki", rot, local) + origin[:, None]
