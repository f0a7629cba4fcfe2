"""Wrist trajectory -> robot arm joint trajectory: target mapping, chunked batched IK, limits, flags.

Convention:
    ``base_from_tcp_target = S(base_from_world @ world_from_wrist) @ wrist_from_tcp`` where ``S`` scales
    the position about the profile's workspace centre (`pose_core.retarget.embodiment`). IK controls
    the tool frame ``ee_link @ ee_from_tcp`` (the position task holds the tool point, also on a 5-DoF
    arm whose tool orientation falls short).

Algorithm:
    The first valid frame is solved from the home pose; if that fails, from it, home and ``restarts``
    random seeds at once, keeping the solution within reach nearest to home (else the best). Later
    frames are solved in chunks of ``chunk_frames``: every frame of a chunk starts from the last solved
    frame and is bounded by the joint limits and by the velocity box ``q_last +- v_max * (t - t_last)``,
    all in one batched DLS call; a frame that does not converge, or that lies outside the speed box of
    the frame before it (batched rows can settle on different null-space configurations), is solved
    again from the frame before it, with a null-space posture task towards the home pose that moves a
    stretched-out (singular) arm back into its workspace. A frame still out of reach ("stuck": against
    a joint limit, or on a branch that cannot follow) searches a solution from anywhere, nearest to its
    current joints, every ``search_interval_s``, and moves towards it: with the tool point held on
    target (the position task, the search's solution pulling in its null space) when only the
    orientation is out of reach, straight at the speed limits when the position is lost too. A
    sequential pass then clips each frame to ``q_prev +- v_max * dt`` (a no-op when the chunk's
    solutions are continuous), so joint limits and speed limits hold exactly. Frames whose
    target is NaN (no hand) are bridged by linear interpolation (`rate_limit`). Frames whose final
    tool pose misses the target by more than the profile's reach tolerances, or that have no target,
    are flagged ``reachable = False``: joints there are a bounded, continuous best effort, never a
    silent fit.
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
from pose_core.retarget.ik import IKOptions, IKSolution, pose_errors, solve_pose_ik

__all__ = [
    "RetargetOptions",
    "RetargetResult",
    "base_from_tcp_targets",
    "false_runs",
    "rate_limit",
    "retarget_wrist_trajectory",
    "solve_in_chunks",
    "world_from_base_at_wrists",
    "world_from_level",
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
    # Solver for the first valid frame and a stuck arm's search (from home or the current joints, then
    # from random seeds if that fails).
    first_frame_ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=100))
    # Random seeds of a search from anywhere (first frame, stuck arm) when the first start does not converge.
    restarts: int = 31
    # Frames solved together in one batched call from the last solved frame (longer chunks drift apart
    # in the null space of 7-DoF arms).
    chunk_frames: int = 8
    # A stuck frame (out of reach from the previous joints) searches a solution from anywhere and the
    # arm heads for it while stuck; the next search waits this long, seconds (a search costs `restarts`
    # solves, and an out-of-reach stretch would search at every frame).
    search_interval_s: float = 0.25
    # A stuck arm whose tool point is on target (only the orientation is out of reach) moves towards the
    # searched solution at this fraction of its speed limits; the rest of the speed box is left to the
    # position task, which holds the tool point on target meanwhile.
    reconfigure_speed_fraction: float = 0.5
    # Seed of the random restarts (results are deterministic for a given seed).
    random_seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.reconfigure_speed_fraction <= 1.0:
            raise ValueError("retarget.arm.reconfigure_speed_fraction must be in (0, 1], "
                             f"got {self.reconfigure_speed_fraction}")


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


def world_from_level(gravity_dir_world: FloatArray) -> FloatArray:
    """A z-up frame in a world where gravity points along ``gravity_dir_world``.

    ``z = -g``; ``y`` is the world's ``z`` axis (the first camera's forward, DESIGN.md's world) made
    horizontal, or its ``x`` axis when that is vertical; ``x = y × z``. A profile's base rotation,
    written for a z-up world facing ``+y``, composes on the right.

    Args:
        gravity_dir_world: gravity (down) in the world frame, ``(3,)``, any length > 0.

    Returns:
        ``world_from_level`` rotation, ``(3, 3)``.
    """
    z = -np.asarray(gravity_dir_world, np.float64)
    z /= np.linalg.norm(z)
    forward = np.eye(3)[2] if abs(z[2]) < 0.99 else np.eye(3)[0]
    y = forward - (forward @ z) * z
    y /= np.linalg.norm(y)
    return np.column_stack([np.cross(y, z), y, z])


def world_from_base_at_wrists(emb: Embodiment, world_from_wrist: FloatArray,
                              gravity_dir_world: FloatArray | None = None) -> FloatArray:
    """A base pose that puts a trajectory's median wrist position on the workspace centre.

    For worlds where the profile's fixed base pose means nothing (the first camera's frame, an
    arbitrary scale). The rotation is the profile's ``world_from_base`` rotation, after
    `world_from_level` when gravity is given (base upright); the position is chosen so that
    ``median(base_from_world @ wrist positions) = workspace_center_in_base_m`` (per base axis; the
    scaling centre, which scaling leaves in place).

    Args:
        emb: an ``arm`` embodiment.
        world_from_wrist: wrist poses, world frame, ``(F, 4, 4)``; NaN rows are ignored.
        gravity_dir_world: gravity (down) in the world, ``(3,)``, or None for the profile's rotation.

    Returns:
        ``world_from_base (4, 4)``; the profile's position when no wrist pose is finite.
    """
    positions = world_from_wrist[:, :3, 3]
    positions = positions[np.all(np.isfinite(positions), axis=1)]
    out = emb.world_from_base.copy()
    if gravity_dir_world is not None:
        out[:3, :3] = world_from_level(gravity_dir_world) @ out[:3, :3]
    if len(positions):
        # The median along the base's axes: unlike one along the world's, it turns with the world.
        median_in_base_axes = np.median(positions @ out[:3, :3], axis=0)
        out[:3, 3] = out[:3, :3] @ (median_in_base_axes - emb.workspace_center_in_base_m)
    return out


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
    """Clip each frame to within ``max_rate * dt`` of the previous output, across gaps too.

    Frames with a NaN are gaps: the limit applies between consecutive finite frames over the time
    between them, and gap frames are then filled by linear interpolation (before the first and after
    the last finite frame: that frame's value). Interpolating a step of at most ``max_rate * dt`` over
    ``dt`` keeps every frame-to-frame step within the limit, so a trajectory that re-finds its target
    after a gap does not have to catch up at one frame's speed.

    Args:
        values: per-frame values ``(F, D)``.
        ts_s: strictly increasing times, seconds, ``(F,)``.
        max_rate: largest speed per dimension, units/s, scalar or ``(D,)``.
        bounds: optional ``(lower, upper)`` ``(D,)`` applied after the rate clip.

    Returns:
        The limited values ``(F, D)``; all NaN when no frame is finite.
    """
    out = np.array(values, dtype=np.float64)
    finite = np.flatnonzero(np.all(np.isfinite(out), axis=1))
    if len(finite) == 0:
        return out
    dts = np.diff(ts_s[finite])
    for k in range(1, len(finite)):
        prev = out[finite[k - 1]]
        step = max_rate * dts[k - 1]
        row = np.clip(out[finite[k]], prev - step, prev + step)
        out[finite[k]] = row if bounds is None else np.clip(row, *bounds)
    if len(finite) < len(out):
        out = np.stack([np.interp(ts_s, ts_s[finite], out[finite, d]) for d in range(out.shape[1])], axis=1)
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


def _solved(emb: Embodiment, sol: IKSolution, ik: IKOptions) -> BoolArray:
    """Rows within the solver's tolerances; orientation counts only where the profile checks it (5-DoF)."""
    done = sol.position_error_m < ik.position_tol_m
    if emb.reach_orientation_tol_rad is not None:
        done &= sol.orientation_error_rad < ik.orientation_tol_rad
    return done


def _within_reach(emb: Embodiment, position_error_m: FloatArray,
                  orientation_error_rad: FloatArray) -> BoolArray:
    """Rows within the profile's reach tolerances (the ``reachable`` flag)."""
    ok = position_error_m <= emb.reach_position_tol_m
    if emb.reach_orientation_tol_rad is not None:
        ok &= orientation_error_rad <= emb.reach_orientation_tol_rad
    return ok


def _solve_anywhere(emb: Embodiment, tcp_target: FloatArray, opts: RetargetOptions,
                    near: FloatArray) -> tuple[FloatArray, bool]:
    """Joints ``(J,)`` for one target ``(4, 4)`` within the joint limits only, and whether they reach it.

    From ``near`` (joints ``(J,)``: home for the first frame, the current joints for a stuck arm) if that is
    solved; else ``near``, home and ``restarts`` random seeds at once: of the solutions within reach the
    one nearest to ``near`` (a short way to go), else the best one.
    """
    one = (emb.lower[None], emb.upper[None])
    sol = solve_pose_ik(emb.model, 0, tcp_target[None], near[None], one, opts.first_frame_ik, emb.home,
                        emb.ee_from_tcp)
    if _solved(emb, sol, opts.first_frame_ik)[0]:
        return sol.joint_positions[0], True
    rng = np.random.default_rng(opts.random_seed)
    lo, hi = np.maximum(emb.lower, -np.pi), np.minimum(emb.upper, np.pi)
    seeds = np.vstack([sol.joint_positions, emb.home[None],
                       rng.uniform(lo, hi, (opts.restarts, emb.model.num_joints))])
    bounds = (np.broadcast_to(emb.lower, seeds.shape), np.broadcast_to(emb.upper, seeds.shape))
    sol = solve_pose_ik(emb.model, 0, np.broadcast_to(tcp_target, (len(seeds), 4, 4)), seeds, bounds,
                        opts.first_frame_ik, emb.home, emb.ee_from_tcp)
    reached = _within_reach(emb, sol.position_error_m, sol.orientation_error_rad)
    if np.any(reached):
        pick = int(np.argmin(np.where(reached, np.linalg.norm(sol.joint_positions - near, axis=1), np.inf)))
    else:
        pick = int(np.argmin(sol.position_error_m + emb.reach_position_tol_m * sol.orientation_error_rad))
    return sol.joint_positions[pick], bool(reached[pick])


def solve_in_chunks(  # noqa: PLR0913 - the solver, its start and the limits
    solve_batch: Callable[[IntArray, FloatArray, tuple[FloatArray, FloatArray]],
                          tuple[FloatArray, BoolArray]],
    q_first: FloatArray,
    first: int,
    valid: BoolArray,
    ts_s: FloatArray,
    emb: Embodiment,
    chunk_frames: int,
    repair_jumps: bool = True,
) -> FloatArray:
    """Warm-started chunks of batched solves, then exact joint and speed limits (see the module's Algorithm).

    Args:
        solve_batch: ``(frame indices (N,), seeds (N, J), (lower, upper) each (N, J))
            -> (joints (N, J), converged (N,))``; frames that did not converge are solved again one by
            one, seeded from the frame before them and bounded by its velocity box.
        q_first: joints of frame ``first``, ``(J,)``.
        first: first valid frame; earlier frames copy ``q_first``.
        valid: frames that have a target, ``(F,)``; others are interpolated (`rate_limit`).
        ts_s: strictly increasing times, seconds, ``(F,)``.
        emb: limits and speed limits.
        chunk_frames: frames per batched solve.
        repair_jumps: also solve again, one by one, the frames that left the speed box of the frame before
            them (else the final pass clips them).

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
            for k in range(len(idx)):
                i, prev = idx[k], idx[k - 1] if k else last  # the frame before it that has a target
                step = emb.velocity * (ts_s[i] - ts_s[prev])
                jumped = repair_jumps and np.any(np.abs(q[i] - q[prev]) > step * (1.0 + 1e-9))
                if converged[k] and not jumped:
                    continue
                box = (np.maximum(emb.lower, q[prev] - step)[None],
                       np.minimum(emb.upper, q[prev] + step)[None])
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
        grip_aperture_m: thumb-to-index aperture, metres, ``(F,)`` (NaN: bridged like the joints).
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
    valid = np.all(np.isfinite(tcp_targets.reshape(frames, -1)), axis=1)
    if not np.any(valid):
        q = np.repeat(emb.home[None], frames, 0)
    else:
        first = int(np.argmax(valid))
        next_search_s = -np.inf
        goal: FloatArray | None = None  # where a stuck arm is heading (the last search's solution)

        def solve(idx: IntArray, seeds: FloatArray,
                  bounds: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, BoolArray]:
            # The posture task only in single-frame repairs: rows of a batch stop at different
            # iterations, and an unequal pull towards home would make consecutive frames jitter.
            posture = emb.home if len(idx) == 1 else None
            sol = solve_pose_ik(emb.model, 0, tcp_targets[idx], seeds, bounds, opts.ik, posture,
                                emb.ee_from_tcp)
            nonlocal next_search_s, goal
            stuck = len(idx) == 1 and not _within_reach(emb, sol.position_error_m,
                                                        sol.orientation_error_rad)[0]
            if stuck and ts_s[idx[0]] >= next_search_s:
                # Against a joint limit, or on a branch that lost the target: if the target has a
                # solution from anywhere, move towards the nearest one (flagged until it is reached) until
                # the next search is due.
                found, reached = _solve_anywhere(emb, tcp_targets[idx[0]], opts, seeds[0])
                goal = found if reached else None
                next_search_s = ts_s[idx[0]] + opts.search_interval_s
            if stuck and goal is not None:
                if sol.position_error_m[0] > emb.reach_position_tol_m:
                    # The tool point is lost too (a local minimum): straight to the goal at the speed limits.
                    return np.clip(goal, *bounds).reshape(1, -1), np.zeros(1, dtype=bool)
                # Only the orientation is out of reach: reconfigure at a fraction of the speed box, the
                # rest keeping the tool point on target.
                stride = opts.reconfigure_speed_fraction * 0.5 * (bounds[1] - bounds[0])
                toward = seeds + np.clip(goal - seeds, -stride, stride)
                moved = solve_pose_ik(emb.model, 0, tcp_targets[idx], seeds, bounds, opts.ik, None,
                                      emb.ee_from_tcp, toward=toward)
                return moved.joint_positions, np.zeros(1, dtype=bool)
            if not stuck:
                goal = None
            return sol.joint_positions, _solved(emb, sol, opts.ik)

        q_first = _solve_anywhere(emb, tcp_targets[first], opts, emb.home)[0]
        q = solve_in_chunks(solve, q_first, first, valid, ts_s, emb, opts.chunk_frames)
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
