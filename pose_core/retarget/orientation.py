"""What of the human hand's orientation a robot tool keeps: approach axis, closing axis, per profile.

Convention:
    The tool frame of an arm profile (the TCP, ``ee_link @ ee_from_tcp``) has ``z`` = approach (out of
    the gripper, along the fingers) and ``y`` = closing axis (the direction the jaws travel). The human
    wrist frame of `pose_core.retarget.wrist` has ``z`` from the wrist to the knuckles and ``y`` across
    the hand (towards the thumb of a right hand); ``tcp_from_wrist`` (identity in the shipped profiles)
    maps one onto the other, so the tool approaches where the fingers point and its jaws close across
    the hand, as the thumb closes against the fingers. A target is ``base_from_target`` in the robot base
    frame; the *kept target* is the target turned by what the profile does not keep:

    * ``approach: in_plane`` (5-DoF arms such as the SO-100/101): the approach axis can only turn in
      the vertical plane normal to the arm's pitch axes (``plane_joint``'s axis, horizontal, turned by
      the base pan joint, hence set by the tool position). Kept: the approach's *elevation* (its angle
      to the base's horizontal: a top-down grasp stays top-down, a side grasp a side grasp) and the roll
      about it; its heading is the plane's, on the side (away from the base or towards it) the target's
      heading is nearer to, or the tool's own side when the target points across the plane (within
      `ACROSS_PLANE`: the choice would flip with noise).
      The target is swung by the smallest rotation from its approach to that one (about the vertical
      when they are opposite), which carries its roll along. ``full``: the approach is kept as a
      direction.
    * ``closing: symmetric`` (parallel jaws): the closing axis is a line, ``y`` and ``-y`` grip alike;
      the target turned half a turn about its approach counts when it is nearer the tool's rotation.
      ``directed``: the closing axis has a sign. ``free``: the roll about the approach is not kept.

    Errors: ``approach`` is the angle between the tool's and the kept target's approach axes (radians,
    ``[0, pi]``); ``closing`` is the angle about the tool's approach from the tool's closing axis to the
    kept target's, projected off the approach (``[0, pi/2]`` when symmetric, 0 when free).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ACROSS_PLANE",
    "APPROACH_MODES",
    "CLOSING_MODES",
    "OrientationSpec",
    "axis_errors",
    "kept_targets",
    "task_weights",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

#: How the approach axis is kept: as a direction, or only within the arm's plane (5-DoF).
APPROACH_MODES = ("full", "in_plane")
#: How the closing axis is kept: a line (parallel jaws), a signed direction, or not at all.
CLOSING_MODES = ("symmetric", "directed", "free")
_EPS = 1e-9
#: A target heading within asin(this) of across the arm's plane keeps the tool's side (30 degrees).
ACROSS_PLANE = 0.5


@dataclass(frozen=True)
class OrientationSpec:
    """One profile's orientation task (see the module's Convention).

    Attributes:
        approach: ``full`` or ``in_plane``.
        plane_joint: for ``in_plane``, the joint whose axis is normal to the approach's plane.
        closing: ``symmetric``, ``directed`` or ``free``.
        approach_weight: weight of the approach task in the IK's orientation rows.
        closing_weight: weight of the roll about the approach (0 when ``closing`` is free).
        approach_tol_rad: a step is reachable only with its approach error at most this.
        closing_tol_rad: and its closing error at most this.
    """

    approach: str = "full"
    plane_joint: str | None = None
    closing: str = "symmetric"
    approach_weight: float = 1.0
    closing_weight: float = 1.0
    approach_tol_rad: float = math.radians(15.0)
    closing_tol_rad: float = math.radians(30.0)

    def __post_init__(self) -> None:
        problems = []
        if self.approach not in APPROACH_MODES:
            problems.append(f"orientation.approach must be one of {APPROACH_MODES}, got {self.approach!r}")
        if self.approach == "in_plane" and not self.plane_joint:
            problems.append("orientation.approach in_plane needs orientation.plane_joint")
        if self.closing not in CLOSING_MODES:
            problems.append(f"orientation.closing must be one of {CLOSING_MODES}, got {self.closing!r}")
        if self.approach_weight <= 0 or self.closing_weight < 0:
            problems.append("orientation weights: approach_weight > 0, closing_weight >= 0")
        if not (0 < self.approach_tol_rad <= math.pi and 0 < self.closing_tol_rad <= math.pi):
            problems.append("orientation tolerances must be in (0, pi]")
        if problems:
            raise ValueError("; ".join(problems))


def _swing(from_dir: FloatArray, to_dir: FloatArray) -> FloatArray:
    """Smallest rotations taking unit vectors ``from_dir (B, 3)`` to unit ``to_dir (B, 3)``, ``(B, 3, 3)``.

    Opposite vectors turn half a turn about the vertical (base z), or about x when they are vertical.
    """
    axis = np.cross(from_dir, to_dir)
    sin_a = np.linalg.norm(axis, axis=1)
    cos_a = np.sum(from_dir * to_dir, axis=1)
    opposite = (sin_a < 1e-9) & (cos_a < 0)
    axis[opposite] = np.where(np.abs(from_dir[opposite, 2:3]) < 0.9, [0.0, 0.0, 1.0], [1.0, 0.0, 0.0])
    k = axis / np.maximum(np.linalg.norm(axis, axis=1), _EPS)[:, None]
    kx = np.zeros((len(k), 3, 3))
    kx[:, 0, 1], kx[:, 0, 2], kx[:, 1, 2] = -k[:, 2], k[:, 1], -k[:, 0]
    kx -= np.swapaxes(kx, 1, 2)
    return np.eye(3) + sin_a[:, None, None] * kx + (1.0 - cos_a)[:, None, None] * (kx @ kx)


def _in_plane(approach: FloatArray, plane_normal: FloatArray, tool: FloatArray) -> FloatArray:
    """Approaches ``(B, 3)`` with their elevation kept, turned into the arm's plane (see the Convention)."""
    up = np.array([0.0, 0.0, 1.0])
    radial = np.cross(plane_normal, up)
    radial /= np.maximum(np.linalg.norm(radial, axis=1, keepdims=True), _EPS)
    radial *= np.where(np.sum(radial[:, :2] * tool[:, :2, 3], axis=1) < 0, -1.0, 1.0)[:, None]  # outward
    along = np.sum(approach[:, :2] * radial[:, :2], axis=1)
    clear = np.abs(along) > ACROSS_PLANE * np.linalg.norm(approach[:, :2], axis=1)
    side = np.where(clear, along, np.sum(tool[:, :2, 2] * radial[:, :2], axis=1))
    radial *= np.where(side < 0, -1.0, 1.0)[:, None]
    elevation = np.arcsin(np.clip(approach[:, 2], -1.0, 1.0))
    return np.cos(elevation)[:, None] * radial + np.sin(elevation)[:, None] * up


