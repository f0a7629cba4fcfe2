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

__all__ = ["ArticulatedOptions", "refine_articulated_hands"]

logger = logging.getLogger(__name__)

_PALM = (0, 1, 5, 9, 13, 17)
_FINGER_BONES = tuple(bone for bone in BONES if bone[0] != 0)  # per finger, base to tip: 5 chains of 3
_FINGER_BASES = [parent for parent, _ in _FINGER_BONES[::3]]
_FINGER_JOINTS = [child for _, child in _FINGER_BONES]
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
    """Rotation matrices `(..., 3, 3)` of rotation vectors `(..., 3)` (Rodrigues)."""
    theta = np.linalg.norm(rotvec, axis=-1)
    axis = rotvec / np.maximum(theta, 1e-12)[..., None]
    cross = np.zeros(rotvec.shape + (3,))
    cross[..., 0, 1], cross[..., 0, 2], cross[..., 1, 2] = -axis[..., 2], axis[..., 1], -axis[..., 0]
    cross -= np.swapaxes(cross, -1, -2)
    s, c = np.sin(theta)[..., None, None], np.cos(theta)[..., None, None]
    return np.eye(3) + s * cross + (1.0 - c) * cross @ cross


class _Model:
    """Keypoints of H hands' batches of parameter vectors, camera frame."""

    def __init__(self, shape_m: np.ndarray, cam_from_hand: np.ndarray) -> None:
        """`shape_m (H, 21, 3)`, `cam_from_hand (H, 4, 4)`."""
        self.palm = shape_m[:, list(_PALM)]
        self.rotation, self.translation = cam_from_hand[:, :3, :3], cam_from_hand[:, :3, 3]
        steps = np.stack([shape_m[:, c] - shape_m[:, p] for p, c in _FINGER_BONES], axis=1)  # (H, 15, 3)
        self.lengths = np.linalg.norm(steps, axis=2)
        self.dirs = steps / np.maximum(self.lengths, 1e-12)[..., None]
        helper = np.where(np.abs(self.dirs[..., :1]) < 0.9, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
        e1 = np.cross(self.dirs, helper)
        e1 /= np.linalg.norm(e1, axis=2, keepdims=True)
        self.e1, self.e2 = e1, np.cross(self.dirs, e1)

    def keypoints(self, params: np.ndarray, at: np.ndarray | slice = slice(None)) -> np.ndarray:
        """`(h, B, 21, 3)` camera-frame keypoints of hands `at` (default all) of parameters `(h, B, 36)`."""
        hands, batch = params.shape[:2]
        local = np.zeros((hands, batch, 21, 3))
        local[:, :, list(_PALM)] = self.palm[at, None]
        turn = params[..., 6:].reshape(hands, batch, -1, 2)
        dirs = self.dirs[at, None] + turn[..., :1] * self.e1[at, None] + turn[..., 1:] * self.e2[at, None]
        dirs *= (self.lengths[at, None] / np.linalg.norm(dirs, axis=3))[..., None]
        # each finger's joints: its base plus its bones summed in order, all fingers at once
        chains = np.concatenate(
            [local[:, :, _FINGER_BASES, None], dirs.reshape(hands, batch, 5, 3, 3)], axis=3
        )
        local[:, :, _FINGER_JOINTS] = np.cumsum(chains, axis=3)[:, :, :, 1:].reshape(hands, batch, 15, 3)
        rotation = _rotations(params[..., :3]) @ self.rotation[at, None]
        moved = self.translation[at, None] + params[..., 3:6]
        return local @ np.swapaxes(rotation, -1, -2) + moved[:, :, None]


def refine_articulated_hands(
    keypoints_px: np.ndarray,
    shape_m: np.ndarray,
    camera_k: np.ndarray,
    cam_from_hand: np.ndarray,
    opts: ArticulatedOptions,
) -> np.ndarray:
    """Refine H rigid fits: palm pose and finger-bone directions to the 2-D keypoints, bone lengths fixed.

    Each hand has its own Levenberg-Marquardt (damping, stop), run side by side: a hand's refinement
    costs a few hundred small array operations, and a chunk's hands together cost about as many, not
    H times as many (the hands stage's CPU per frame on a GPU host).

    Args:
        keypoints_px: detected keypoints, pixels, `(H, 21, 2)`, all finite.
        shape_m: the shapes of the rigid fits, hand frame, metres, `(H, 21, 3)`.
        camera_k: pinhole intrinsics, pixels, `(H, 3, 3)`.
        cam_from_hand: the rigid fits' poses, `(H, 4, 4)`.
        opts: settings.

    Returns:
        Keypoints in the camera frame, metres, `(H, 21, 3)`; every bone as long as in `shape_m`.

    Raises:
        ShapeError: an input does not have the documented shape.
    """
    hands = len(keypoints_px)
    expected = ((hands, 21, 2), (hands, 21, 3), (hands, 3, 3), (hands, 4, 4))
    given = (keypoints_px.shape, shape_m.shape, camera_k.shape, cam_from_hand.shape)
    if given != expected:
        raise ShapeError("keypoints_px / shape_m / camera_k / cam_from_hand", given, str(expected))
    if hands == 0:
        return np.zeros((0, 21, 3))
    model = _Model(shape_m, cam_from_hand)
    palm_px = np.linalg.norm(keypoints_px[:, [5, 9, 13, 17]] - keypoints_px[:, :1], axis=2).mean(axis=1)
    sigma_px = np.maximum(opts.keypoint_sigma_palm * palm_px, 1e-3)
    n_params = 6 + 2 * len(_FINGER_BONES)
    probe = np.vstack([np.zeros(n_params), _STEP * np.eye(n_params)])

    def residuals(params: np.ndarray, at: np.ndarray) -> np.ndarray:
        """`(h, B, R)` residuals of hands `at (h,)`' parameters `(h, B, 36)`."""
        points = model.keypoints(params, at)
        projected = points @ np.swapaxes(camera_k[at], -1, -2)[:, None]
        px = projected[..., :2] / np.maximum(projected[..., 2:], 1e-9)
        off = (px - keypoints_px[at, None]) / sigma_px[at, None, None, None]
        reprojection = off.reshape(*params.shape[:2], -1)
        return np.concatenate([reprojection, params[..., 6:] / opts.direction_sigma_rad], axis=2)

    params, damping = np.zeros((hands, n_params)), np.full(hands, 1e-3)
    current = residuals(params[:, None], np.arange(hands))[:, 0]
    running = np.ones(hands, bool)
    for _ in range(opts.max_iterations):
        at = np.flatnonzero(running)
        if len(at) == 0:
            break
        batch = residuals(params[at, None] + probe, at)
        jac = np.swapaxes((batch[:, 1:] - batch[:, :1]) / _STEP, 1, 2)  # (h, R, 36)
        normal = np.swapaxes(jac, 1, 2) @ jac
        gradient = np.einsum("hri,hr->hi", jac, current[at])
        diagonal = np.diagonal(normal, axis1=1, axis2=2) + 1e-9
        damped = normal + damping[at, None, None] * (diagonal[:, :, None] * np.eye(n_params))
        step = np.linalg.solve(damped, -gradient[..., None])[..., 0]
        trial = residuals((params[at] + step)[:, None], at)[:, 0]
        better = np.sum(trial**2, axis=1) < np.sum(current[at] ** 2, axis=1)
        took = at[better]
        params[took] += step[better]
        current[took] = trial[better]
        damping[took] *= 0.3
        damping[at[~better]] *= 10.0
        running[took[np.abs(step[better]).max(axis=1) < 1e-5]] = False
    return model.keypoints(params[:, None])[:, 0]
