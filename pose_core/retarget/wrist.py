"""The human wrist frame and grip aperture from MediaPipe hand keypoints.

Convention:
    Keypoints are the 21 MediaPipe landmarks (0 wrist, 4 thumb tip, 5 index MCP, 8 index tip,
    17 pinky MCP), metres, in any frame ``X``; the wrist frame is returned as ``X_from_wrist``:

    * origin: keypoint 0;
    * ``z`` (approach): from the wrist towards the midpoint of keypoints 5 and 17 (the knuckles);
    * ``x`` (palm normal): out of the palm, ``side * (k5 - k0) x (k17 - k0)`` made orthogonal to ``z``,
      with ``side = +1`` for a right hand and ``-1`` for a left hand, so ``x`` leaves the palm for both;
    * ``y = z x x``: towards the thumb for a right hand, towards the little finger for a left hand.

    A gripper's tool frame (``z`` approach) relates to it by the fixed rotation ``tcp_from_wrist`` of an
    embodiment profile. Grip aperture is the thumb-tip to index-tip distance (keypoints 4 and 8).
    Frames with a missing (NaN) or degenerate keypoint triangle give a NaN transform.
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError

__all__ = ["as_right_hand", "grip_aperture_from_keypoints", "keypoints_in_wrist", "wrist_from_keypoints"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

_NUM_KEYPOINTS = 21
_WRIST, _THUMB_TIP, _INDEX_MCP, _INDEX_TIP, _PINKY_MCP = 0, 4, 5, 8, 17
_MIN_PALM_M = 1e-4  # palm vectors shorter than this make the frame undefined (NaN)


def _check(keypoints: FloatArray) -> FloatArray:
    keypoints = np.asarray(keypoints, dtype=np.float64)
    if keypoints.ndim < 2 or keypoints.shape[-2:] != (_NUM_KEYPOINTS, 3):
        raise ShapeError("hand keypoints", keypoints.shape, "(..., 21, 3)")
    return keypoints


def wrist_from_keypoints(keypoints_in_x: FloatArray, is_right: bool) -> FloatArray:
    """Wrist frames from keypoints (see the module's Convention).

    Args:
        keypoints_in_x: MediaPipe keypoints, metres, frame ``X``, ``(..., 21, 3)``.
        is_right: True for a right hand.

    Returns:
        ``X_from_wrist``, ``(..., 4, 4)``; NaN where the keypoints are missing or degenerate.

    Raises:
        ShapeError: if the trailing shape is not ``(21, 3)``.
    """
    kp = _check(keypoints_in_x)
    origin = kp[..., _WRIST, :]
    to_index = kp[..., _INDEX_MCP, :] - origin
    to_pinky = kp[..., _PINKY_MCP, :] - origin
    z = 0.5 * (to_index + to_pinky)
    normal = (1.0 if is_right else -1.0) * np.cross(to_index, to_pinky)
    x = normal - np.sum(normal * z, axis=-1, keepdims=True) * z / np.maximum(
        np.sum(z * z, axis=-1, keepdims=True), _MIN_PALM_M**2)
    z_len = np.linalg.norm(z, axis=-1, keepdims=True)
    x_len = np.linalg.norm(x, axis=-1, keepdims=True)
    bad = ~((z_len[..., 0] >= _MIN_PALM_M) & (x_len[..., 0] >= _MIN_PALM_M**2))  # NaN compares False
    z = z / np.maximum(z_len, _MIN_PALM_M)
    x = x / np.maximum(x_len, _MIN_PALM_M**2)
    y = np.cross(z, x)
    out = np.zeros(kp.shape[:-2] + (4, 4))
    out[..., :3, 0], out[..., :3, 1], out[..., :3, 2], out[..., :3, 3] = x, y, z, origin
    out[..., 3, 3] = 1.0
    out[bad] = np.nan
    return out


def grip_aperture_from_keypoints(keypoints: FloatArray) -> FloatArray:
    """Thumb-tip to index-tip distance.

    Args:
        keypoints: MediaPipe keypoints, metres, ``(..., 21, 3)``.

    Returns:
        Aperture, metres, ``(...)``; NaN where a tip is missing.

    Raises:
        ShapeError: if the trailing shape is not ``(21, 3)``.
    """
    kp = _check(keypoints)
    return np.linalg.norm(kp[..., _THUMB_TIP, :] - kp[..., _INDEX_TIP, :], axis=-1)


def keypoints_in_wrist(keypoints_in_x: FloatArray, x_from_wrist: FloatArray) -> FloatArray:
    """Keypoints expressed in their wrist frame.

    Args:
        keypoints_in_x: MediaPipe keypoints, metres, frame ``X``, ``(..., 21, 3)``.
        x_from_wrist: wrist frames (`wrist_from_keypoints`), ``(..., 4, 4)``.

    Returns:
        ``keypoints_in_wrist (..., 21, 3)``; NaN where the wrist frame is NaN.

    Raises:
        ShapeError: if the trailing shape is not ``(21, 3)``.
    """
    kp = _check(keypoints_in_x)
    rot, origin = x_from_wrist[..., :3, :3], x_from_wrist[..., None, :3, 3]
    return np.einsum("...ji,...kj->...ki", rot, kp - origin)


def as_right_hand(keypoints_in_wrist: FloatArray, is_right: bool) -> FloatArray:
    """A left hand's wrist-frame keypoints mirrored into a right hand's (``y -> -y``); a right hand's as is.

    In the wrist frame of a left hand ``y`` points to the little finger, so negating ``y`` gives the
    right hand that mirrors it: a right robot hand can then follow either human hand.
    """
    kp = np.array(keypoints_in_wrist, dtype=np.float64)
    if not is_right:
        kp[..., 1] *= -1.0
    return kp
