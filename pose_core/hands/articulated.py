"""Articulated refinement of a metric hand fit: bend the fingers to the 2-D keypoints, bones kept rigid.

A rigid fit (`metric_fit.fit_keypoints`) poses one 3-D hand shape onto the 2-D keypoints; where the
model's articulation is off (a finger bent a little more or less than it is), the whole hand turns
and moves to compromise. Here the palm (wrist, thumb base, finger bases) stays a rigid body and each
of the 15 finger bones may turn away from the model's direction, at its fixed length, so that the
keypoints reproject onto the detections. Two kinds of residuals, in units of their uncertainty:

- reprojection, pixels over `keypoint_sigma_palm` times the hand's palm size in the image (the
  detector's 2-D error grows with the hand's size in the image);
- each bone's turn away from the model's direction, radians over `direction_sigma_rad` (the model
  resolves which way a bone leans in depth; the 2-D keypoints say how far it is foreshortened).

Solved by Levenberg-Marquardt on 36 parameters (palm rotation and translation, two angles per finger
bone), the Jacobian by finite differences evaluated as one batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from pose_core.errors import ShapeError
from pose_core.hands.skeleton import BONES

__all__ = ["ArticulatedOptions", "refine_articulated"]

logger = logging.getLogger(__name__)

_PALM = (0, 1, 5, 9, 13, 17)
_FINGER_BONES = tuple(bone for bone in BONES if bone[0] != 0)
_STEP = 1e-6


@dataclass(frozen=True)
class ArticulatedOptions:
    """Settings of the articulated refinement."""

    # Refine rigid fits of a model's articulated shape (False keeps the rigid fit).
    enabled: bool = True
    # 2-D keypoint uncertainty, fraction of the hand's palm size in the image (mean wrist -> finger
    # base distance, pixels).
    keypoint_sigma_palm: float = 0.05
    # How far a bone may turn from the model's direction, radians (one sigma). Chosen among 0.1-0.6 by
    # the camera-frame error on the first 200 of the real photos with 3-D ground truth (bench/hands.py
    # reports the other 200 too); only its ratio to `keypoint_sigma_palm` matters.
    direction_sigma_rad: float = 0.3
    # Levenberg-Marquardt iterations at most.
    max_iterations: int = 10


def _rotations(rotvec: np.ndarray) -> np.ndarray:
    """Rotation matrices `(B, 3, 3)` of rotation vectors `(B, 3)` (Rodrigues)."""
    theta = np.linalg.norm(rotvec, axis=1)
    axis = rotvec / np.maximum(theta, 1e-12)[:, None]
    cross = np.zeros((len(rotvec), 3, 3))
    cross[:, 0, 1], cross[:, 0, 2], cross[:, 1, 2] = -axis[:, 2], axis[:, 1], -axis[:, 0]
    cross -= cross.transpose(0, 2, 1)
    s, c = np.sin(theta)[:, None, None], np.cos(theta)[:, None, None]
    return np.eye(3) + s * cross + (1.0 - c) * cross @ cross


class _Model:
    """Keypoints of a batch of parameter vectors, camera frame."""

    def __init__(self, shape_m: np.ndarray, cam_from_hand: np.ndarray) -> None:
        self.palm = shape_m[list(_PALM)]
        self.rotation, self.translation = cam_from_hand[:3, :3], cam_from_hand[:3, 3]
        steps = np.array([shape_m[c] - shape_m[p] for p, c in _FINGER_BONES])
        self.lengths = np.linalg.norm(steps, axis=1)
        self.dirs = steps / np.maximum(self.lengths, 1e-12)[:, None]
        helper = np.where(np.abs(self.dirs[:, :1]) < 0.9, [[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]])
        e1 = np.cross(self.dirs, helper)
        e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
        self.e1, self.e2 = e1, np.cross(self.dirs, e1)

    def keypoints(self, params: np.ndarray) -> np.ndarray:
        """`(B, 21, 3)` camera-frame keypoints of parameters `(B, 36)`."""
        batch = len(params)
        local = np.zeros((batch, 21, 3))
        local[:, list(_PALM)] = self.palm
        turn = params[:, 6:].reshape(batch, -1, 2)
        dirs = self.dirs + turn[..., :1] * self.e1 + turn[..., 1:] * self.e2
        dirs *= (self.lengths / np.linalg.norm(dirs, axis=2))[..., None]
        for i, (parent, child) in enumerate(_FINGER_BONES):
            local[:, child] = local[:, parent] + dirs[:, i]
        rotation = _rotations(params[:, :3]) @ self.rotation
        return local @ rotation.transpose(0, 2, 1) + (self.translation + params[:, 3:6])[:, None]


def refine_articulated(
    keypoints_px: np.ndarray,
    shape_m: np.ndarray,
    camera_k: np.ndarray,
    cam_from_hand: np.ndarray,
    opts: ArticulatedOptions,
) -> np.ndarray:
    """Refine a rigid fit: palm pose and finger-bone directions to the 2-D keypoints, bone lengths fixed.

    Args:
        keypoints_px: detected keypoints, pixels, `(21, 2)`, all finite.
        shape_m: the shape of the rigid fit, hand frame, metres, `(21, 3)`.
        camera_k: pinhole intrinsics, pixels, `(3, 3)`.
        cam_from_hand: the rigid fit's pose, `(4, 4)`.
        opts: settings.

    Returns:
        Keypoints in the camera frame, metres, `(21, 3)`; every bone as long as in `shape_m`.

    Raises:
        ShapeError: an input does not have the documented shape.
    """
    if keypoints_px.shape != (21, 2) or shape_m.shape != (21, 3) or cam_from_hand.shape != (4, 4):
        raise ShapeError(
            "keypoints_px / shape_m / cam_from_hand", keypoints_px.shape, "(21, 2), (21, 3), (4, 4)"
        )
    model = _Model(shape_m, cam_from_hand)
    palm_px = np.linalg.norm(keypoints_px[[5, 9, 13, 17]] - keypoints_px[0], axis=1).mean()
    sigma_px = max(opts.keypoint_sigma_palm * palm_px, 1e-3)
    n_params = 6 + 2 * len(_FINGER_BONES)
    probe = np.vstack([np.zeros(n_params), _STEP * np.eye(n_params)])

    def residuals(params: np.ndarray) -> np.ndarray:
        points = model.keypoints(params)
        projected = points @ camera_k.T
        px = projected[..., :2] / np.maximum(projected[..., 2:], 1e-9)
        reprojection = ((px - keypoints_px) / sigma_px).reshape(len(params), -1)
        return np.concatenate([reprojection, params[:, 6:] / opts.direction_sigma_rad], axis=1)

    params, damping = np.zeros(n_params), 1e-3
    current = residuals(params[None])[0]
    for _ in range(opts.max_iterations):
        batch = residuals(params + probe)
        jac = ((batch[1:] - batch[0]) / _STEP).T
        normal = jac.T @ jac
        gradient = jac.T @ current
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-9), -gradient)
        trial = residuals((params + step)[None])[0]
        if trial @ trial < current @ current:
            params, current, damping = params + step, trial, damping * 0.3
            if np.abs(step).max() < 1e-5:
                break
        else:
            damping *= 10.0
    return model.keypoints(params[None])[0]
