"""Where an arm's base stands for one episode: upright against gravity, placed to reach the hand's path.

Convention:
    ``world`` is the human world frame of ``hands_world`` (the first camera's frame, metres). A profile's
    ``world_from_base`` rotation is written for a z-up world with the wearer facing ``+y``;
    `world_from_level` gives that frame for a world where gravity points along ``gravity_dir_world``.
    Workspace scaling maps a tool position ``p`` (base frame) to ``c + s (p - c)`` with ``c`` the
    profile's ``workspace.center_in_base_m`` and ``s`` its ``workspace.scale``; rotations are not scaled.

Search (`search_base`): the start is `world_from_base_at_wrists` (the median tool position on ``c``);
candidates move the base by ``delta`` on a grid and turn it by ``psi`` about the vertical through ``c``,
so that in a candidate's base frame a tool target is ``c + s Rz(-psi) (p0 - c - delta)``, ``p0`` its
position in the start's base frame. A candidate's score is the fraction of a few *probe* steps (spread
over the trajectory by farthest-point sampling of position and approach) that the caller's ``reach_margins``
finds within reach (in `pose_core.retarget.arm`: IK from the home pose within the profile's tolerances; all
candidates' probes in one batched solve). A coarse grid, then a finer one around its best; the best
score wins; of equal scores, the one whose probe solutions stay farthest from the joint limits (the mean
of each probe's tightest joint, in steps of ``margin_step``): an arm placed so that the hand's path
folds it against a limit reaches the probes from home but loses the steps between them, where the
joints run out; then the candidate nearest the start. Probes solved from home say where the arm works
comfortably, not every place it can reach: the trajectory's IK decides what is reached.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.geometry.rigid3 import invert_rigid_matrices
from pose_core.retarget.embodiment import Embodiment

__all__ = [
    "PlacementOptions",
    "ReachMargins",
    "base_from_tcp_targets",
    "search_base",
    "world_from_base_at_wrists",
    "world_from_level",
    "world_from_wrist_for_targets",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

BoolArray = NDArray[np.bool_]
#: ``base_from_targets (N, 4, 4) -> margins (N,)``: how far the arm's solution of each tool target stays
#: from its joint limits (0 at a limit, 1 mid-range), NaN where the arm does not reach the target
#: (`search_base`).
ReachMargins = Callable[[FloatArray], FloatArray]


@dataclass(frozen=True)
class PlacementOptions:
    """Knobs of the per-episode base search."""

    # Steps of the trajectory that score a candidate (farthest-point sampling of position and approach).
    probe_steps: int = 30
    # Coarse grid: the base turns about the vertical through the workspace centre within +- this, radians,
    yaw_range_rad: float = math.radians(60.0)
    # in steps of this, radians,
    yaw_step_rad: float = math.radians(30.0)
    # and moves within +- this along each base axis from the median placement, metres,
    offset_range_m: float = 0.1
    # in steps of this, metres. The fine grid halves both steps around the coarse grid's best.
    offset_step_m: float = 0.1
    # Candidates reaching as many probes tie when their mean joint-limit margins (0 at a limit, 1 mid-range)
    # round to the same multiple of this; the nearest the start wins a tie.
    margin_step: float = 0.01

    def __post_init__(self) -> None:
        if self.probe_steps < 1 or self.yaw_step_rad <= 0 or self.offset_step_m <= 0 or self.margin_step <= 0:
            raise ValueError("retarget placement: probe_steps >= 1 and steps > 0")
        if self.yaw_range_rad < 0 or self.offset_range_m < 0:
            raise ValueError("retarget placement: ranges >= 0")


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
        world_from_wrist: wrist (or tool) poses, world frame, ``(F, 4, 4)``; NaN rows are ignored.
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


def _rz(angle: float) -> FloatArray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _probes(in_start: FloatArray, count: int) -> IntArray:
    """Indices of ``count`` poses ``(N, 4, 4)`` spread by farthest-point sampling (10 cm ~ 1 rad approach)."""
    features = np.hstack([in_start[:, :3, 3] / 0.1, in_start[:, :3, 2]])
    picked = [int(np.argmin(np.linalg.norm(features - np.median(features, axis=0), axis=1)))]
    distance = np.linalg.norm(features - features[picked[0]], axis=1)
    while len(picked) < min(count, len(features)):
        picked.append(int(np.argmax(distance)))
        distance = np.minimum(distance, np.linalg.norm(features - features[picked[-1]], axis=1))
    return np.array(picked, np.int64)


def _grid(half_range: float, step: float) -> FloatArray:
    return np.arange(-half_range, half_range + 1e-9, step) if half_range > 0 else np.zeros(1)


def _best(emb: Embodiment, in_start: FloatArray, candidates: list[tuple[float, FloatArray]],
          reach_margins: ReachMargins, margin_step: float) -> tuple[float, FloatArray, float]:
    """(yaw, offset, score) of the best candidate: most probes reached, then margin, then nearest."""
    c, s = emb.workspace_center_in_base_m, emb.workspace_scale
    targets = []
    for psi, delta in candidates:
        turn = np.eye(4)
        turn[:3, :3] = _rz(-psi)
        moved = turn @ in_start
        moved[:, :3, 3] = c + s * ((in_start[:, :3, 3] - c - delta) @ _rz(-psi).T)
        targets.append(moved)
    margins = reach_margins(np.concatenate(targets)).reshape(len(candidates), len(in_start))
    ok = np.isfinite(margins)
    score = ok.mean(axis=1)
    margin = np.round(np.where(ok, margins, 0.0).mean(axis=1) / margin_step)
    distance = np.array([np.linalg.norm(d) + 0.5 * abs(p) for p, d in candidates])  # m + half a m per rad
    pick = int(np.lexsort((distance, -margin, -score))[0])
    return candidates[pick][0], candidates[pick][1], float(score[pick])


def search_base(emb: Embodiment, world_from_tcp: FloatArray, gravity_dir_world: FloatArray | None,
                reach_margins: ReachMargins, opts: PlacementOptions) -> tuple[FloatArray, float]:
    """The base pose (position and yaw, upright) that reaches most of a trajectory's probe steps.

    Args:
        emb: an ``arm`` embodiment.
        world_from_tcp: tool targets in the world (the human wrist poses times ``wrist_from_tcp``), metres,
            ``(F, 4, 4)``; NaN rows (no hand) are ignored.
        gravity_dir_world: gravity (down) in the world ``(3,)``, or None for the profile's rotation.
        reach_margins: the joint-limit margins of the arm's solutions of tool targets (base frame, workspace
            scaling applied), NaN where it does not reach one.
        opts: probes and grids.

    Returns:
        ``(world_from_base (4, 4), the fraction of probes reached there)``; the start pose and 0 when no
        step has a target.
    """
    start = world_from_base_at_wrists(emb, world_from_tcp, gravity_dir_world)
    finite = np.all(np.isfinite(world_from_tcp.reshape(len(world_from_tcp), -1)), axis=1)
    if not np.any(finite):
        return start, 0.0
    in_start = invert_rigid_matrices(start) @ world_from_tcp[finite]
    in_start = in_start[_probes(in_start, opts.probe_steps)]
    coarse = [(psi, np.array(d)) for psi in _grid(opts.yaw_range_rad, opts.yaw_step_rad)
              for d in np.stack(np.meshgrid(*[_grid(opts.offset_range_m, opts.offset_step_m)] * 3,
                                            indexing="ij"), axis=-1).reshape(-1, 3)]
    psi, delta, _ = _best(emb, in_start, coarse, reach_margins, opts.margin_step)
    fine_yaw, fine_step = 0.5 * opts.yaw_step_rad, 0.5 * opts.offset_step_m
    fine = [(psi + dp, delta + np.array(dd)) for dp in (-fine_yaw, 0.0, fine_yaw)
            for dd in np.stack(np.meshgrid(*[np.array([-fine_step, 0.0, fine_step])] * 3, indexing="ij"),
                               axis=-1).reshape(-1, 3)]
    psi, delta, score = _best(emb, in_start, fine, reach_margins, opts.margin_step)
    base0_from_base = np.eye(4)
    base0_from_base[:3, :3] = _rz(psi)
    centre = emb.workspace_center_in_base_m
    base0_from_base[:3, 3] = centre + delta - _rz(psi) @ centre
    logger.debug("base of %s: yaw %+.0f deg, offset %s m, probes reached %.2f", emb.name, math.degrees(psi),
                 np.round(delta, 3), score)
    return start @ base0_from_base, score
