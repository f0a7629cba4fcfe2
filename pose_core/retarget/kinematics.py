"""Batched forward kinematics and frame Jacobians of a URDF tree, in numpy.

Convention:
    ``q`` holds the *active* joints (radians or metres) in ``KinematicModel.joint_names`` order.
    Movable joints that are not active are held at a fixed value; mimic joints follow their source.
    Poses are ``base_from_link`` ``(B, L, 4, 4)`` for the requested links. A Jacobian row block is
    ``[v; w]``: the linear velocity of the link origin and the angular velocity, both expressed in the
    base frame, so ``d(p_in_base) = J[:3] @ dq`` and ``d(R) = skew(J[3:] @ dq) @ R``.

Why numpy and not pinocchio: the tree walk here is ~150 lines, has no build or wheel dependency
(``pin`` brings ~480 MB of cmeel packages to every Spark executor) and is batched over configurations,
which the trajectory solver and the multi-start first frame use. Its FK matches pinocchio to 1e-12 m
(measured in the retarget report).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import skew
from pose_core.retarget.urdf import MOVABLE_TYPES, UrdfJoint, UrdfModel

__all__ = ["KinematicModel"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]


class KinematicModel:
    """Forward kinematics of the links a task needs, batched over joint configurations.

    Args:
        urdf: the parsed URDF.
        frames: names of the links whose poses and Jacobians are wanted (``L`` of them).
        base_link: frame the poses are expressed in; must have no active joint above it. Default: root.
        active_joints: joints that ``q`` drives. Default: every movable, non-mimic joint on the path
            from the root to one of ``frames``, in URDF tree order.
        fixed_positions: values of movable joints that are not active (default 0, clipped to limits).

    Raises:
        KeyError: for an unknown link or joint name.
        ValueError: if an active joint is a mimic or fixed joint, or lies above ``base_link``.
    """

    def __init__(
        self,
        urdf: UrdfModel,
        frames: Sequence[str],
        base_link: str | None = None,
        active_joints: Sequence[str] | None = None,
        fixed_positions: Mapping[str, float] | None = None,
    ) -> None:
        by_child = {j.child: j for j in urdf.joints}
        self.frames = tuple(frames)
        self.base_link = base_link or urdf.root_link
        self._root = urdf.root_link
        chain_names: set[str] = set()
        for start in (*self.frames, self.base_link):
            if start != urdf.root_link and start not in by_child:
                raise KeyError(f"no link {start!r} in URDF {urdf.name!r}")
            link = start
            while link in by_child:
                chain_names.add(by_child[link].name)
                link = by_child[link].parent
        chain = [j for j in urdf.joints if j.name in chain_names]
        if active_joints is None:
            active_joints = [j.name for j in chain if j.joint_type in MOVABLE_TYPES and j.mimic is None]
        self.joint_names = tuple(active_joints)
        active = [urdf.joint(n) for n in self.joint_names]
        if any(j.joint_type not in MOVABLE_TYPES or j.mimic is not None for j in active):
            raise ValueError(f"active joints must be movable and not mimic: {self.joint_names}")
        self.lower = np.array([j.lower for j in active])
        self.upper = np.array([j.upper for j in active])
        self.velocity = np.array([j.velocity for j in active])
        self._chain = chain
        self._drive = self._drives(urdf, chain, fixed_positions or {})
        self._movable = [k for k, j in enumerate(chain) if j.joint_type in MOVABLE_TYPES]
        self._skews = {k: skew(chain[k].axis) for k in self._movable}
        self._revolute = np.array([chain[k].joint_type != "prismatic" for k in self._movable])
        # Column map: joint-velocity of movable chain joint m = sum_j map[m, j] * dq_j.
        self._map = np.zeros((len(self._movable), len(self.joint_names)))
        for m, k in enumerate(self._movable):
            idx, mult, _ = self._drive[k]
            if idx >= 0:
                self._map[m, idx] = mult
        self._ancestor = np.array([[self._is_ancestor(by_child, chain[k], f) for k in self._movable]
                                   for f in self.frames], dtype=np.float64).reshape(len(self.frames), -1)
        above_base = [chain[k] for k in self._movable
                      if self._is_ancestor(by_child, chain[k], self.base_link)]
        if any(self._drive[chain.index(j)][0] >= 0 for j in above_base):
            raise ValueError(f"base link {self.base_link!r} moves with an active joint")
        self._base_from_root = np.linalg.inv(self._root_from(np.zeros((1, len(self.joint_names))),
                                                             self.base_link)[0])

    @property
    def num_joints(self) -> int:
        """Number of active joints ``J``."""
        return len(self.joint_names)

    def _drives(self, urdf: UrdfModel, chain: list[UrdfJoint],
                fixed_positions: Mapping[str, float]) -> list[tuple[int, float, float]]:
        """Per chain joint: (active index or -1, multiplier, offset-or-constant value)."""
        index = {n: i for i, n in enumerate(self.joint_names)}
        out = []
        for j in chain:
            if j.name in index:
                out.append((index[j.name], 1.0, 0.0))
            elif j.mimic is not None and j.mimic[0] in index:
                out.append((index[j.mimic[0]], j.mimic[1], j.mimic[2]))
            else:
                value = fixed_positions.get(j.name, 0.0)
                if j.mimic is not None:
                    src = urdf.joint(j.mimic[0])
                    source_value = np.clip(fixed_positions.get(src.name, 0.0), src.lower, src.upper)
                    value = j.mimic[1] * float(source_value) + j.mimic[2]
                out.append((-1, 0.0, float(np.clip(value, j.lower, j.upper))))
        return out

    @staticmethod
    def _is_ancestor(by_child: Mapping[str, UrdfJoint], joint: UrdfJoint, link: str) -> bool:
        while link in by_child:
            if by_child[link] is joint:
                return True
            link = by_child[link].parent
        return False

    def _walk(self, q: FloatArray) -> tuple[dict[str, FloatArray], list[FloatArray]]:
        """Root-frame link poses and, per movable chain joint, its root-frame joint frame."""
        batch = q.shape[0]
        links = {self._root: np.broadcast_to(np.eye(4), (batch, 4, 4))}
        joint_frames = []
        for k, j in enumerate(self._chain):
            root_from_joint = links[j.parent] @ j.parent_from_joint
            if j.joint_type == "fixed":
                links[j.child] = root_from_joint
                continue
            idx, mult, offset = self._drive[k]
            value = mult * q[:, idx] + offset if idx >= 0 else np.full(batch, offset)
            motion = np.broadcast_to(np.eye(4), (batch, 4, 4)).copy()
            if j.joint_type == "prismatic":
                motion[:, :3, 3] = value[:, None] * j.axis
            else:
                k_mat = self._skews[k]
                motion[:, :3, :3] += (np.sin(value)[:, None, None] * k_mat
                                      + (1.0 - np.cos(value))[:, None, None] * (k_mat @ k_mat))
            joint_frames.append(root_from_joint)
            links[j.child] = root_from_joint @ motion
        return links, joint_frames

    def _root_from(self, q: FloatArray, link: str) -> FloatArray:
        links, _ = self._walk(q)
        return links.get(link, np.broadcast_to(np.eye(4), (q.shape[0], 4, 4)))

    def _check(self, q: FloatArray) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != self.num_joints:
            raise ShapeError("joint positions", q.shape, f"(B, {self.num_joints})")
        return q

    def forward(self, q: FloatArray) -> FloatArray:
        """Poses of the requested links.

        Args:
            q: active joint positions, rad or m, ``(B, J)``.

        Returns:
            ``base_from_link``, metres, ``(B, L, 4, 4)``.

        Raises:
            ShapeError: if ``q`` is not ``(B, J)``.
        """
        links, _ = self._walk(self._check(q))
        return self._base_from_root @ np.stack([links[f] for f in self.frames], axis=1)

    def joint_origins(self, q: FloatArray) -> FloatArray:
        """Origins of the movable chain joints (tree order), then of the requested links, base frame.

        A stick figure of an arm: base, shoulder, ..., wrist, end effector.

        Args:
            q: active joint positions, rad or m, ``(B, J)``.

        Returns:
            ``(B, M + L, 3)`` metres, ``M`` movable chain joints.

        Raises:
            ShapeError: if ``q`` is not ``(B, J)``.
        """
        links, joint_frames = self._walk(self._check(q))
        frames = [*joint_frames, *(links[f] for f in self.frames)]
        return (self._base_from_root @ np.stack(frames, axis=1))[..., :3, 3]

    def forward_with_jacobians(self, q: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Poses and base-frame geometric Jacobians of the requested links.

        Args:
            q: active joint positions, rad or m, ``(B, J)``.

        Returns:
            ``base_from_link (B, L, 4, 4)`` and Jacobians ``(B, L, 6, J)``, rows
            ``[v (m/unit); w (rad/unit)]``.

        Raises:
            ShapeError: if ``q`` is not ``(B, J)``.
        """
        links, joint_frames = self._walk(self._check(q))
        poses = self._base_from_root @ np.stack([links[f] for f in self.frames], axis=1)
        if not joint_frames:
            return poses, np.zeros((q.shape[0], len(self.frames), 6, self.num_joints))
        frames = self._base_from_root @ np.stack(joint_frames, axis=1)  # (B, M, 4, 4)
        axes = np.einsum("bmij,mj->bmi", frames[:, :, :3, :3],
                         np.stack([self._chain[k].axis for k in self._movable]))
        origins = frames[:, :, :3, 3]
        points = poses[:, :, :3, 3]  # (B, L, 3)
        lever = points[:, :, None, :] - origins[:, None, :, :]  # (B, L, M, 3)
        axes_b = np.broadcast_to(axes[:, None], lever.shape)
        linear = np.where(self._revolute[:, None], np.cross(axes_b, lever), axes_b)
        angular = np.where(self._revolute[:, None], axes_b, 0.0)
        per_joint = np.concatenate([linear, angular], axis=-1) * self._ancestor[None, :, :, None]
        return poses, np.einsum("blmc,mj->blcj", per_joint, self._map)
