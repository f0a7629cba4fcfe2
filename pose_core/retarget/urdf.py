"""URDF reading: the kinematic tree only (joints, origins, axes, limits, mimics); meshes are ignored.

Convention:
    A joint ``j`` with parent link ``p`` and child link ``c`` gives
    ``p_from_c(q) = p_from_joint @ motion(q)``, where ``p_from_joint`` is the URDF ``<origin>``
    (``rpy`` is fixed-axis roll, pitch, yaw: ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``) and
    ``motion(q)`` rotates by ``q`` radians about ``axis`` (revolute, continuous) or translates by
    ``q`` metres along it (prismatic). A mimic joint follows ``q = multiplier * q_src + offset``.
"""

from __future__ import annotations

import logging
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import InputError

__all__ = [
    "MOVABLE_TYPES",
    "UrdfJoint",
    "UrdfModel",
    "matrix_from_xyz_rpy",
    "parse_urdf",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

MOVABLE_TYPES = ("revolute", "continuous", "prismatic")
_KNOWN_TYPES = (*MOVABLE_TYPES, "fixed")


@dataclass(frozen=True)
class UrdfJoint:
    """One URDF joint.

    Attributes:
        name: joint name.
        joint_type: ``revolute``, ``continuous``, ``prismatic`` or ``fixed``.
        parent: parent link name.
        child: child link name.
        parent_from_joint: the ``<origin>`` transform, ``(4, 4)``, metres.
        axis: unit axis in the joint frame, ``(3,)``.
        lower: lower limit, radians or metres (``-inf`` for continuous joints).
        upper: upper limit, radians or metres (``+inf`` for continuous joints).
        velocity: speed limit, rad/s or m/s (``inf`` when the URDF gives none).
        mimic: ``(source joint, multiplier, offset)`` or None.
    """

    name: str
    joint_type: str
    parent: str
    child: str
    parent_from_joint: FloatArray
    axis: FloatArray
    lower: float
    upper: float
    velocity: float
    mimic: tuple[str, float, float] | None


@dataclass(frozen=True)
class UrdfModel:
    """A URDF's kinematic tree.

    Attributes:
        name: robot name.
        root_link: the link that is no joint's child.
        joints: every joint, depth first from the root (parents before children).
    """

    name: str
    root_link: str
    joints: tuple[UrdfJoint, ...]

    def joint(self, name: str) -> UrdfJoint:
        """The joint called ``name``; raises ``KeyError`` naming the known joints."""
        for j in self.joints:
            if j.name == name:
                return j
        raise KeyError(f"no joint {name!r} in URDF {self.name!r}; joints: {[j.name for j in self.joints]}")


def matrix_from_xyz_rpy(xyz: tuple[float, ...] | FloatArray,
                        rpy: tuple[float, ...] | FloatArray) -> FloatArray:
    """Homogeneous transform from a translation and URDF roll-pitch-yaw.

    Args:
        xyz: translation, metres, ``(3,)``.
        rpy: fixed-axis roll, pitch, yaw, radians, ``(3,)``.

    Returns:
        ``(4, 4)`` with rotation ``Rz(yaw) @ Ry(pitch) @ Rx(roll)``.

    Example:
        >>> bool(np.allclose(matrix_from_xyz_rpy((1, 2, 3), (0, 0, 0))[:3, 3], [1, 2, 3]))
        True
    """
    roll, pitch, yaw = (float(v) for v in rpy)
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch),
                              math.cos(yaw), math.sin(yaw))
    out = np.eye(4)
    out[:3, :3] = [
        [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
        [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
        [-sp, cp * sr, cp * cr],
    ]
    out[:3, 3] = np.asarray(xyz, dtype=np.float64)
    return out


def _floats(text: str | None, default: tuple[float, ...]) -> tuple[float, ...]:
    return default if text is None else tuple(float(v) for v in text.split())


def _parse_joint(elem: ET.Element, source: str) -> UrdfJoint:
    name = elem.get("name", "")
    joint_type = elem.get("type", "")
    if joint_type not in _KNOWN_TYPES:
        raise InputError("urdf_invalid", f"joint {name!r} has unsupported type {joint_type!r}", source)
    parent, child = elem.find("parent"), elem.find("child")
    if parent is None or child is None:
        raise InputError("urdf_invalid", f"joint {name!r} lacks <parent> or <child>", source)
    origin = elem.find("origin")
    xyz = _floats(None if origin is None else origin.get("xyz"), (0.0, 0.0, 0.0))
    rpy = _floats(None if origin is None else origin.get("rpy"), (0.0, 0.0, 0.0))
    axis_elem = elem.find("axis")
    axis = np.asarray(_floats(None if axis_elem is None else axis_elem.get("xyz"), (1.0, 0.0, 0.0)))
    if joint_type != "fixed":
        norm = float(np.linalg.norm(axis))
        if norm == 0.0:
            raise InputError("urdf_invalid", f"joint {name!r} has a zero axis", source)
        axis = axis / norm
    limit = elem.find("limit")
    lower, upper, velocity = -math.inf, math.inf, math.inf
    if limit is not None:
        velocity = float(limit.get("velocity", "inf"))
        if joint_type in ("revolute", "prismatic"):
            lower, upper = float(limit.get("lower", "0")), float(limit.get("upper", "0"))
    mimic_elem = elem.find("mimic")
    mimic = None
    if mimic_elem is not None:
        mimic = (mimic_elem.get("joint", ""), float(mimic_elem.get("multiplier", "1")),
                 float(mimic_elem.get("offset", "0")))
    return UrdfJoint(name, joint_type, parent.get("link", ""), child.get("link", ""),
                     matrix_from_xyz_rpy(xyz, rpy), axis, lower, upper, velocity, mimic)


def parse_urdf(text: str, source: str = "<string>") -> UrdfModel:
    """Parse URDF XML into a kinematic tree with joints sorted parents first.

    Args:
        text: the URDF document.
        source: where it came from, for error messages.

    Returns:
        The model.

    Raises:
        InputError: ``urdf_invalid`` for malformed XML, unknown joint types, a forest or a cycle.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError("urdf_invalid", f"not XML: {exc}", source) from exc
    joints = [_parse_joint(e, source) for e in root.findall("joint")]
    links = {e.get("name", "") for e in root.findall("link")}
    children = {j.child for j in joints}
    roots = sorted(links - children) if links else sorted({j.parent for j in joints} - children)
    if len(roots) != 1:
        raise InputError("urdf_invalid", f"expected one root link, found {roots}", source)
    by_parent: dict[str, list[UrdfJoint]] = {}
    for j in joints:
        by_parent.setdefault(j.parent, []).append(j)
    ordered: list[UrdfJoint] = []
    stack = list(reversed(by_parent.get(roots[0], [])))
    while stack:  # depth first, in document order: a finger's joints stay together
        j = stack.pop()
        ordered.append(j)
        stack.extend(reversed(by_parent.get(j.child, [])))
    if len(ordered) != len(joints):
        raise InputError("urdf_invalid", "joints do not form one tree from the root link", source)
    logger.debug("URDF %s: %d joints from root %s", source, len(ordered), roots[0])
    return UrdfModel(root.get("name", ""), roots[0], tuple(ordered))
