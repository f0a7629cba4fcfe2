"""Wrist trajectory -> robot arm joint trajectory: smoothed targets, chunked batched IK, limits, flags.

Convention:
    ``base_from_tcp_target = S(base_from_world @ world_from_wrist) @ wrist_from_tcp`` where ``S`` scales
    the position about the profile's workspace centre (`pose_core.retarget.placement`). IK controls
    the tool frame ``ee_link @ ee_from_tcp`` (the position task holds the tool point, also on a 5-DoF
    arm whose tool orientation falls short). The orientation task and its errors are the profile's
    (`pose_core.retarget.orientation`): what of the hand's orientation the tool keeps.

Algorithm:
    The targets are smoothed run by run (`pose_core.retarget.smoothing.smooth_tool_poses`): the arm
    follows the smoothed target, and the reachability flags and ``ee_error_*`` are against it;
    ``target_shift_m`` says how far smoothing moved it from the hand, and ``hand_error_m`` is the
    tool's distance to the hand's own (unsmoothed) target, the error a replay onto the hand sees.
    The arm starts at the first valid step that has a solution within reach (from anywhere; at most
    ``branch_lookahead_s`` after the first valid step, else the first valid step; the valid steps before
    it hold its joints). That step is solved from the home pose and from it, home and ``restarts`` random
    seeds at once; of its distinct solutions within reach (``first_branches``: the solve from home if solved,
    then the others nearest home first), the arm starts on the one that keeps the most steps within reach
    over the next ``branch_lookahead_s`` seconds, each tracked as below (ties: the earlier, so the others
    are tracked only when the first misses a step; none within reach: the best one). Where the hand
    comes back after more than ``restart_gap_s`` unseen, the arm chooses again the same way among the
    continuation from its last joints (first) and the start candidates it can reach in the gap at its
    speed limits: a branch that suited the last run can leave the next one's wrist out of range for
    seconds. Later steps are solved in chunks of ``chunk_frames``: every step of a chunk starts from the
    last solved step and is bounded by the joint limits and by the velocity box
    ``q_last +- v_max * (t - t_last)``, all in one batched DLS call; a step that does not converge, or
    that lies outside the speed box of the step before it (batched rows can settle on different
    null-space configurations), is solved again from the step before it, with a null-space posture task
    towards the home pose that moves a stretched-out (singular) arm back into its workspace. A step
    still out of reach ("stuck": against a joint limit, or on a branch that cannot follow) searches a
    solution from anywhere, nearest to its current joints, every ``search_interval_s``, and moves
    towards it: with the tool point held on target (the position task, the search's solution pulling
    in its null space) when only the orientation is out of reach, straight at the speed limits when
    the position is lost too. Steps whose target is NaN (no hand) are bridged by linear interpolation
    (`rate_limit`). Last, the joints are fitted to that solution within exact joint, speed and
    acceleration limits (`pose_core.retarget.trajectory.fit_trajectory`; steps without a hand
    weigh nothing there). Steps whose final tool pose misses the target by more than the profile's
    tolerances (position, approach, closing), or that have no target, are flagged ``reachable = False``:
    joints there are a bounded, continuous best effort, never a silent fit.
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
from pose_core.retarget.ik import (
    IKOptions,
    IKSolution,
    OrientationTask,
    pose_errors,
    solve_pose_ik,
    tool_pose_and_jacobian,
)
from pose_core.retarget.orientation import axis_errors, kept_targets, task_weights
from pose_core.retarget.placement import PlacementOptions, base_from_tcp_targets
from pose_core.retarget.quality import joint_violations
from pose_core.retarget.smoothing import SmoothingOptions, smooth_tool_poses
from pose_core.retarget.trajectory import Residuals, TrajectoryOptions, fit_trajectory

__all__ = [
    "RetargetOptions",
    "RetargetResult",
    "false_runs",
    "joint_limit_margins",
    "margins_from_home",
    "orientation_task",
    "rate_limit",
    "retarget_wrist_trajectory",
    "smoothed_world_targets",
    "solve_in_chunks",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]

#: ``(step indices (N,), seeds (N, J), (lower, upper) each (N, J)) -> (joints (N, J), converged (N,))``.
BatchSolver = Callable[[IntArray, FloatArray, tuple[FloatArray, FloatArray]], tuple[FloatArray, BoolArray]]

_UNIFORM_STEPS = 1e-6  # relative spread of the step periods accepted as one control rate


@dataclass(frozen=True)
class RetargetOptions:
    """Knobs of arm retargeting."""

    # Solver for every step after the first (warm-started from the previous chunk).
    ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=40))
    # Solver for the first valid step and a stuck arm's search (from home or the current joints, then
    # from random seeds if that fails).
    first_frame_ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=100))
    # Random seeds of a search from anywhere (first step, stuck arm) when the first start does not converge.
    restarts: int = 31
    # Steps solved together in one batched call from the last solved step (longer chunks drift apart
    # in the null space of 7-DoF arms).
    chunk_frames: int = 8
    # A stuck step (out of reach from the previous joints) searches a solution from anywhere and the
    # arm heads for it while stuck; the next search waits this long, seconds (a search costs `restarts`
    # solves, and an out-of-reach stretch would search at every step).
    search_interval_s: float = 0.25
    # A stuck arm whose tool point is on target (only the orientation is out of reach) moves towards the
    # searched solution at this fraction of its speed limits; the rest of the speed box is left to the
    # position task, which holds the tool point on target meanwhile.
    reconfigure_speed_fraction: float = 0.5
    # The first step's branch: of the distinct IK solutions within reach of the first valid step (from
    # home, home again and the random restarts; at most this many), the arm starts on the one that keeps
    # the most steps within reach over the next `branch_lookahead_s` seconds, tracked as the whole
    # trajectory is (ties: the one nearest home). A 7-DoF arm's solution nearest home can be folded
    # against a joint limit that the next steps run into. 1: the solution nearest home, no look-ahead.
    first_branches: int = 4
    branch_lookahead_s: float = 3.0
    # A hand unseen for longer than this, seconds, lets the arm choose its branch again where the hand
    # comes back, as at the first step: the continuation from its last joints first, then the first
    # step's candidates that it can reach within the gap at its speed limits. Following on from the last
    # joints alone kept an arm for seconds on a branch whose wrist ran out of range (hard_14's Panda:
    # 21 of a run's 87 steps reached, all 87 from a fresh start).
    restart_gap_s: float = 1.0
    # Solutions closer than this in every joint (rad or m) are one branch.
    branch_separation: float = 0.5
    # Seed of the random restarts (results are deterministic for a given seed).
    random_seed: int = 0
    # Target smoothing.
    smoothing: SmoothingOptions = field(default_factory=SmoothingOptions)
    # The fit of all steps' joints within joint, speed and acceleration limits.
    trajectory: TrajectoryOptions = field(default_factory=TrajectoryOptions)
    # The per-episode base search (`retarget.base_placement: search`).
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    # Solver of the base search's probes (from the home pose).
    placement_ik: IKOptions = field(default_factory=lambda: IKOptions(max_iters=60))

    def __post_init__(self) -> None:
        if self.first_branches < 1 or self.branch_lookahead_s < 0.0 or self.restart_gap_s <= 0.0:
            raise ValueError("retarget.arm.first_branches must be >= 1, branch_lookahead_s >= 0 and "
                             f"restart_gap_s > 0, got {self.first_branches}, {self.branch_lookahead_s} and "
                             f"{self.restart_gap_s}")
        if not 0.0 < self.reconfigure_speed_fraction <= 1.0:
            raise ValueError("retarget.arm.reconfigure_speed_fraction must be in (0, 1], "
                             f"got {self.reconfigure_speed_fraction}")


@dataclass(frozen=True)
class RetargetResult:
    """Joint trajectory of one arm for one hand's wrist trajectory (``F`` control steps).

    Attributes:
        joint_names: names of the action joints ``(J,)``.
        joint_positions: joints per step, rad or m, ``(F, J)``, within joint, speed and acceleration limits.
        gripper: gripper command per step ``(F,)`` (NaN when the profile has no gripper).
        world_from_base: the robot base pose used, world frame, ``(4, 4)``.
        valid: steps with a hand (a target), ``(F,)``.
        base_from_tcp_target: wanted (smoothed) tool poses, robot base frame, ``(F, 4, 4)`` (NaN: no target).
        base_from_tcp: tool poses the joints reach, ``(F, 4, 4)``.
        target_shift_m: how far smoothing moved the target position from the hand's, base frame, ``(F,)``.
        ee_error_m: tool position error to the smoothed target (tracking), metres, ``(F,)`` (NaN: no target).
        hand_error_m: tool position error to the hand's unsmoothed target, metres, ``(F,)`` (NaN: no target);
            at most ``ee_error_m + target_shift_m``.
        ee_error_rad: geodesic angle to the kept target rotation, radians, ``(F,)`` (NaN where no target).
        approach_error_rad: approach-axis error (`pose_core.retarget.orientation`), ``(F,)``.
        closing_error_rad: closing-axis error, ``(F,)``.
        reachable: valid steps within the profile's tolerances, ``(F,)``.
        limit_violations: joint values outside the limits (counted; 0 by construction).
        velocity_violations: joint steps faster than the speed limits (counted; 0 by construction).
        acceleration_violations: joint second steps beyond the acceleration limits (counted).
    """

    joint_names: tuple[str, ...]
    joint_positions: FloatArray
    gripper: FloatArray
    world_from_base: FloatArray
    valid: BoolArray
    base_from_tcp_target: FloatArray
    base_from_tcp: FloatArray
    target_shift_m: FloatArray
    ee_error_m: FloatArray
    hand_error_m: FloatArray
    ee_error_rad: FloatArray
    approach_error_rad: FloatArray
    closing_error_rad: FloatArray
    reachable: BoolArray
    limit_violations: int
    velocity_violations: int
    acceleration_violations: int


def orientation_task(emb: Embodiment) -> OrientationTask:
    """The profile's orientation task for `solve_pose_ik`: kept targets and row weights per iteration."""
    spec = emb.orientation

    def task(poses: FloatArray, tool: FloatArray, targets: FloatArray) -> tuple[FloatArray, FloatArray]:
        normal = None if emb.plane_axis is None else poses[:, 1, :3, :3] @ emb.plane_axis
        return kept_targets(spec, tool, targets, normal), task_weights(spec, tool)

    return task


