"""Rotated square regions of interest around hands: palm-detector decoding and crop geometry.

This is the geometry of MediaPipe's hand pipeline (SSD anchors of the 192x192 full palm detector,
weighted non-maximum suppression, the rotated hand rectangle, and the rectangle that tracks a hand
from its previous keypoints), written in pixels of the full image, plus the zoomed square windows
(`detection_windows`, `square_crop`) in which the palm detector also looks for small hands and hands
cut by the frame's edge, and the regions along the bottom edge in which the landmark model looks for
hands whose palm is out of view (`edge_regions`).

Convention: a `RotatedRect` with centre `c`, size `(w, h)` and angle `r` maps a point `(u, v)` of its
own frame (centred, x right, y down, pixels) to the image at `c + R(r) @ (u, v)`, with
`R(r) = [[cos r, -sin r], [sin r, cos r]]`; `r = 0` is a hand with its fingers pointing up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

__all__ = [
    "PalmDecodeOptions",
    "RotatedRect",
    "crop_rect",
    "decode_palms",
    "detection_windows",
    "edge_regions",
    "letterbox",
    "palm_anchors",
    "rect_from_keypoints",
    "rect_from_palm",
    "square_crop",
    "ssd_anchors",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PalmDecodeOptions:
    """Decoding of the palm detector's raw outputs (values of MediaPipe's palm_detection_full graph)."""

    # Side of the square detector input, pixels.
    input_size: int = 192
    # Minimum palm score (after the sigmoid) to keep a detection.
    min_score: float = 0.5
    # Boxes overlapping more than this IoU are merged (weighted non-maximum suppression).
    nms_iou: float = 0.3
    # Raw logits are clipped to +-this before the sigmoid.
    score_clip: float = 100.0


@dataclass(frozen=True)
class RotatedRect:
    """A rotated rectangle in the image, pixels and radians (see the module's convention)."""

    cx: float
    cy: float
    w: float
    h: float
    angle: float

    def transformed(self, scale: float, shift_y: float) -> RotatedRect:
        """Shift along the rect's own y by `shift_y * h`, make it square (long side), scale it."""
        c, s = np.cos(self.angle), np.sin(self.angle)
        dy = shift_y * self.h
        side = max(self.w, self.h) * scale
        return RotatedRect(self.cx - s * dy, self.cy + c * dy, side, side, self.angle)

    def image_from_rect(self) -> np.ndarray:
        """Affine map, `(2, 3)`, from the rect's unit square `[0, 1]^2` (x right, y down) to pixels."""
        c, s = np.cos(self.angle), np.sin(self.angle)
        rot = np.array([[c, -s], [s, c]]) @ np.diag([self.w, self.h])
        origin = np.array([self.cx, self.cy]) - rot @ np.array([0.5, 0.5])
        return np.hstack([rot, origin[:, None]])


def _normalize_angle(angle: float) -> float:
    return float(angle - 2.0 * np.pi * np.floor((angle + np.pi) / (2.0 * np.pi)))


def _angle_up(start_px: np.ndarray, end_px: np.ndarray) -> float:
    """Rect angle that turns the direction start -> end (pixels) to 'up' in the rect."""
    dx, dy = end_px - start_px
    return _normalize_angle(np.pi / 2.0 - np.arctan2(-dy, dx))


def ssd_anchors(input_size: int, layers: tuple[tuple[int, int], ...]) -> np.ndarray:
    """SSD anchor centres of a MediaPipe (BlazePalm/BlazeFace) detector, in units of the input side.

    Args:
        input_size: side of the square detector input, pixels.
        layers: `(stride, anchors per cell)` per feature map, in the detector's output order.

    Returns:
        Anchor centres `(A, 2)`, x then y, in [0, 1]; fixed anchor size 1.
    """
    centres = []
    for stride, per_cell in layers:
        n = input_size // stride
        ys, xs = np.meshgrid((np.arange(n) + 0.5) / n, (np.arange(n) + 0.5) / n, indexing="ij")
        cell = np.stack([xs.ravel(), ys.ravel()], axis=-1)
        centres.append(np.repeat(cell, per_cell, axis=0))
    return np.concatenate(centres, axis=0)


def palm_anchors(input_size: int = 192) -> np.ndarray:
    """SSD anchor centres of the full palm detector, in units of the input side, `(2016, 2)`.

    Strides 8 (2 anchors per cell) and 16 (three layers of 2 anchors each, merged); fixed anchor size 1.
    """
    return ssd_anchors(input_size, ((8, 2), (16, 6)))


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, float, np.ndarray]:
    """Fit `image` `(H, W, 3)` uint8 into a black `(size, size, 3)` float32 square in [0, 1], centred.

    Returns:
        The square, the scale (square pixels per image pixel) and the offset `(2,)` (x, y) of the
        image in the square: `square_px = image_px * scale + offset`.
    """
    height, width = image.shape[:2]
    scale = size / max(height, width)
    new_w, new_h = round(width * scale), round(height * scale)
    pad_x, pad_y = (size - new_w) // 2, (size - new_h) // 2
    square = np.zeros((size, size, 3), np.float32)
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)
    square[pad_y : pad_y + new_h, pad_x : pad_x + new_w] = resized.astype(np.float32) / 255.0
    return square, scale, np.array([pad_x, pad_y], np.float64)


