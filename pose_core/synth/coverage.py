"""How much of the image the hands cover, from their keypoints alone (no ray casting).

Each hand is drawn into a mask the way `pose_core.synth.render` builds it: the palm (the convex hull of
the wrist, the thumb's CMC and MCP and the four finger MCPs) grown by the palm's half thickness, and
one 2-D capsule per finger bone as wide as the bone's projected radius at its nearer end. Forearms
are not counted. This is the projected silhouette up to perspective's rounding of the solids, so it
can stand in for rendering when a test or a report needs the coverage of every frame.

Convention:
    Keypoints in the camera frame (OpenCV: x right, y down, z forward), metres; hands in MediaPipe
    order. Pixel (u, v) = (column, row), integers at pixel centres.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.synth.render import RenderOptions

__all__ = ["hand_coverage"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

_PALM = [0, 1, 2, 5, 9, 13, 17]
_SUBPIXEL_BITS = 4  # cv2 drawing precision: 1/16 pixel


def hand_coverage(
    hands_in_cam: FloatArray, k: FloatArray, width: int, height: int, opts: RenderOptions
) -> FloatArray:
    """Fraction of the image inside the hands' silhouettes, per frame.

    Args:
        hands_in_cam: keypoints, metres, camera frame, `(F, n_hands, 21, 3)`.
        k: intrinsics, pixels, `(3, 3)`.
        width: image width, pixels.
        height: image height, pixels.
        opts: finger, thumb and palm sizes (and the near plane: parts reaching it are left out, as
            the renderer leaves them out).

    Returns:
        Covered fraction of the `width * height` pixels, in [0, 1], `(F,)` (hands overlapping each
        other count once).

    Raises:
        ShapeError: if `hands_in_cam` is not `(F, n_hands, 21, 3)`.
    """
    kp = np.asarray(hands_in_cam, np.float64)
    if kp.ndim != 4 or kp.shape[2:] != (21, 3):
        raise ShapeError("hands_in_cam", kp.shape, "(F, n_hands, 21, 3)")
    bones = _bone_radii(opts)
    focal = float(np.sqrt(k[0, 0] * k[1, 1]))
    scale = 1 << _SUBPIXEL_BITS
    out = np.zeros(len(kp))
    mask = np.zeros((height, width), np.uint8)
    for f, frame in enumerate(kp):
        mask[:] = 0
        for hand in frame:
            z = hand[:, 2]
            with np.errstate(divide="ignore", invalid="ignore"):
                px = np.round((hand[:, :2] / z[:, None] * np.diag(k)[:2] + k[:2, 2]) * scale)
            if np.all(z[_PALM] > opts.near_m + opts.palm_half_thickness_m):
                hull = cv2.convexHull(px[_PALM].astype(np.int32))
                cv2.fillConvexPoly(mask, hull, 1, cv2.LINE_8, _SUBPIXEL_BITS)
                rim = int(round(2.0 * focal * opts.palm_half_thickness_m / z[_PALM].min()))
                cv2.polylines(mask, [hull], True, 1, max(rim, 1), cv2.LINE_8, _SUBPIXEL_BITS)
            for (a, b), r in bones:
                near_z = min(z[a], z[b])
                if near_z <= opts.near_m + r:
                    continue
                thickness = max(int(round(2.0 * focal * r / near_z)), 1)
                p, q = px[a].astype(np.int64), px[b].astype(np.int64)
                cv2.line(
                    mask,
                    (int(p[0]), int(p[1])),
                    (int(q[0]), int(q[1])),
                    1,
                    thickness,
                    cv2.LINE_8,
                    _SUBPIXEL_BITS,
                )
        out[f] = mask.mean()
    return out


def _bone_radii(opts: RenderOptions) -> list[tuple[tuple[int, int], float]]:
    """Each drawn finger bone (keypoint pair; wrist to MCP lies in the palm) and its larger radius, metres."""
    bones = []
    for base in (1, 5, 9, 13, 17):
        r_base, r_tip = opts.thumb_radii_m if base == 1 else opts.finger_radii_m
        scale = opts.pinky_scale if base == 17 else 1.0
        radii = scale * np.linspace(r_base, r_tip, 4)
        bones += [((base + j, base + j + 1), float(radii[j])) for j in range(3)]
    return bones