def joint_limit_margins(emb: Embodiment, q: FloatArray) -> FloatArray:
    """Each row's tightest joint ``(N,)`` of joints ``(N, J)``.

    A joint's margin is its distance to the nearer limit over half its range (0 at a limit, 1 mid-range);
    joints turning a full circle or more (continuous ones: infinite limits) or without a range do not count.
    """
    half = 0.5 * (emb.upper - emb.lower)
    bounded = (half > 0.0) & (half < np.pi)
    margins = np.minimum(q - emb.lower, emb.upper - q) / np.where(bounded, half, 1.0)
    return np.where(bounded, margins, 1.0).min(axis=1)


def margins_from_home(emb: Embodiment, opts: RetargetOptions, base_from_targets: FloatArray) -> FloatArray:
    """Joint-limit margins ``(N,)`` of the IK's solutions from home of tool targets ``(N, 4, 4)``.

    Targets in the base frame; NaN where a solution misses the profile's tolerances. The base search's
    test (`pose_core.retarget.placement.search_base`).
    """
    seeds = np.repeat(emb.home[None], len(base_from_targets), 0)
    bounds = (np.broadcast_to(emb.lower, seeds.shape), np.broadcast_to(emb.upper, seeds.shape))
    sol = solve_pose_ik(emb.model, 0, base_from_targets, seeds, bounds, opts.placement_ik, emb.home,
                        emb.ee_from_tcp, orientation=orientation_task(emb))
    return np.where(_within_reach(emb, sol), joint_limit_margins(emb, sol.joint_positions), np.nan)


