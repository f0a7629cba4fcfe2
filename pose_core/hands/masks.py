"""Hand boxes and masks for the tracking stage (so camera tracking ignores moving hands)."""

from __future__ import annotations

import logging

import cv2
import numpy as np

from pose_core.hands.estimator import FINGER_CHAINS

__all__ = ["hand_box", "hand_mask"]

logger = logging.getLogger(__name__)


def hand_box(keypoints_px: np.ndarray, margin: float = 0.15) -> np.ndarray:
    """Axis-aligned box around a hand's keypoints, grown by `margin` of its size on each side.

    Args:
        keypoints_px: keypoints, pixels, `(21, 2)`; NaN rows are ignored.
        margin: growth per side as a fraction of the box's larger side.

    Returns:
        `(4,)` x0, y0, x1, y1 in pixels (not clipped to the image).
    """
    pts = keypoints_px[np.isfinite(keypoints_px).all(axis=1)]
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    pad = margin * float((hi - lo).max())
    return np.concatenate([lo - pad, hi + pad])


def hand_mask(
    hands_px: list[np.ndarray], image_size: tuple[int, int], thickness_px: float = 0.25
) -> np.ndarray:
    """Mask of the hands in one image: the palm polygon plus each finger as a thick polyline.

    Args:
        hands_px: keypoints of each hand, pixels, `(21, 2)` each.
        image_size: (width, height), pixels.
        thickness_px: finger thickness as a fraction of the hand's palm size (wrist to middle-finger base).

    Returns:
        `(H, W)` bool mask, True on hands.
    """
    width, height = image_size
    mask = np.zeros((height, width), np.uint8)
    for kp in hands_px:
        if not np.isfinite(kp).all():
            continue
        palm = cv2.convexHull(kp[[0, 1, 2, 5, 9, 13, 17]].astype(np.int32))
        cv2.fillConvexPoly(mask, palm, 1)
        size = float(np.linalg.norm(kp[9] - kp[0]))
        thick = max(2, round(thickness_px * size))
        for chain in FINGER_CHAINS:
            cv2.polylines(mask, [kp[list(chain)].astype(np.int32)], False, 1, thick)
    return mask.astype(bool)
