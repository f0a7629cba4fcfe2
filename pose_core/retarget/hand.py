"""Dexterous hands (Allegro) by keypoint-vector retargeting.

Convention:
    Input keypoints are MediaPipe landmarks in the human wrist frame (`pose_core.retarget.wrist`),
    metres, ``(F, 21, 3)``. Each profile vector ``i`` asks the robot vector ``p_task - p_origin``
    (hand base frame) to equal ``keypoint_scale * hand_from_wrist @ (k_task - k_origin)``. The fit is
    weighted least squares over all vectors, solved per frame by the bounded DLS step of
    `pose_core.retarget.ik` (damping = smoothness towards the previous frame), in warm-started chunks
    with exact joint and speed limits (`pose_core.retarget.arm.solve_in_chunks`). Errors are reported in
    robot metres, the size the robot hand reproduces.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import EgolakeError, ShapeError
from pose_core.retarget.arm import solve_in_chunks
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.ik import IKOptions, bounded_dls_step

__all__ = ["HandRetargetOptions", "HandRetargetResult", "hand_vectors", "retarget_hand_keypoints"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class HandRetargetOptions:
    """Knobs of keypoint-vector retargeting."""

    # DLS solver; the position damping (metres) also acts as smoothness towards the previous frame.
    ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=30, position_damping_m=2e-3,
                                                            position_tol_m=2e-4))
    # Frames solved together per batched call.
    chunk_frames: int = 32
    # The first frame gets this many times the iterations (cold start from home).
    first_frame_iters_factor: int = 4


@dataclass(frozen=True)
class HandRetargetResult:
    """Joint trajectory of a dexterous hand.

    Attributes:
        joint_names: the hand's joints ``(J,)``.
        joint_positions: joints per frame, radians, ``(F, J)``, within limits and speed limits.
        target_vectors: wanted robot vectors, hand base frame, metres, ``(F, V, 3)`` (NaN: no hand).
        robot_vectors: vectors the joints give, ``(F, V, 3)``.
        vector_error_m: mean vector error per frame, metres, ``(F,)`` (NaN where no hand).
        valid: frames that had keypoints, ``(F,)``.
    """

    joint_names: tuple[str, ...]
    joint_positions: FloatArray
    target_vectors: FloatArray
    robot_vectors: FloatArray
    vector_error_m: FloatArray
    valid: BoolArray


def hand_vectors(emb: Embodiment, q: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Robot keypoint vectors and their Jacobians.

    Args:
        emb: a ``hand`` embodiment.
        q: joints, radians, ``(B, J)``.

    Returns:
        Vectors ``(B, V, 3)`` metres, base frame, and Jacobians ``(B, V, 3, J)``.
    """
    poses, jacs = emb.model.forward_with_jacobians(q)
    index = {name: i for i, name in enumerate(emb.model.frames)}
    origin = [index[v.origin_link] for v in emb.vectors]
    task = [index[v.task_link] for v in emb.vectors]
    vectors = poses[:, task][..., :3, 3] - poses[:, origin][..., :3, 3]
    return vectors, jacs[:, task, :3] - jacs[:, origin, :3]


def _targets(emb: Embodiment, keypoints_in_wrist: FloatArray) -> FloatArray:
    origin = [v.origin_keypoint for v in emb.vectors]
    task = [v.task_keypoint for v in emb.vectors]
    human = keypoints_in_wrist[:, task] - keypoints_in_wrist[:, origin]
    return emb.keypoint_scale * np.einsum("ij,fvj->fvi", emb.hand_from_wrist[:3, :3], human)


def _solve(emb: Embodiment, targets: FloatArray, seeds: FloatArray, bounds: tuple[FloatArray, FloatArray],
           opts: IKOptions) -> FloatArray:
    """Batched vector fit: joints ``(N, J)`` for targets ``(N, V, 3)``."""
    weights = np.sqrt(np.repeat([v.weight for v in emb.vectors], 3))
    q = np.clip(seeds, *bounds)
    for _ in range(opts.max_iters):
        vectors, jacs = hand_vectors(emb, q)
        err = (targets - vectors).reshape(len(q), -1) * weights
        jac = jacs.reshape(len(q), -1, q.shape[1]) * weights[:, None]
        dq = bounded_dls_step(jac, err, None, None, q, bounds, opts)
        q = np.clip(q + dq, *bounds)  # exactly inside: q + (clip(q + dq) - q) may round past a bound
        if np.max(np.abs(dq)) < opts.step_tol:
            break
    return q


def retarget_hand_keypoints(
    emb: Embodiment,
    keypoints_in_wrist: FloatArray,
    ts_s: FloatArray,
    opts: HandRetargetOptions,
) -> HandRetargetResult:
    """Retarget one human hand's keypoints to a dexterous robot hand.

    Args:
        emb: a ``hand`` embodiment.
        keypoints_in_wrist: MediaPipe keypoints in the wrist frame, metres, ``(F, 21, 3)``; NaN rows for
            frames without a hand (joints interpolated across the gap).
        ts_s: strictly increasing timestamps, seconds, ``(F,)``.
        opts: solver knobs.

    Returns:
        The joint trajectory and its vector errors.

    Raises:
        ShapeError: on mismatched shapes.
        EgolakeError: if the embodiment is not a hand, or ``ts_s`` is empty or not increasing.
    """
    kp = np.asarray(keypoints_in_wrist, np.float64)
    ts_s = np.asarray(ts_s, np.float64)
    frames = len(ts_s)
    if kp.shape != (frames, 21, 3):
        raise ShapeError("keypoints_in_wrist", kp.shape, f"({frames}, 21, 3)")
    if emb.kind != "hand":
        raise EgolakeError(f"embodiment {emb.name!r} is a {emb.kind}, not a hand")
    if frames == 0 or not np.all(np.diff(ts_s) > 0):
        raise EgolakeError("hand retargeting needs at least one frame and strictly increasing ts_s")
    targets = _targets(emb, kp)
    valid = np.all(np.isfinite(targets.reshape(frames, -1)), axis=1)
    if not np.any(valid):
        q = np.repeat(emb.home[None], frames, 0)
    else:
        first = int(np.argmax(valid))
        one = (emb.lower[None], emb.upper[None])
        q_first = _solve(emb, targets[first][None], emb.home[None], one,
                         replace(opts.ik, max_iters=opts.first_frame_iters_factor * opts.ik.max_iters))[0]

        def solve(idx: IntArray, seeds: FloatArray,
                  bounds: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, BoolArray]:
            # A least-squares fit has no pass/fail: every frame counts as converged.
            return _solve(emb, targets[idx], seeds, bounds, opts.ik), np.ones(len(idx), dtype=bool)

        # A least-squares fit: a frame that leaves its speed box is clipped by the final pass, not solved
        # again (re-solving measured 4x the time for no better fit on the synthetic wearer).
        q = solve_in_chunks(solve, q_first, first, valid, ts_s, emb, opts.chunk_frames, repair_jumps=False)
    robot, _ = hand_vectors(emb, q)
    error = np.linalg.norm(robot - targets, axis=-1).mean(axis=1)
    logger.debug("%s: %d frames, mean vector error %.4f m", emb.name, frames, float(np.nanmean(error)))
    return HandRetargetResult(emb.model.joint_names, q, targets, robot, error, valid)