def smoothed_world_targets(emb: Embodiment, world_from_wrist: FloatArray, fps: float,
                           opts: RetargetOptions) -> FloatArray:
    """The smoothed tool targets in the world, ``(F, 4, 4)``, from wrist poses ``(F, 4, 4)`` (NaN: no hand).

    What the base search places the robot for (`pose_core.retarget.placement.search_base`); the same
    smoothing `retarget_wrist_trajectory` applies in the base frame (it commutes with the rigid move
    and the workspace scaling).
    """
    world_from_tcp = np.asarray(world_from_wrist, np.float64) @ invert_rigid_matrices(emb.tcp_from_wrist)
    return smooth_tool_poses(world_from_tcp, fps, opts.smoothing, emb.orientation.closing == "symmetric")


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
        raise EgolakeError("retargeting needs at least one step and strictly increasing ts_s")
    dts = np.diff(ts_s)
    if frames > 2 and np.ptp(dts) > _UNIFORM_STEPS * np.median(dts):
        raise EgolakeError("retargeting needs uniform steps (the profile's control rate): step periods "
                           f"{dts.min():.6f}..{dts.max():.6f} s")


def _within_reach(emb: Embodiment, sol: IKSolution) -> BoolArray:
    """Rows within the profile's reach tolerances: position, approach and closing (the ``reachable`` flag)."""
    approach, closing = axis_errors(emb.orientation, sol.base_from_tool, sol.base_from_kept)
    spec = emb.orientation
    return ((sol.position_error_m <= emb.reach_position_tol_m) & (approach <= spec.approach_tol_rad)
            & (closing <= spec.closing_tol_rad))