def square_crop(
    image: np.ndarray, x0: float, y0: float, side: float, size: int
) -> tuple[np.ndarray, float, np.ndarray]:
    """The square `[x0, x0 + side) x [y0, y0 + side)` of `image` `(H, W, 3)` uint8, pixels, resized to `size`.

    The square may reach beyond the image: that part is black, as in `letterbox`.

    Returns:
        The `(size, size, 3)` float32 square in [0, 1], the scale (square pixels per image pixel) and
        the offset `(2,)` (x, y): `square_px = image_px * scale + offset`.
    """
    height, width = image.shape[:2]
    scale = size / side
    ix0, iy0 = max(int(np.ceil(x0)), 0), max(int(np.ceil(y0)), 0)
    ix1, iy1 = min(int(np.floor(x0 + side)), width), min(int(np.floor(y0 + side)), height)
    square = np.zeros((size, size, 3), np.float32)
    if ix1 <= ix0 or iy1 <= iy0:
        return square, scale, np.array([-x0 * scale, -y0 * scale])
    px0, py0 = round((ix0 - x0) * scale), round((iy0 - y0) * scale)
    new_w = min(max(round((ix1 - ix0) * scale), 1), size - px0)
    new_h = min(max(round((iy1 - iy0) * scale), 1), size - py0)
    part = cv2.resize(image[iy0:iy1, ix0:ix1], (new_w, new_h), interpolation=cv2.INTER_AREA)
    square[py0 : py0 + new_h, px0 : px0 + new_w] = part.astype(np.float32) / 255.0
    offset = np.array([px0 - ix0 * new_w / (ix1 - ix0), py0 - iy0 * new_h / (iy1 - iy0)])
    return square, float(new_w / (ix1 - ix0)), offset


def detection_windows(
    height: int, width: int, fraction: float, padding: float, overlap: float
) -> list[tuple[float, float, float]]:
    """Overlapping square windows over a frame, reaching beyond its edges, for zoomed palm detection.

    Args:
        height: frame height, pixels.
        width: frame width, pixels.
        fraction: window side as a fraction of the frame's long side (0 gives no windows).
        padding: how far the windows reach beyond the frame's edges, fraction of their side.
        overlap: least overlap of neighbouring windows, fraction of their side.

    Returns:
        `(x0, y0, side)` of each window, pixels, row by row from the top left; one row (column) centred
        on the frame where the side is at least the frame's height (width).
    """
    if fraction <= 0:
        return []
    side = fraction * max(height, width)
    pad = padding * side

    def starts(extent: float) -> np.ndarray:
        span = extent + 2.0 * pad - side
        if side >= extent:
            return np.array([(extent - side) / 2.0])
        count = int(np.ceil(span / (side * (1.0 - overlap)))) + 1
        return np.linspace(-pad, extent + pad - side, count)

    return [(float(x), float(y), side) for y in starts(height) for x in starts(width)]