def kept_targets(spec: OrientationSpec, base_from_tool: FloatArray, base_from_target: FloatArray,
                 plane_normal: FloatArray | None = None) -> FloatArray:
    """The targets turned by what the profile does not keep.

    Args:
        spec: the profile's orientation task.
        base_from_tool: current tool poses, base frame, ``(B, 4, 4)``.
        base_from_target: targets, base frame, ``(B, 4, 4)``.
        plane_normal: for ``in_plane``: unit normal of the approach's plane per row, base frame, ``(B, 3)``.

    Returns:
        ``base_from_kept (B, 4, 4)``: same positions, rotations as kept (see the module's Convention).
    """
    kept = np.array(base_from_target, dtype=np.float64)
    rot = kept[:, :3, :3]
    if spec.approach == "in_plane" and plane_normal is not None:
        approach = rot[:, :, 2]
        rot = _swing(approach, _in_plane(approach, plane_normal, base_from_tool)) @ rot
    if spec.closing == "symmetric":
        flipped = rot * np.array([-1.0, -1.0, 1.0])  # half a turn about the target's own z
        tool = base_from_tool[:, :3, :3]
        nearer = np.einsum("bij,bij->b", flipped, tool) > np.einsum("bij,bij->b", rot, tool)  # trace(R^T T)
        rot = np.where(nearer[:, None, None], flipped, rot)
    elif spec.closing == "free":
        # Keep the approach only: the target rolled about its approach to the tool's closing axis.
        approach = rot[:, :, 2]
        tool_y = base_from_tool[:, :3, 1]
        closing = tool_y - np.sum(tool_y * approach, axis=1, keepdims=True) * approach
        good = np.linalg.norm(closing, axis=1) > 1e-6
        closing = np.where(good[:, None], closing / np.maximum(np.linalg.norm(closing, axis=1, keepdims=True),
                                                               _EPS), rot[:, :, 1])
        rot = np.stack([np.cross(closing, approach), closing, approach], axis=2)
    kept[:, :3, :3] = rot
    return kept


def axis_errors(spec: OrientationSpec, base_from_tool: FloatArray,
                base_from_kept: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Approach and closing errors of tool poses against kept targets (see the module's Convention).

    Args:
        spec: the profile's orientation task.
        base_from_tool: tool poses, ``(B, 4, 4)``.
        base_from_kept: kept targets (`kept_targets`), ``(B, 4, 4)``.

    Returns:
        ``(approach_rad (B,), closing_rad (B,))``; NaN where a target is NaN.
    """
    z_tool, z_kept = base_from_tool[:, :3, 2], base_from_kept[:, :3, 2]
    approach = np.arccos(np.clip(np.sum(z_tool * z_kept, axis=1), -1.0, 1.0))
    if spec.closing == "free":
        return approach, np.where(np.isfinite(approach), 0.0, np.nan)
    y_kept = base_from_kept[:, :3, 1]
    y_kept = y_kept - np.sum(y_kept * z_tool, axis=1, keepdims=True) * z_tool
    closing = np.arctan2(np.sum(np.cross(base_from_tool[:, :3, 1], y_kept) * z_tool, axis=1),
                         np.sum(base_from_tool[:, :3, 1] * y_kept, axis=1))
    closing = np.abs(closing)
    if spec.closing == "symmetric":
        closing = np.minimum(closing, np.pi - closing)
    return approach, closing


def task_weights(spec: OrientationSpec, base_from_tool: FloatArray) -> FloatArray:
    """Weights of the orientation rows ``W (B, 3, 3)``: rotation about the approach by ``closing_weight``.

    ``W = approach_weight (I - a a^T) + closing_weight a a^T`` with ``a`` the tool's approach, so that
    ``W e_r`` weights an approach tilt and a roll about the approach separately (``e_r`` a rotation
    vector in the base frame).
    """
    a = base_from_tool[:, :3, 2]
    outer = a[:, :, None] * a[:, None, :]
    closing = 0.0 if spec.closing == "free" else spec.closing_weight
    return spec.approach_weight * (np.eye(3) - outer) + closing * outer