def _solved(emb: Embodiment, sol: IKSolution, ik: IKOptions) -> BoolArray:
    """Rows within the solver's position tolerance and the profile's orientation tolerances."""
    return (sol.position_error_m < ik.position_tol_m) & _within_reach(emb, sol)


def _from_near(emb: Embodiment, tcp_target: FloatArray, opts: RetargetOptions,
               near: FloatArray) -> IKSolution:
    """One solve of a target ``(4, 4)`` from joints ``near`` ``(J,)``, within the joint limits only."""
    one = (emb.lower[None], emb.upper[None])
    return solve_pose_ik(emb.model, 0, tcp_target[None], near[None], one, opts.first_frame_ik, emb.home,
                         emb.ee_from_tcp, orientation=orientation_task(emb))


def _from_anywhere(emb: Embodiment, tcp_target: FloatArray, opts: RetargetOptions,
                   start: FloatArray) -> IKSolution:
    """Solves of a target ``(4, 4)`` from ``start`` ``(J,)``, home and ``restarts`` random seeds at once."""
    rng = np.random.default_rng(opts.random_seed)
    lo, hi = np.maximum(emb.lower, -np.pi), np.minimum(emb.upper, np.pi)
    randoms = rng.uniform(lo, hi, (opts.restarts, emb.model.num_joints))
    seeds = np.vstack([start[None], emb.home[None], randoms])
    bounds = (np.broadcast_to(emb.lower, seeds.shape), np.broadcast_to(emb.upper, seeds.shape))
    return solve_pose_ik(emb.model, 0, np.broadcast_to(tcp_target, (len(seeds), 4, 4)), seeds, bounds,
                         opts.first_frame_ik, emb.home, emb.ee_from_tcp, orientation=orientation_task(emb))


def _best_effort(emb: Embodiment, sol: IKSolution) -> int:
    """The row of ``sol`` nearest its target when none is within reach (a radian weighs a position tol)."""
    return int(np.argmin(sol.position_error_m + emb.reach_position_tol_m * sol.orientation_error_rad))