def edge_regions(
    height: int, width: int, count: int, side_fraction: float, reach: float
) -> list[RotatedRect]:
    """Upright square regions side by side along the frame's bottom edge, for the landmark model.

    A first-person wearer's hand often enters from the bottom edge with its palm out of view, where
    the palm detector has nothing to find; the landmark model, run in a region around the hand's
    visible part, still finds it (its presence score is the detector).

    Args:
        height: frame height, pixels.
        width: frame width, pixels.
        count: number of regions (0 gives none); their centres are spread evenly across the width.
        side_fraction: region side as a fraction of the frame's short side.
        reach: how far each region reaches below the bottom edge, fraction of its side.

    Returns:
        The regions, left to right, in pixels of the frame.
    """
    if count <= 0:
        return []
    side = side_fraction * min(height, width)
    cy = height + reach * side - side / 2.0
    centres_x = (np.arange(count) + 0.5) * width / count
    return [RotatedRect(float(cx), float(cy), side, side, 0.0) for cx in centres_x]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box `(4,)` with boxes `(N, 4)`, both `x0, y0, x1, y1`."""
    ix = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0.0, None)
    iy = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0.0, None)
    inter = ix * iy
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-12)


def decode_palms(
    raw_boxes: np.ndarray, raw_scores: np.ndarray, anchors: np.ndarray, opts: PalmDecodeOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode and suppress palm detections, in units of the detector input.

    MediaPipe's face detectors have the same output layout (6 keypoints instead of 7), so
    `pose_core.privacy.faces` decodes with this too; the keypoint count follows `raw_boxes`.

    Args:
        raw_boxes: detector box output, `(2016, 18)`: centre offset, size, then 7 keypoints (x, y).
        raw_scores: detector logits, `(2016,)` or `(2016, 1)`.
        anchors: from `palm_anchors`, `(2016, 2)`.
        opts: decoding options.

    Returns:
        boxes `(P, 4)` (x0, y0, x1, y1), keypoints `(P, 7, 2)` (0 = wrist centre, 2 = middle-finger
        base), scores `(P,)`; coordinates in [0, 1] of the detector input, best first.
    """
    n_kps = (raw_boxes.shape[-1] - 4) // 2
    scale = float(opts.input_size)
    logits = np.clip(raw_scores.reshape(-1).astype(np.float64), -opts.score_clip, opts.score_clip)
    scores = 1.0 / (1.0 + np.exp(-logits))
    keep = np.flatnonzero(scores >= opts.min_score)
    if keep.size == 0:
        return np.zeros((0, 4)), np.zeros((0, n_kps, 2)), np.zeros(0)
    raw = raw_boxes[keep] / scale
    centre = raw[:, :2] + anchors[keep]
    half = raw[:, 2:4] / 2.0
    boxes = np.hstack([centre - half, centre + half])
    kps = raw[:, 4:].reshape(-1, n_kps, 2) + anchors[keep][:, None, :]
    order = np.argsort(-scores[keep])
    boxes, kps, sc = boxes[order], kps[order], scores[keep][order]
    out_boxes, out_kps, out_scores = [], [], []
    remaining = np.arange(len(sc))
    while remaining.size:
        overlap = _iou(boxes[remaining[0]], boxes[remaining]) > opts.nms_iou
        overlap[0] = True  # the best box always leaves, even a degenerate one
        members = remaining[overlap]
        weights = sc[members] / sc[members].sum()
        out_boxes.append(weights @ boxes[members])
        out_kps.append(np.tensordot(weights, kps[members], axes=1))
        out_scores.append(sc[remaining[0]])
        remaining = remaining[~overlap]
    return np.array(out_boxes), np.array(out_kps), np.array(out_scores)


def rect_from_palm(box_px: np.ndarray, keypoints_px: np.ndarray) -> RotatedRect:
    """Hand rectangle from one palm detection (pixels): rotate wrist->middle base to up, grow x2.6.

    Args:
        box_px: palm box `(4,)`, x0, y0, x1, y1, pixels.
        keypoints_px: palm keypoints `(7, 2)`, pixels.
    """
    angle = _angle_up(keypoints_px[0], keypoints_px[2])
    rect = RotatedRect(
        (box_px[0] + box_px[2]) / 2.0, (box_px[1] + box_px[3]) / 2.0,
        box_px[2] - box_px[0], box_px[3] - box_px[1], angle,
    )  # fmt: skip
    return rect.transformed(scale=2.6, shift_y=-0.5)


# Keypoints that bound the hand's next rectangle: wrist, thumb base and each finger's first two joints.
_TRACK_SUBSET = (0, 1, 2, 3, 5, 6, 9, 10, 13, 14, 17, 18)


def rect_from_keypoints(keypoints_px: np.ndarray) -> RotatedRect:
    """Hand rectangle for the next frame from this frame's 21 keypoints `(21, 2)`, pixels."""
    pts = keypoints_px[list(_TRACK_SUBSET)]
    target = ((keypoints_px[5] + keypoints_px[13]) / 2.0 + keypoints_px[9]) / 2.0
    angle = _angle_up(keypoints_px[0], target)
    c, s = np.cos(angle), np.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    centre0 = (pts.min(axis=0) + pts.max(axis=0)) / 2.0
    local = (pts - centre0) @ rot  # rows: R^T (p - c0), the rect's own frame
    lo, hi = local.min(axis=0), local.max(axis=0)
    centre = rot @ ((lo + hi) / 2.0) + centre0
    rect = RotatedRect(float(centre[0]), float(centre[1]), float(hi[0] - lo[0]), float(hi[1] - lo[1]), angle)
    return rect.transformed(scale=2.0, shift_y=-0.1)


def crop_rect(image: np.ndarray, rect: RotatedRect, size: int) -> np.ndarray:
    """Cut `rect` out of `image` `(H, W, 3)` into a `(size, size, 3)` float32 array in [0, 1], upright."""
    img_from_unit = rect.image_from_rect()
    unit_from_out = np.diag([1.0 / size, 1.0 / size])
    img_from_out = np.hstack([img_from_unit[:, :2] @ unit_from_out, img_from_unit[:, 2:]])
    out = cv2.warpAffine(
        image, img_from_out, (size, size),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE,
    )  # fmt: skip
    return out.astype(np.float32) / 255.0
