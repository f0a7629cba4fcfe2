"""Embodiment profiles: a robot's URDF plus how human hand motion maps onto it.

A profile is a YAML file (``conf/embodiments/<name>.yaml``, every key documented there); this module
turns the already-parsed profile and its parsed URDF into an `Embodiment`. Finding and reading the
files (robots root, ``package://`` URIs) is `udfs.robots.load_embodiment`'s job.

Convention:
    ``world`` is the human world frame of ``hands_world``; the robot base stands at
    ``world_from_base``. Workspace scaling maps a wrist position ``p`` (base frame) to
    ``center + scale * (p - center)``; rotations are not scaled. The tool frame (TCP) is rigidly
    attached to ``ee_link`` by ``ee_from_tcp``, and the human wrist frame (see
    `pose_core.retarget.wrist`) relates to it by the rotation ``tcp_from_wrist``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import InputError
from pose_core.retarget.kinematics import KinematicModel
from pose_core.retarget.orientation import OrientationSpec
from pose_core.retarget.urdf import UrdfModel, matrix_from_xyz_rpy

__all__ = [
    "Embodiment",
    "GripperMapping",
    "KeypointVector",
    "check_profile_keys",
    "embodiment_from_profile",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

_ARM_KEYS = {"ee_link", "ee_from_tcp", "tcp_from_wrist_rpy", "gripper", "reach", "workspace",
             "world_from_base", "orientation", "acceleration"}
_REACH_KEYS = {"position_tol_m"}
_ORIENTATION_KEYS = {"approach", "plane_joint", "closing", "approach_weight", "closing_weight",
                     "approach_tol_rad", "closing_tol_rad"}
_HAND_KEYS = {"vectors", "hand_from_wrist_rpy", "keypoint_scale"}
_COMMON_KEYS = {"name", "kind", "urdf", "packages", "base_link", "home", "joints", "velocity_scale",
                "action_space", "control_fps"}


@dataclass(frozen=True)
class GripperMapping:
    """Grip aperture (thumb to index tip, metres) to gripper command, linear and clipped.

    Attributes:
        joint: URDF joint the command drives, or None for a normalised command.
        closed: command when the aperture is at most ``aperture_closed_m``.
        open: command when the aperture is at least ``aperture_open_m``.
        aperture_closed_m: human aperture that means closed.
        aperture_open_m: human aperture that means fully open.
        velocity: largest command speed, units/s (the joint's URDF limit unless overridden).
    """

    joint: str | None
    closed: float
    open: float
    aperture_closed_m: float
    aperture_open_m: float
    velocity: float

    def command(self, aperture_m: FloatArray) -> FloatArray:
        """Command per frame, ``(F,)`` from apertures ``(F,)`` (NaN stays NaN)."""
        frac = np.clip((np.asarray(aperture_m, np.float64) - self.aperture_closed_m)
                       / (self.aperture_open_m - self.aperture_closed_m), 0.0, 1.0)
        return self.closed + frac * (self.open - self.closed)


@dataclass(frozen=True)
class KeypointVector:
    """One vector a dexterous hand must reproduce: human ``k_origin -> k_task`` vs robot ``origin -> task``.

    Attributes:
        origin_link: robot link the vector starts at.
        task_link: robot link it ends at.
        origin_keypoint: MediaPipe index of the human start point.
        task_keypoint: MediaPipe index of the human end point.
        weight: relative weight in the least-squares fit.
    """

    origin_link: str
    task_link: str
    origin_keypoint: int
    task_keypoint: int
    weight: float


@dataclass(frozen=True)
class Embodiment:
    """A loaded profile.

    Attributes:
        name: profile name (``so101``, ``panda``...).
        kind: ``arm`` (wrist pose + gripper) or ``hand`` (keypoint vectors).
        urdf: the parsed URDF.
        model: kinematics of the controlled links; ``model.joint_names`` are the action joints.
        lower: joint lower limits after overrides, ``(J,)``.
        upper: joint upper limits after overrides, ``(J,)``.
        velocity: joint speed limits used (URDF or override, times ``velocity_scale``), ``(J,)``.
        acceleration: joint acceleration limits, rad/s^2 or m/s^2, ``(J,)`` (arms; ``inf`` for hands).
        home: rest configuration, ``(J,)``.
        control_fps: robot control rate, Hz (an integer: a LeRobot dataset's fps); retargeted trajectories
            are sampled at it.
        action_space: names of the action parts (``joint_positions``, ``ee_pose``).
        ee_from_tcp: tool frame in the end-effector link, ``(4, 4)`` (arms).
        tcp_from_wrist: human wrist frame in the tool frame, rotation only, ``(4, 4)`` (arms).
        world_from_base: default robot base pose in the human world frame, ``(4, 4)`` (arms).
        workspace_scale: position scale about ``workspace_center_in_base_m`` (arms).
        workspace_center_in_base_m: scaling centre, base frame, metres, ``(3,)`` (arms).
        reach_position_tol_m: a step is reachable when its tool position error is at most this (and its
            orientation errors within ``orientation``'s tolerances).
        orientation: which of the wrist's axes the tool keeps, their weights and tolerances (arms).
        plane_axis: for ``orientation.approach: in_plane``, the plane joint's axis in its child link, which
            is ``model.frames[1]``, ``(3,)``; else None.
        gripper: the gripper mapping (arms) or None.
        vectors: keypoint vectors (hands).
        hand_from_wrist: human wrist frame in the robot hand's base frame, rotation, ``(4, 4)`` (hands).
        keypoint_scale: robot-hand size over human-hand size (hands).
    """

    name: str
    kind: str
    urdf: UrdfModel
    model: KinematicModel
    lower: FloatArray
    upper: FloatArray
    velocity: FloatArray
    acceleration: FloatArray
    home: FloatArray
    control_fps: int
    action_space: tuple[str, ...]
    ee_from_tcp: FloatArray
    tcp_from_wrist: FloatArray
    world_from_base: FloatArray
    workspace_scale: float
    workspace_center_in_base_m: FloatArray
    reach_position_tol_m: float
    orientation: OrientationSpec
    plane_axis: FloatArray | None
    gripper: GripperMapping | None
    vectors: tuple[KeypointVector, ...]
    hand_from_wrist: FloatArray
    keypoint_scale: float


def _pose(spec: Mapping[str, Any] | None) -> FloatArray:
    spec = spec or {}
    return matrix_from_xyz_rpy(spec.get("xyz", (0.0, 0.0, 0.0)), spec.get("rpy", (0.0, 0.0, 0.0)))


def _rotation(rpy: Any) -> FloatArray:
    return matrix_from_xyz_rpy((0.0, 0.0, 0.0), rpy if rpy is not None else (0.0, 0.0, 0.0))


def check_profile_keys(raw: Mapping[str, Any], source: str) -> None:
    """Every problem with a parsed profile's keys at once, as one ``profile_invalid`` error."""
    problems = []
    kind = raw.get("kind")
    if kind not in ("arm", "hand"):
        problems.append(f"kind must be 'arm' or 'hand', got {kind!r}")
    allowed = _COMMON_KEYS | (_ARM_KEYS if kind == "arm" else _HAND_KEYS)
    problems += [f"unknown key {k!r}" for k in sorted(set(raw) - allowed)]
    problems += [f"missing key {k!r}" for k in ("name", "urdf", "home") if k not in raw]
    if kind == "arm":
        problems += [f"missing key {k!r}" for k in ("ee_link", "acceleration") if k not in raw]
        problems += [f"unknown key 'reach.{k}'" + (" (now orientation.approach_tol_rad / closing_tol_rad)"
                                                   if k == "orientation_tol_rad" else "")
                     for k in sorted(set(raw.get("reach") or {}) - _REACH_KEYS)]
        problems += [f"unknown key 'orientation.{k}'"
                     for k in sorted(set(raw.get("orientation") or {}) - _ORIENTATION_KEYS)]
    if kind == "hand" and not raw.get("vectors"):
        problems.append("missing key 'vectors'")
    fps = raw.get("control_fps", 30)
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        problems.append(f"control_fps must be a whole number of Hz >= 1, got {fps!r}")
    if problems:
        raise InputError("profile_invalid", "; ".join(problems), source)


def _limits(raw: Mapping[str, Any], model: KinematicModel,
            source: str) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(lower, upper, velocity, acceleration) per joint after the profile's overrides."""
    lower, upper, velocity = model.lower.copy(), model.upper.copy(), model.velocity.copy()
    acceleration = np.full(model.num_joints, float(raw.get("acceleration", math.inf)))
    overrides = raw.get("joints") or {}
    unknown = sorted(set(overrides) - set(model.joint_names))
    if unknown:
        raise InputError("profile_invalid", f"joint overrides for unknown joints {unknown}", source)
    for i, name in enumerate(model.joint_names):
        spec = overrides.get(name, {})
        lower[i] = float(spec.get("lower", lower[i]))
        upper[i] = float(spec.get("upper", upper[i]))
        velocity[i] = float(spec.get("velocity", velocity[i]))
        acceleration[i] = float(spec.get("acceleration", acceleration[i]))
    if np.any(lower > upper) or not np.all(np.isfinite(velocity)) or np.any(acceleration <= 0):
        raise InputError("profile_invalid", "joint limits need lower <= upper, finite velocities "
                         "(give 'velocity' in 'joints' where the URDF has none) and accelerations > 0",
                         source)
    return lower, upper, velocity * float(raw.get("velocity_scale", 1.0)), acceleration


def _orientation(raw: Mapping[str, Any], urdf: UrdfModel, source: str) -> tuple[OrientationSpec, list[str]]:
    """The profile's orientation task and the extra model frame it needs (the plane joint's child link)."""
    spec = dict(raw.get("orientation") or {})
    try:
        out = OrientationSpec(**spec)
        extra = [urdf.joint(out.plane_joint).child] if out.approach == "in_plane" and out.plane_joint else []
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError("profile_invalid", str(exc), source) from exc
    return out, extra


def _gripper(spec: Mapping[str, Any] | None, urdf: UrdfModel) -> GripperMapping | None:
    if not spec:
        return None
    joint = spec.get("joint")
    velocity = float(spec.get("velocity", urdf.joint(joint).velocity if joint else math.inf))
    return GripperMapping(joint, float(spec["closed"]), float(spec["open"]), float(spec["aperture_closed_m"]),
                          float(spec["aperture_open_m"]), velocity)


def embodiment_from_profile(raw: Mapping[str, Any], urdf: UrdfModel, source: str) -> Embodiment:
    """Build an embodiment from a parsed profile and its parsed URDF.

    Args:
        raw: the profile's keys (YAML already parsed; `check_profile_keys` already passed).
        urdf: the URDF the profile names.
        source: where the profile came from, for error messages.

    Raises:
        InputError: ``profile_invalid`` (unknown links or joints, limits, home outside them).
    """
    vectors = tuple(KeypointVector(v["origin_link"], v["task_link"], int(v["origin_keypoint"]),
                                   int(v["task_keypoint"]), float(v.get("weight", 1.0)))
                    for v in raw.get("vectors") or ())
    orientation, plane_link = (_orientation(raw, urdf, source) if raw["kind"] == "arm"
                               else (OrientationSpec(), []))
    frames = [raw["ee_link"], *plane_link] if raw["kind"] == "arm" else sorted(
        {v.origin_link for v in vectors} | {v.task_link for v in vectors})
    try:
        model = KinematicModel(urdf, frames, base_link=raw.get("base_link"))
    except KeyError as exc:
        raise InputError("profile_invalid", str(exc), source) from exc
    lower, upper, velocity, acceleration = _limits(raw, model, source)
    home = np.asarray(raw["home"], dtype=np.float64)
    if home.shape != (model.num_joints,) or np.any(home < lower) or np.any(home > upper):
        raise InputError("profile_invalid", f"home must be {model.num_joints} values within the limits of "
                         f"{model.joint_names}", source)
    workspace = raw.get("workspace") or {}
    reach = raw.get("reach") or {}
    logger.info("embodiment %s: %d joints %s (URDF %s)", raw["name"], model.num_joints, model.joint_names,
                urdf.name)
    return Embodiment(
        name=str(raw["name"]), kind=str(raw["kind"]), urdf=urdf, model=model,
        lower=lower, upper=upper, velocity=velocity, acceleration=acceleration, home=home,
        control_fps=int(raw.get("control_fps", 30)),
        action_space=tuple(raw.get("action_space", ("joint_positions",))),
        ee_from_tcp=_pose(raw.get("ee_from_tcp")),
        tcp_from_wrist=_rotation(raw.get("tcp_from_wrist_rpy")),
        world_from_base=_pose(raw.get("world_from_base")),
        workspace_scale=float(workspace.get("scale", 1.0)),
        workspace_center_in_base_m=np.asarray(workspace.get("center_in_base_m", (0.0, 0.0, 0.0)), np.float64),
        reach_position_tol_m=float(reach.get("position_tol_m", 0.01)),
        orientation=orientation,
        plane_axis=(urdf.joint(orientation.plane_joint).axis
                    if plane_link and orientation.plane_joint else None),
        gripper=_gripper(raw.get("gripper"), urdf),
        vectors=vectors,
        hand_from_wrist=_rotation(raw.get("hand_from_wrist_rpy")),
        keypoint_scale=float(raw.get("keypoint_scale", 1.0)),
    )