def _solve_anywhere(emb: Embodiment, tcp_target: FloatArray, opts: RetargetOptions,
                    near: FloatArray) -> tuple[FloatArray, bool]:
    """Joints ``(J,)`` for one target ``(4, 4)`` within the joint limits only, and whether they reach it.

    From ``near`` (joints ``(J,)``: the current joints of a stuck arm) if that is solved; else ``near``,
    home and ``restarts`` random seeds at once: of the solutions within reach the one nearest to
    ``near`` (a short way to go), else the best one.
    """
    sol = _from_near(emb, tcp_target, opts, near)
    if _solved(emb, sol, opts.first_frame_ik)[0]:
        return sol.joint_positions[0], True
    sol = _from_anywhere(emb, tcp_target, opts, sol.joint_positions[0])
    reached = _within_reach(emb, sol)
    if np.any(reached):
        pick = int(np.argmin(np.where(reached, np.linalg.norm(sol.joint_positions - near, axis=1), np.inf)))
    else:
        pick = _best_effort(emb, sol)
    return sol.joint_positions[pick], bool(reached[pick])


def _first_branches(emb: Embodiment, tcp_target: FloatArray,
                    opts: RetargetOptions) -> tuple[FloatArray, bool]:
    """Distinct starting joints for the first valid step ``(B, J)`` and whether they are within reach.

    The no-look-ahead choice comes first: the solve from home if it is solved, else the solution
    within reach nearest home. The others are further solutions within reach (home, restarts), nearest
    home first, each at least ``branch_separation`` from every one before it in some joint. None within
    reach: the best solution alone, and False.
    """
    near = _from_near(emb, tcp_target, opts, emb.home)
    wide = _from_anywhere(emb, tcp_target, opts, near.joint_positions[0])
    reached = np.flatnonzero(_within_reach(emb, wide))
    if not len(reached):
        return wide.joint_positions[_best_effort(emb, wide)][None], False
    home_distance = np.linalg.norm(wide.joint_positions[reached] - emb.home, axis=1)
    ordered = list(wide.joint_positions[reached[np.argsort(home_distance, kind="stable")]])
    if _solved(emb, near, opts.first_frame_ik)[0]:
        ordered.insert(0, near.joint_positions[0])
    branches: list[FloatArray] = []
    for q in ordered:
        if all(np.max(np.abs(q - b)) >= opts.branch_separation for b in branches):
            branches.append(q)
        if len(branches) == opts.first_branches:
            break
    return np.stack(branches), True


def _start(emb: Embodiment, tcp_targets: FloatArray, valid: BoolArray, ts_s: FloatArray,
           opts: RetargetOptions) -> tuple[int, FloatArray]:
    """The step the arm starts at and its candidate joints ``(B, J)`` (`_first_branches`).

    The first valid step within reach from anywhere, at most ``branch_lookahead_s`` after the first
    valid step: a hand that comes into view out of the arm's reach would otherwise fix the arm on the
    best effort's branch (e.g. folded over its shoulder), which the reachable steps after it cannot
    use. The valid steps before it hold its joints (best effort, flagged unreachable). None within
    reach: the first valid step and its best solution.
    """
    steps = np.flatnonzero(valid)
    best_effort: FloatArray | None = None
    for i in steps[ts_s[steps] <= ts_s[steps[0]] + opts.branch_lookahead_s]:
        branches, within_reach = _first_branches(emb, tcp_targets[i], opts)
        if within_reach:
            return int(i), branches
        best_effort = branches if best_effort is None else best_effort
    assert best_effort is not None  # the first valid step is always tried
    return int(steps[0]), best_effort


