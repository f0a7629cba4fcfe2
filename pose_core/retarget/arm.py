"""Wrist trajectory -> robot arm joint trajectory: target mapping, chunked batched IK, limits, flags.

Convention:
    ``base_from_tcp_target = S(base_from_world @ world_from_wrist) @ wrist_from_tcp`` where ``S`` scales
    the position about the profile's workspace centre (`pose_core.retarget.embodiment`). IK controls
    ``ee_link`` at ``base_from_tcp_target @ tcp_from_ee``.

Algorithm:
    The first valid frame is solved from the home pose; if that fails, from it and ``restarts`` random
    seeds at once, keeping the best (ties: closest to home). Later frames are solved in chunks of ``chunk_frames``: every
    frame of a chunk starts from the last solved frame and is bounded by the joint limits and by the
    velocity box ``q_last +- v_max * (t - t_last)``, all in one batched DLS call; a frame that does not
    converge is solved again from the frame before it, with a null-space posture task towards the home
    pose that moves a stretched-out (singular) arm back into its workspace. A sequential pass then
    clips each frame to ``q_prev +- v_max * dt`` (a no-op when the chunk's solutions are continuous),
    so joint limits and speed limits hold exactly. Frames whose final tool pose misses the target by
    more than the profile's reach tolerances, or whose target is NaN (joints held), are flagged
    ``reachable = False``: joints there are a bounded, continuous best effort, never a silent fit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import EgolakeError, ShapeError
from pose_core.geometry.rigid3 import invert_rigid_matrices
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.ik import IKOptions, pose_errors, solve_pose_ik

__all__ = [
    "RetargetOptions",
    "RetargetResult",
    "base_from_tcp_targets",
    "false_runs",
    "rate_limit",
    "retarget_wrist_trajectory",
    "solve_in_chunks",
    "world_from_wrist_for_targets",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class RetargetOptions:
    """Knobs of arm retargeting."""

    # Solver for every frame after the first (warm-started from the previous chunk).
    ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=40))
    # Solver for the first valid frame (cold start from home, then from random seeds if that fails).
    first_frame_ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=100))
    # Random seeds for the first frame when the home start does not converge.
    restarts: int = 31
    # Frames solved together in one batched call from the last solved frame (longer chunks drift apart in the null space of 7-DoF arms).
    chunk_frames: int = 8
    # Seed of the random restarts (results are deterministic for a given seed).
    random_seed: int = 0


@dataclass(frozen=True)
class RetargetResult:
    """Joint trajectory of one arm for one hand's wrist trajectory.

    Attributes:
        joint_names: names of the action joints ``(J,)``.
        joint_positions: joints per frame, rad or m, ``(F, J)``, within limits and speed limits.
        gripper: gripper command per frame ``(F,)`` (NaN when the profile has no gripper).
        base_from_tcp_target: wanted tool poses, robot base frame, ``(F, 4, 4)`` (NaN where no target).
        base_from_tcp: tool poses the joints reach, ``(F, 4, 4)``.
        ee_error_m: tool position error, metres, ``(F,)`` (NaN where no target).
        ee_error_rad: tool rotation error (geodesic), radians, ``(F,)`` (NaN where no target).
        reachable: frames within the profile's reach tolerances, ``(F,)``.
        limit_violations: joint values outside the limits (counted; 0 by construction).
        velocity_violations: joint steps faster than the speed limits (counted; 0 by construction).
    """

    joint_names: tuple[str, ...]
    joint_positions: FloatArray
    gripper: FloatArray
    base_from_tcp_target: FloatArray
    base_from_tcp: FloatArray
    ee_error_m: FloatArray
    ee_error_rad: FloatArray
    reachable: BoolArray
    limit_violations: int
    velocity_violations: int


def base_from_tcp_targets(emb: Embodiment, world_from_wrist: FloatArray,
                          world_from_base: FloatArray | None = None) -> FloatArray:
    """Tool targets in the robot base frame from human wrist poses.

    Args:
        emb: the embodiment.
        world_from_wrist: human wrist poses, world frame, metres, ``(F, 4, 4)``.
        world_from_base: robot base pose in the world, ``(4, 4)``; default the profile's.

    Returns:
        ``base_from_tcp_target (F, 4, 4)``.
    """
    world_from_base = emb.world_from_base if world_from_base is None else world_from_base
    base_from_wrist = invert_rigid_matrices(world_from_base) @ world_from_wrist
    c = emb.workspace_center_in_base_m
    base_from_wrist[..., :3, 3] = c + emb.workspace_scale * (base_from_wrist[..., :3, 3] - c)
    return base_from_wrist @ invert_rigid_matrices(emb.tcp_from_wrist)


def world_from_wrist_for_targets(emb: Embodiment, base_from_tcp: FloatArray,
                                 world_from_base: FloatArray | None = None) -> FloatArray:
    """Inverse of `base_from_tcp_targets`: the human wrist poses that map to given tool poses.

    Args:
        emb: the embodiment.
        base_from_tcp: tool poses, base frame, ``(F, 4, 4)``.
        world_from_base: robot base pose in the world, ``(4, 4)``; default the profile's.

    Returns:
        ``world_from_wrist (F, 4, 4)``.
    """
    world_from_base = emb.world_from_base if world_from_base is None else world_from_base
    base_from_wrist = base_from_tcp @ emb.tcp_from_wrist
    c = emb.workspace_center_in_base_m
    base_from_wrist[..., :3, 3] = c + (base_from_wrist[..., :3, 3] - c) / emb.workspace_scale
    return world_from_base @ base_from_wrist


def rate_limit(values: FloatArray, ts_s: FloatArray, max_rate: FloatArray | float,
               bounds: tuple[FloatArray, FloatArray] | None = None) -> FloatArray:
    """Clip each frame to within ``max_rate * dt`` of the previous output; NaN frames hold the previous value.

    Args:
        values: per-frame values ``(F, D)``; row 0 must be finite unless all are NaN.
        ts_s: strictly increasing times, seconds, ``(F,)``.
        max_rate: largest speed per dimension, units/s, scalar or ``(D,)``.
        bounds: optional ``(lower, upper)`` ``(D,)`` applied after the rate clip.

    Returns:
        The limited values ``(F, D)``.
    """
    out = np.array(values, dtype=np.float64)
    dts = np.diff(ts_s)
    for i in range(1, len(out)):
        prev = out[i - 1]
        row = np.where(np.isfinite(out[i]), out[i], prev)
        step = max_rate * dts[i - 1]
        row = np.clip(row, prev - step, prev + step)
        out[i] = row if bounds is None else np.clip(row, *bounds)
    return out


def false_runs(mask: BoolArray) -> list[tuple[int, int]]:
    """Half-open ``[start, stop)`` index ranges where ``mask`` is False (e.g. unreachable stretches)."""
    padded = np.concatenate([[True], np.asarray(mask, bool), [True]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _check(world_from_wrist: FloatArray, grip_aperture_m: FloatArray, ts_s: FloatArray) -> None:
    frames = len(ts_s)
    if world_from_wrist.shape != (frames, 4, 4):
        raise ShapeError("world_from_wrist", world_from_wrist.shape, f"({frames}, 4, 4)")
    if grip_aperture_m.shape != (frames,):
        raise ShapeError("grip_aperture_m", grip_aperture_m.shape, f"({frames},)")
    if frames == 0 or not np.all(np.diff(ts_s) > 0):
        raise EgolakeError("retargeting needs at least one frame and strictly increasing ts_s")


def _first_frame(emb: Embodiment, ee_target: FloatArray, opts: RetargetOptions) -> FloatArray:
    """Joints ``(J,)`` for one target ``(4, 4)``: from home if that converges, else the best random seed."""
    one = (emb.lower[None], emb.upper[None])
    sol = solve_pose_ik(emb.model, 0, ee_target[None], emb.home[None], one, opts.first_frame_ik, emb.home)
    if sol.converged[0]:
        return sol.joint_positions[0]
    rng = np.random.default_rng(opts.random_seed)
    lo, hi = np.maximum(emb.lower, -np.pi), np.minimum(emb.upper, np.pi)
    seeds = np.vstack([sol.joint_positions, rng.uniform(lo, hi, (opts.restarts, emb.model.num_joints))])
    bounds = (np.broadcast_to(emb.lower, seeds.shape), np.broadcast_to(emb.upper, seeds.shape))
    sol = solve_pose_ik(emb.model, 0, np.broadcast_to(ee_target, (len(seeds), 4, 4)), seeds, bounds,
                        opts.first_frame_ik, emb.home)
    score = sol.position_error_m + emb.reach_position_tol_m * sol.orientation_error_rad
    best = score <= score.min() + opts.first_frame_ik.position_tol_m
    dist = np.where(best, np.linalg.norm(sol.joint_positions - emb.home, axis=1), np.inf)
    return sol.joint_positions[int(np.argmin(dist))]


def solve_in_chunks(  # noqa: PLR0913 - the solver, its start and the limits
    solve_batch: Callable[[IntArray, FloatArray, tuple[FloatArray, FloatArray]], tuple[FloatArray, BoolArray]],
    q_first: FloatArray,
    first: int,
    valid: BoolArray,
    ts_s: FloatArray,
    emb: Embodiment,
    chunk_frames: int,
) -> FloatArray:
    """Warm-started chunks of batched solves, then exact joint and speed limits (see the module's Algorithm).

    Args:
        solve_batch: ``(frame indices (N,), seeds (N, J), (lower, upper) each (N, J))
            -> (joints (N, J), converged (N,))``; frames that did not converge are solved again one by
            one, seeded from the frame before them and bounded by its velocity box.
        q_first: joints of frame ``first``, ``(J,)``.
        first: first valid frame; earlier frames copy ``q_first``.
        valid: frames that have a target, ``(F,)``; others hold the previous joints.
        ts_s: strictly increasing times, seconds, ``(F,)``.
        emb: limits and speed limits.
        chunk_frames: frames per batched solve.

    Returns:
        Joints ``(F, J)`` within limits, with every step within ``velocity * dt``.
    """
    frames = len(ts_s)
    q = np.full((frames, len(q_first)), np.nan)
    q[: first + 1] = q_first
    last = first
    for start in range(first + 1, frames, chunk_frames):
        idx = np.arange(start, min(start + chunk_frames, frames))
        idx = idx[valid[idx]]
        if len(idx):
            reach = emb.velocity * (ts_s[idx] - ts_s[last])[:, None]
            bounds = (np.maximum(emb.lower, q[last] - reach), np.minimum(emb.upper, q[last] + reach))
            q[idx], converged = solve_batch(idx, np.repeat(q[last][None], len(idx), 0), bounds)
            for i in idx[~converged]:
                prev = i - 1 if i - 1 >= last else last
                step = emb.velocity * (ts_s[i] - ts_s[prev])
                box = (np.maximum(emb.lower, q[prev] - step)[None], np.minimum(emb.upper, q[prev] + step)[None])
                q[i] = solve_batch(np.array([i]), q[prev][None], box)[0][0]
            last = int(idx[-1])
    return rate_limit(q, ts_s, emb.velocity, (emb.lower, emb.upper))


def retarget_wrist_trajectory(  # noqa: PLR0913 - the trajectory, its timing and two frames
    emb: Embodiment,
    world_from_wrist: FloatArray,
    grip_aperture_m: FloatArray,
    ts_s: FloatArray,
    opts: RetargetOptions,
    world_from_base: FloatArray | None = None,
) -> RetargetResult:
    """Retarget one hand's wrist trajectory to an arm.

    Args:
        emb: an ``arm`` embodiment.
        world_from_wrist: wrist poses (`pose_core.retarget.wrist`), world frame, metres, ``(F, 4, 4)``;
            NaN rows for frames without a hand.
        grip_aperture_m: thumb-to-index aperture, metres, ``(F,)`` (NaN: hold the gripper).
        ts_s: strictly increasing timestamps, seconds, ``(F,)``.
        opts: solver knobs.
        world_from_base: per-episode robot base pose in the world ``(4, 4)``; default the profile's.

    Returns:
        The joint trajectory, gripper commands, errors and reachability flags.

    Raises:
        ShapeError: on mismatched shapes.
        EgolakeError: if the embodiment is not an arm, there are no frames or ``ts_s`` is not increasing.
    """
    world_from_wrist = np.asarray(world_from_wrist, np.float64)
    grip_aperture_m = np.asarray(grip_aperture_m, np.float64)
    ts_s = np.asarray(ts_s, np.float64)
    _check(world_from_wrist, grip_aperture_m, ts_s)
    if emb.kind != "arm":
        raise EgolakeError(f"embodiment {emb.name!r} is a {emb.kind}, not an arm")
    frames = len(ts_s)
    tcp_targets = base_from_tcp_targets(emb, world_from_wrist, world_from_base)
    ee_targets = tcp_targets @ invert_rigid_matrices(emb.ee_from_tcp)
    valid = np.all(np.isfinite(ee_targets.reshape(frames, -1)), axis=1)
    if not np.any(valid):
        q = np.repeat(emb.home[None], frames, 0)
    else:
        first = int(np.argmax(valid))

        def solve(idx: IntArray, seeds: FloatArray,
                  bounds: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, BoolArray]:
            # The posture task only in single-frame repairs: rows of a batch stop at different
            # iterations, and an unequal pull towards home would make consecutive frames jitter.
            posture = emb.home if len(idx) == 1 else None
            sol = solve_pose_ik(emb.model, 0, ee_targets[idx], seeds, bounds, opts.ik, posture)
            return sol.joint_positions, sol.converged

        q = solve_in_chunks(solve, _first_frame(emb, ee_targets[first], opts), first, valid, ts_s, emb,
                            opts.chunk_frames)
    base_from_tcp = emb.model.forward(q)[:, 0] @ emb.ee_from_tcp
    e_p, e_r = pose_errors(base_from_tcp, tcp_targets)
    err_m, err_rad = np.linalg.norm(e_p, axis=1), np.linalg.norm(e_r, axis=1)
    reachable = valid & (err_m <= emb.reach_position_tol_m)
    if emb.reach_orientation_tol_rad is not None:
        reachable &= err_rad <= emb.reach_orientation_tol_rad
    gripper = np.full(frames, np.nan)
    if emb.gripper is not None:
        command = emb.gripper.command(grip_aperture_m)
        finite = np.flatnonzero(np.isfinite(command))
        command[: finite[0] if len(finite) else frames] = emb.gripper.open
        gripper = rate_limit(command[:, None], ts_s, emb.gripper.velocity)[:, 0]
    tol = 1e-9
    limit_violations = int(np.sum((q < emb.lower - tol) | (q > emb.upper + tol)))
    speeds = np.abs(np.diff(q, axis=0)) / np.diff(ts_s)[:, None]
    velocity_violations = int(np.sum(speeds > emb.velocity * (1.0 + 1e-6) + tol))
    logger.debug("%s: %d frames, %d unreachable", emb.name, frames, int(np.sum(~reachable)))
    return RetargetResult(emb.model.joint_names, q, gripper, tcp_targets, base_from_tcp, err_m, err_rad,
                          reachable, limit_violations, velocity_violations)
