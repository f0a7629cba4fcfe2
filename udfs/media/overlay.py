"""Hand skeletons and status text drawn onto video frames (QA pages, optional export video key).

Convention:
    Frames are RGB uint8 `(F, H, W, 3)`. Keypoints are pixels in the frames' own size, MediaPipe
    order, `(F, 21, 2)` per hand identity, NaN where the hand is not in the frame. A filled frame
    (the hand was gap-filled, not seen) is drawn dashed-thin with hollow joints, so a viewer never
    mistakes a filled hand for an observed one.
"""

from __future__ import annotations

import colorsys
import hashlib
import logging
from collections.abc import Mapping, Sequence

import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.geometry.camera import Camera
from pose_core.hands.skeleton import BONES
from pose_core.identities import WEARER_LEFT, WEARER_RIGHT

__all__ = ["HAND_BONES", "draw_hands", "draw_status", "identity_colour", "project_world_points"]

logger = logging.getLogger(__name__)

#: Bones of the 21-keypoint hand, (parent, child): the fingers and the palm's outline.
HAND_BONES: tuple[tuple[int, int], ...] = (*BONES, (5, 9), (9, 13), (13, 17), (0, 17))

#: Fixed colours (RGB) of the wearer's hands; other identities get a colour from their name.
_WEARER_COLOURS = {WEARER_LEFT: (0, 170, 255), WEARER_RIGHT: (255, 80, 40)}


def identity_colour(identity: str) -> tuple[int, int, int]:
    """The RGB colour of a hand identity: fixed for the wearer, stable per name for others."""
    if identity in _WEARER_COLOURS:
        return _WEARER_COLOURS[identity]
    hue = int(hashlib.sha256(identity.encode()).hexdigest()[:4], 16) / 0xFFFF
    r, g, b = colorsys.hsv_to_rgb(0.2 + 0.5 * hue, 0.8, 0.95)  # greens to purples: apart from the wearer's
    return round(255 * r), round(255 * g), round(255 * b)


def _draw_hand(
    img: NDArray[np.uint8], kp: NDArray[np.float64], colour: tuple[int, int, int], filled: bool
) -> None:
    scale = max(1, round(max(img.shape[:2]) / 480))
    pts = np.round(kp).astype(np.int64)
    ok = np.isfinite(kp).all(axis=1)
    for a, b in HAND_BONES:
        if ok[a] and ok[b]:
            cv2.line(img, tuple(pts[a]), tuple(pts[b]), colour, scale if filled else 2 * scale, cv2.LINE_AA)
    for j in np.flatnonzero(ok):
        cv2.circle(img, tuple(pts[j]), 2 * scale, colour, scale if filled else -1, cv2.LINE_AA)


def draw_hands(
    frames: NDArray[np.uint8],
    keypoints_px: Mapping[str, NDArray[np.float64]],
    filled: Mapping[str, NDArray[np.bool_]] | None = None,
) -> NDArray[np.uint8]:
    """Frames with every identity's hand skeleton in its colour.

    Args:
        frames: `(F, H, W, 3)` RGB uint8.
        keypoints_px: identity -> `(F, 21, 2)` pixels; NaN rows/frames are not drawn.
        filled: identity -> `(F,)`, True where that hand was gap-filled (drawn thin and hollow).

    Returns:
        A drawn copy, `(F, H, W, 3)` uint8.

    Raises:
        ShapeError: a keypoint or flag array does not match the frames.
    """
    out = np.array(frames, dtype=np.uint8, copy=True)
    n = len(out)
    for identity, kp in keypoints_px.items():
        mask = np.zeros(n, bool) if filled is None else np.asarray(filled.get(identity, np.zeros(n, bool)))
        if kp.shape != (n, 21, 2) or mask.shape != (n,):
            raise ShapeError(
                f"draw_hands: hand {identity} keypoints, filled",
                (kp.shape, mask.shape),
                f"({n}, 21, 2), ({n},)",
            )
        colour = identity_colour(identity)
        for i in np.flatnonzero(np.isfinite(kp).any(axis=(1, 2))):
            _draw_hand(out[i], kp[i], colour, bool(mask[i]))
    return out


def project_world_points(
    points_world: NDArray[np.float64],
    world_from_cam: NDArray[np.float64],
    camera: Camera,
    metres_per_unit: float = 1.0,
) -> NDArray[np.float64]:
    """Pixels of world points as each frame's camera sees them (to draw world-frame hands on video).

    Args:
        points_world: `(F, N, 3)` world frame, metres (`hands_world`); NaN: absent.
        world_from_cam: `(F, 4, 4)` camera poses, translation in map units; NaN: not posed.
        camera: intrinsics at the frames' pixel size.
        metres_per_unit: metres per map unit (the scale `hands_world` applied; 1 when unscaled).

    Returns:
        `(F, N, 2)` distorted pixels; NaN where the point or pose is missing or behind the camera.
    """
    points_world = np.asarray(points_world, np.float64)
    if (
        points_world.ndim != 3
        or points_world.shape[2] != 3
        or world_from_cam.shape != (len(points_world), 4, 4)
    ):
        raise ShapeError(
            "project_world_points: points, poses",
            (points_world.shape, world_from_cam.shape),
            "(F, N, 3), (F, 4, 4)",
        )
    offset = points_world - metres_per_unit * world_from_cam[:, None, :3, 3]
    in_cam = np.einsum("fji,fnj->fni", world_from_cam[:, :3, :3], offset)  # R^T (X - t)
    return camera.img_from_cam(in_cam.reshape(-1, 3)).reshape(*points_world.shape[:2], 2)


def draw_status(
    frames: NDArray[np.uint8], lines: Sequence[str], colours: Sequence[tuple[int, int, int]] | None = None
) -> NDArray[np.uint8]:
    """Frames with one status line each (tracking state, keyframe, filled hands) in a dark top banner.

    Args:
        frames: `(F, H, W, 3)` RGB uint8.
        lines: one text per frame (ASCII).
        colours: RGB text colour per frame (default white).

    Returns:
        A drawn copy.
    """
    if len(lines) != len(frames):
        raise ShapeError("draw_status: one line per frame", (len(lines),), f"({len(frames)},)")
    out = np.array(frames, dtype=np.uint8, copy=True)
    height = out.shape[1]
    font = max(0.4, height / 900)
    band = int(28 * font / 0.5)
    for i, text in enumerate(lines):
        out[i, :band] = (out[i, :band] * 0.35).astype(np.uint8)
        colour = (255, 255, 255) if colours is None else colours[i]
        cv2.putText(
            out[i], text, (6, int(band * 0.72)), cv2.FONT_HERSHEY_SIMPLEX, font, colour, 1, cv2.LINE_AA
        )
    return out