def solve_in_chunks(  # noqa: PLR0913 - the solver, its start and the limits
    solve_batch: BatchSolver,
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


def _tool_errors(emb: Embodiment, q: FloatArray, tcp_targets: FloatArray) -> tuple[
        FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """The tool poses joints ``(F, J)`` reach ``(F, 4, 4)``, and their errors to the kept targets ``(F,)``.

    Returns:
        ``(base_from_tcp, position m, rotation rad, approach rad, closing rad)``; NaN where a target is.
    """
    poses = emb.model.forward(q)
    base_from_tcp = poses[:, 0] @ emb.ee_from_tcp
    kept = orientation_task(emb)(poses, base_from_tcp, tcp_targets)[0]
    e_p, e_r = pose_errors(base_from_tcp, kept)
    approach, closing = axis_errors(emb.orientation, base_from_tcp, kept)
    return base_from_tcp, np.linalg.norm(e_p, axis=1), np.linalg.norm(e_r, axis=1), approach, closing


def _reached(emb: Embodiment, q: FloatArray, tcp_targets: FloatArray, valid: BoolArray) -> BoolArray:
    """Valid steps ``(F,)`` whose tool at joints ``(F, J)`` is within the profile's tolerances."""
    _, err_m, _, approach, closing = _tool_errors(emb, q, tcp_targets)
    return (valid & (err_m <= emb.reach_position_tol_m) & (approach <= emb.orientation.approach_tol_rad)
            & (closing <= emb.orientation.closing_tol_rad))


def _step_solver(emb: Embodiment, tcp_targets: FloatArray, ts_s: FloatArray,
                 opts: RetargetOptions) -> BatchSolver:
    """A fresh `solve_in_chunks` solver of one trajectory: batched warm-started IK, a stuck arm's search."""
    next_search_s = -np.inf
    goal: FloatArray | None = None  # where a stuck arm is heading (the last search's solution)
    task = orientation_task(emb)

    def solve(idx: IntArray, seeds: FloatArray,
              bounds: tuple[FloatArray, FloatArray]) -> tuple[FloatArray, BoolArray]:
        # The posture task only in single-step repairs: rows of a batch stop at different
        # iterations, and an unequal pull towards home would make consecutive steps jitter.
        posture = emb.home if len(idx) == 1 else None
        sol = solve_pose_ik(emb.model, 0, tcp_targets[idx], seeds, bounds, opts.ik, posture,
                            emb.ee_from_tcp, orientation=task)
        nonlocal next_search_s, goal
        stuck = len(idx) == 1 and not _within_reach(emb, sol)[0]
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
                                  emb.ee_from_tcp, toward=toward, orientation=task)
            return moved.joint_positions, np.zeros(1, dtype=bool)
        if not stuck:
            goal = None
        return sol.joint_positions, _solved(emb, sol, opts.ik)

    return solve


def _runs(valid: BoolArray, ts_s: FloatArray, gap_s: float) -> list[BoolArray]:
    """Masks ``(F,)`` of the runs of valid steps ``(F,)`` parted by more than ``gap_s`` s without a hand."""
    steps = np.flatnonzero(valid)
    runs = []
    for part in np.split(steps, np.flatnonzero(np.diff(ts_s[steps]) > gap_s) + 1):
        mask = np.zeros(len(valid), dtype=bool)
        mask[part] = True
        runs.append(mask)
    return runs


def _after_gap(emb: Embodiment, tcp_targets: FloatArray, ts_s: FloatArray, opts: RetargetOptions,
               last: int, q_last: FloatArray, run: BoolArray, start: tuple[int, FloatArray]) -> FloatArray:
    """Candidate joints ``(B, J)`` of a run's start step after a gap: the continuation, then the branches.

    The continuation solves the start step from the joints ``q_last`` of step ``last`` (the step before
    the gap) within its speed box; the branches (`_start`) follow when the arm can reach them from
    ``q_last`` at its speed limits by the run's first step.
    """
    first, branches = start
    time_s = ts_s[first] - ts_s[last]
    bounds = (np.maximum(emb.lower, q_last - emb.velocity * time_s)[None],
              np.minimum(emb.upper, q_last + emb.velocity * time_s)[None])
    continuation = solve_pose_ik(emb.model, 0, tcp_targets[first][None], q_last[None], bounds, opts.ik,
                                 emb.home, emb.ee_from_tcp, orientation=orientation_task(emb)).joint_positions
    in_time = np.all(np.abs(branches - q_last) <= emb.velocity * (ts_s[np.argmax(run)] - ts_s[last]), axis=1)
    return np.vstack([continuation, branches[in_time]])


def _pick_branch(emb: Embodiment, tcp_targets: FloatArray, valid: BoolArray, ts_s: FloatArray,
                 opts: RetargetOptions, first: int, branches: FloatArray) -> FloatArray:
    """Of candidate joints ``(B, J)`` for step ``first``, the one that keeps the most steps within reach.

    Over the next ``branch_lookahead_s``, each tracked as the whole trajectory is; ties: the earlier.
    """
    if len(branches) == 1:
        return branches[0]
    end = int(np.searchsorted(ts_s, ts_s[first] + opts.branch_lookahead_s, side="right"))
    steps = int(valid[first:end].sum())
    kept: list[int] = []
    for q in branches:  # the first of the best wins, so the others are tried only when the first misses
        ahead = solve_in_chunks(_step_solver(emb, tcp_targets, ts_s, opts), q, first, valid[:end],
                                ts_s[:end], emb, opts.chunk_frames)
        kept.append(int(_reached(emb, ahead[first:], tcp_targets[first:end], valid[first:end]).sum()))
        if kept[0] == steps:
            break
    logger.debug("%s: branches at step %d keep %s of %d steps within reach", emb.name, first, kept, steps)
    return branches[int(np.argmax(kept))]


def _ik_joints(emb: Embodiment, tcp_targets: FloatArray, valid: BoolArray, ts_s: FloatArray,
               opts: RetargetOptions) -> FloatArray:
    """The IK's joints per step ``(F, J)``, within joint and speed limits (see the module's Algorithm).

    Run by run (`_runs`): each run starts on the branch `_pick_branch` chooses (after a gap, among
    `_after_gap`'s candidates) and is tracked in chunks; the gaps between runs are bridged at the speed
    limits (`rate_limit`).
    """
    q = np.full((len(ts_s), emb.model.num_joints), np.nan)
    last = -1
    for run in _runs(valid, ts_s, opts.restart_gap_s):
        first, branches = _start(emb, tcp_targets, run, ts_s, opts)
        if last >= 0:
            branches = _after_gap(emb, tcp_targets, ts_s, opts, last, q[last], run, (first, branches))
        q_first = _pick_branch(emb, tcp_targets, run, ts_s, opts, first, branches)
        q[run] = solve_in_chunks(_step_solver(emb, tcp_targets, ts_s, opts), q_first, first, run, ts_s, emb,
                                 opts.chunk_frames)[run]
        last = int(np.flatnonzero(run)[-1])
    return rate_limit(q, ts_s, emb.velocity, (emb.lower, emb.upper))


def _residuals(emb: Embodiment, tcp_targets: FloatArray, valid: BoolArray) -> Residuals:
    """Weighted tool residuals of the trajectory fit (`pose_core.retarget.trajectory.Residuals`).

    Position over the position tolerance, orientation rows (the profile's weights) over the approach
    tolerance; zero where a step has no target.
    """
    task = orientation_task(emb)
    scale = np.concatenate([np.full(3, 1.0 / emb.reach_position_tol_m),
                            np.full(3, 1.0 / emb.orientation.approach_tol_rad)])

    def residuals(q: FloatArray) -> tuple[FloatArray, FloatArray]:
        poses, jacs = emb.model.forward_with_jacobians(q)
        tool, jac = tool_pose_and_jacobian(poses[:, 0], jacs[:, 0], emb.ee_from_tcp)
        kept, weights = task(poses, tool, np.where(valid[:, None, None], tcp_targets, tool))
        e_p, e_r = pose_errors(tool, kept)
        r = np.hstack([e_p, np.einsum("fij,fj->fi", weights, e_r)]) * scale
        jac = np.concatenate([jac[:, :3], weights @ jac[:, 3:]], axis=1) * scale[:, None]
        return np.where(valid[:, None], r, 0.0), np.where(valid[:, None, None], jac, 0.0)

    return residuals


def _gripper(emb: Embodiment, grip_aperture_m: FloatArray, ts_s: FloatArray) -> FloatArray:
    """Gripper commands per step ``(F,)`` within the gripper's speed (NaN without a gripper)."""
    if emb.gripper is None:
        return np.full(len(ts_s), np.nan)
    command = emb.gripper.command(grip_aperture_m)
    finite = np.flatnonzero(np.isfinite(command))
    command[: finite[0] if len(finite) else len(ts_s)] = emb.gripper.open
    return rate_limit(command[:, None], ts_s, emb.gripper.velocity)[:, 0]


def retarget_wrist_trajectory(  # noqa: PLR0913 - the trajectory, its timing and the base
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
            NaN rows for steps without a hand.
        grip_aperture_m: thumb-to-index aperture, metres, ``(F,)`` (NaN: bridged like the joints).
        ts_s: uniform, increasing step times (the profile's control rate), seconds, ``(F,)``.
        opts: solver, smoothing knobs.
        world_from_base: per-episode robot base pose in the world ``(4, 4)``; default the profile's.

    Returns:
        The joint trajectory, gripper commands, errors, reachability flags and limit checks.

    Raises:
        ShapeError: on mismatched shapes.
        EgolakeError: if the embodiment is not an arm, there are no steps or ``ts_s`` is not increasing
            and uniform.
    """
    world_from_wrist = np.asarray(world_from_wrist, np.float64)
    grip_aperture_m = np.asarray(grip_aperture_m, np.float64)
    ts_s = np.asarray(ts_s, np.float64)
    _check(world_from_wrist, grip_aperture_m, ts_s)
    if emb.kind != "arm":
        raise EgolakeError(f"embodiment {emb.name!r} is a {emb.kind}, not an arm")
    frames = len(ts_s)
    dt = float(np.median(np.diff(ts_s))) if frames > 1 else 1.0 / emb.control_fps
    if world_from_base is None:
        world_from_base = emb.world_from_base
    raw = base_from_tcp_targets(emb, world_from_wrist, world_from_base)
    valid = np.all(np.isfinite(raw.reshape(frames, -1)), axis=1)
    tcp_targets = smooth_tool_poses(raw, 1.0 / dt, opts.smoothing, emb.orientation.closing == "symmetric")
    if not np.any(valid):
        q = np.repeat(emb.home[None], frames, 0)
    else:
        q_ik = _ik_joints(emb, tcp_targets, valid, ts_s, opts)
        q = fit_trajectory(_residuals(emb, tcp_targets, valid), q_ik, dt, (emb.lower, emb.upper),
                           emb.velocity, emb.acceleration, opts.trajectory)
    base_from_tcp, err_m, err_rad, approach, closing = _tool_errors(emb, q, tcp_targets)
    reachable = _reached(emb, q, tcp_targets, valid)
    limit, speed, accel = joint_violations(q, dt, (emb.lower, emb.upper), emb.velocity, emb.acceleration)
    logger.debug("%s: %d steps, %d with a hand, %d reachable", emb.name, frames, int(valid.sum()),
                 int(reachable.sum()))
    shift = np.linalg.norm(tcp_targets[:, :3, 3] - raw[:, :3, 3], axis=1)
    to_hand = np.linalg.norm(base_from_tcp[:, :3, 3] - raw[:, :3, 3], axis=1)
    return RetargetResult(emb.model.joint_names, q, _gripper(emb, grip_aperture_m, ts_s), world_from_base,
                          valid, tcp_targets, base_from_tcp, shift, err_m, to_hand, err_rad, approach,
                          closing, reachable, limit, speed, accel)
