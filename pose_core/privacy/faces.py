"""Face blurring for exported video: find faces with MediaPipe's face detector, pixelate them.

Privacy default: every exported frame goes through `FaceBlurrer.blur`; `FaceBlurOptions.enabled`
is the documented switch (off = frames pass unchanged). The detector is one of MediaPipe's BlazeFace
models (from the mediapipe 0.10.21 wheel, cached by ``python -m conf.models``) run with the LiteRT
interpreter: ``short_range`` (128 px input, faces within ~2 m) or ``full_range`` (192 px, to ~5 m).
bench/faces.py measures both against OpenCV's Haar cascade (bench/results/faces.md): full-range
with a 2x tile pass finds real heads of 1280x720 scenes from ~48 px (every one from 96 px) with the
fewest false detections, at the price of some detections on hands. Small faces in a large frame are
found by extra passes over overlapping square tiles (`FaceBlurOptions.tiles`). Given the wearer's hand
boxes (the export has them), a detection lying mostly inside one is that hand and is left sharp: on
the shared real hand video every detection on a hand is >= 78 % inside the hand's keypoint box, while
real faces in the shared photos of people with hands are <= 34 % inside one.

Video is not detected frame by frame: a batch is detected on key frames at most
`FaceBlurOptions.detect_every` apart (its first and last frame among them), and a frame between two
key frames takes their faces, a face seen at both ends moved linearly between them (`carry_faces`).
The detector is most of an export's cost (five passes a frame); a face that moves between key frames
stays covered by the blur's margin, and one seen at only one end is blurred where it was seen.

The blur is irreversible: each face box, grown by `margin`, is averaged down to `blur_cells` cells
along its long side and smoothed back up, so at most `blur_cells`^2 colours of the face survive.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import cv2
import numpy as np

__all__ = [
    "DETECTORS",
    "DetectorSpec",
    "FaceBlurOptions",
    "FaceBlurrer",
    "carry_faces",
    "key_frames",
    "keypoint_boxes",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectorSpec:
    """One MediaPipe face detector: its cached model file and its SSD anchor layout."""

    model: str  # the model file's name (set-up caches it under this name)
    input_size: int  # side of the square input, pixels
    layers: tuple[tuple[int, int], ...]  # (stride, anchors per cell) per feature map


DETECTORS: dict[str, DetectorSpec] = {
    "short_range": DetectorSpec("face_detection_short_range.tflite", 128, ((8, 2), (16, 6))),
    "full_range": DetectorSpec("face_detection_full_range_sparse.tflite", 192, ((4, 1),)),
}


@dataclass(frozen=True)
class FaceBlurOptions:
    """Face blurring of exported video frames."""

    # Blur faces in every exported frame; False passes frames unchanged (only for data without bystanders).
    enabled: bool = True
    # MediaPipe face detector: "short_range" (faces within ~2 m) or "full_range" (to ~5 m, smaller faces).
    detector: Literal["short_range", "full_range"] = "full_range"
    # Detections with a lower score are not blurred; lower finds more faces and blurs more non-faces.
    min_score: float = 0.5
    # Detections overlapping more than this IoU are merged (weighted non-maximum suppression).
    nms_iou: float = 0.3
    # Detection passes: 1 = the whole frame; n > 1 = overlapping square tiles ~1/n of the long side
    # (finds faces too small for the whole-frame pass, at the cost of one detector run per tile).
    tiles: tuple[int, ...] = (1, 2)
    # Each face box is grown by this fraction of its side on every side before blurring.
    margin: float = 0.5
    # Blur strength: the grown box is averaged down to this many cells along its long side.
    blur_cells: int = 4
    # A detection with more than this fraction of its box inside a wearer hand's keypoint box is that
    # hand, not a face, and stays sharp (the face model fires on hands); 1 blurs those too.
    hand_cover_max: float = 0.6
    # LiteRT interpreter threads; 1 when Spark already runs one task per core.
    num_threads: int = 1
    # Video: run the detector on key frames at most this many frames apart (each batch's first and last
    # among them); frames between take the key frames' faces, moved linearly (`carry_faces`). 1 detects
    # in every frame.
    detect_every: int = 4

    def __post_init__(self) -> None:
        if self.detector not in DETECTORS:
            raise ValueError(f"faces.detector must be one of {sorted(DETECTORS)}, got {self.detector!r}")
        if not self.tiles or min(self.tiles) < 1:
            raise ValueError(f"faces.tiles must be a non-empty list of integers >= 1, got {self.tiles}")
        if self.blur_cells < 1 or self.margin < 0:
            raise ValueError(f"faces.blur_cells must be >= 1 and faces.margin >= 0, got {self}")
        if not 0.0 < self.hand_cover_max <= 1.0:
            raise ValueError(f"faces.hand_cover_max must be in (0, 1], got {self.hand_cover_max}")
        if self.detect_every < 1:
            raise ValueError(f"faces.detect_every must be >= 1, got {self.detect_every}")


def keypoint_boxes(keypoints_px: np.ndarray) -> list[np.ndarray]:
    """Per frame, the boxes of the hands seen in it.

    Args:
        keypoints_px: `(N, H, K, 2)` pixels of H hands' K keypoints per frame; NaN: not there.

    Returns:
        N arrays `(h, 4)` (x0, y0, x1, y1): one per hand with a finite keypoint in that frame.
    """
    out = []
    for frame in keypoints_px:
        boxes = []
        for hand in frame:
            seen = hand[np.isfinite(hand).all(axis=1)]
            if len(seen):
                boxes.append(np.concatenate([seen.min(axis=0), seen.max(axis=0)]))
        out.append(np.array(boxes, np.float64).reshape(-1, 4))
    return out


def _inside_fraction(faces: np.ndarray, hands: np.ndarray) -> np.ndarray:
    """`(M,)` the largest fraction of each face box `(M, 4)` inside one of the hand boxes `(K, 4)`."""
    if len(hands) == 0:
        return np.zeros(len(faces))
    lo = np.maximum(faces[:, None, :2], hands[None, :, :2])
    hi = np.minimum(faces[:, None, 2:], hands[None, :, 2:])
    overlap = np.clip(hi - lo, 0, None).prod(axis=2)
    area = np.clip(faces[:, 2:] - faces[:, :2], 1e-9, None).prod(axis=1)
    return (overlap / area[:, None]).max(axis=1)


def _axis_starts(length: int, side: int) -> list[int]:
    """Start offsets of tiles of `side` covering `[0, length)` with at least 20 % overlap."""
    if side >= length:
        return [0]
    count = math.ceil((length - side) / (0.8 * side)) + 1
    return [round(v) for v in np.linspace(0, length - side, count)]


def tile_boxes(height: int, width: int, levels: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Detection windows `(x0, y0, x1, y1)` in pixels: the frame, then square tiles per level.

    Level n > 1 has square tiles of side ~1.25 * long side / n (never more than the short side).
    """
    windows = []
    for level in sorted(set(levels)):
        if level == 1:
            windows.append((0, 0, width, height))
            continue
        side = min(height, width, round(1.25 * max(height, width) / level))
        for y0 in _axis_starts(height, side):
            windows.extend((x0, y0, x0 + side, y0 + side) for x0 in _axis_starts(width, side))
    return windows


def _merge(boxes: np.ndarray, scores: np.ndarray, min_cover: float = 0.5) -> np.ndarray:
    """Indices of boxes `(M, 4)` kept after merging the same face seen in several windows.

    A box is dropped when a better one covers at least `min_cover` of the smaller of the two (a face
    cut by a tile edge overlaps its whole-face detection little by IoU but much by this measure).
    """
    keep: list[int] = []
    area = np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0.0, None), axis=1)
    for i in np.argsort(-scores):
        dup = False
        for j in keep:
            lo, hi = np.maximum(boxes[i, :2], boxes[j, :2]), np.minimum(boxes[i, 2:], boxes[j, 2:])
            wh = np.clip(hi - lo, 0.0, None)
            if wh.prod() >= min_cover * max(min(area[i], area[j]), 1e-9):
                dup = True
                break
        if not dup:
            keep.append(int(i))
    return np.array(keep, np.int64)


def key_frames(count: int, every: int) -> np.ndarray:
    """Indices of the key frames of a batch of ``count`` frames, ``(K,)``.

    Evenly spaced, at most ``every`` apart, the first and the last frame included.
    """
    if count <= 0:
        return np.zeros(0, np.int64)
    gaps = max(1, math.ceil((count - 1) / every))
    return np.unique(np.round(np.linspace(0, count - 1, gaps + 1)).astype(np.int64))


def _matched_pairs(
    before: np.ndarray, after: np.ndarray, max_size_ratio: float = 2.0
) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of boxes ``(M, 4)`` and ``(N, 4)`` taken for one face.

    Nearest centres first, sizes within ``max_size_ratio``, each box in at most one pair.
    """
    if len(before) == 0 or len(after) == 0:
        return []
    centre_a, centre_b = (before[:, :2] + before[:, 2:]) / 2, (after[:, :2] + after[:, 2:]) / 2
    side_a = (before[:, 2:] - before[:, :2]).max(axis=1)
    side_b = (after[:, 2:] - after[:, :2]).max(axis=1)
    distance = np.linalg.norm(centre_a[:, None] - centre_b[None], axis=2)
    larger, smaller = np.maximum(side_a[:, None], side_b[None]), np.minimum(side_a[:, None], side_b[None])
    distance[larger > max_size_ratio * smaller] = np.inf
    pairs: list[tuple[int, int]] = []
    used_a, used_b = set(), set()
    for flat in np.argsort(distance, axis=None):
        i, j = map(int, np.unravel_index(flat, distance.shape))
        if not np.isfinite(distance[i, j]):
            break
        if i not in used_a and j not in used_b:
            pairs.append((i, j))
            used_a.add(i)
            used_b.add(j)
    return pairs


def carry_faces(before: np.ndarray, after: np.ndarray, t: float) -> np.ndarray:
    """Face boxes of a frame between two key frames, ``(M, 4)``.

    Args:
        before: boxes ``(M, 4)`` (x0, y0, x1, y1) found in the key frame before.
        after: boxes ``(N, 4)`` found in the key frame after.
        t: where the frame lies between them, ``0 < t < 1``.

    Returns:
        A face found in both key frames (`_matched_pairs`) where the line between its two boxes puts
        it; a face found in only one, where it was found.
    """
    pairs = _matched_pairs(before, after)
    moved = [before[i] + t * (after[j] - before[i]) for i, j in pairs]
    matched_a, matched_b = {i for i, _ in pairs}, {j for _, j in pairs}
    alone_a = [b for i, b in enumerate(before) if i not in matched_a]
    alone_b = [b for j, b in enumerate(after) if j not in matched_b]
    return np.array([*moved, *alone_a, *alone_b], np.float64).reshape(-1, 4)


class FaceBlurrer:
    """Finds faces in RGB frames and pixelates them; the model is loaded once per instance.

    Args:
        opts: blurring settings.
        model_path: the `.tflite` file of `opts.detector` (`DETECTORS[...].model`; the pipeline's is
            `udfs.models.face_blurrer`). Needed only when `opts.enabled`.

    Raises:
        ValueError: blurring is enabled and no model file is given.
    """

    def __init__(self, opts: FaceBlurOptions | None = None, model_path: Path | None = None) -> None:
        self.opts = opts or FaceBlurOptions()
        # pose_core.hands imports at first use: the package pulls in scipy and fusion, and the exporter
        # imports this module on every Spark worker for FaceBlurOptions even with blurring off.
        from pose_core.hands.rois import PalmDecodeOptions, ssd_anchors  # noqa: PLC0415

        self._spec = DETECTORS[self.opts.detector]
        self._decode = PalmDecodeOptions(
            input_size=self._spec.input_size, min_score=self.opts.min_score, nms_iou=self.opts.nms_iou
        )
        self._anchors = ssd_anchors(self._spec.input_size, self._spec.layers)
        self._interp = None
        if self.opts.enabled:
            from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 -- heavy; only when enabled

            if model_path is None:
                raise ValueError(f"face blurring is enabled: pass the {self._spec.model} model file")
            self._interp = Interpreter(model_path=str(model_path), num_threads=self.opts.num_threads)
            self._interp.allocate_tensors()

    def detect(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Faces in one RGB image `(H, W, 3)` uint8.

        Returns:
            Boxes `(M, 4)` (x0, y0, x1, y1, pixels, not grown by the margin) and scores `(M,)`,
            one per face (detections of the same face in several windows merged).
        """
        if self._interp is None:
            return np.zeros((0, 4)), np.zeros(0)
        from pose_core.hands.rois import decode_palms, letterbox  # noqa: PLC0415 -- see __init__

        size = self._spec.input_size
        inp, out = self._interp.get_input_details()[0], self._interp.get_output_details()
        all_boxes, all_scores = [np.zeros((0, 4))], [np.zeros(0)]
        height, width = image.shape[:2]
        for x0, y0, x1, y1 in tile_boxes(height, width, self.opts.tiles):
            square, scale, offset = letterbox(image[y0:y1, x0:x1], size)
            self._interp.set_tensor(inp["index"], (square * 2.0 - 1.0)[None])  # the model takes [-1, 1]
            self._interp.invoke()
            raw_boxes = self._interp.get_tensor(out[0]["index"])[0]
            raw_scores = self._interp.get_tensor(out[1]["index"])[0]
            boxes, _, scores = decode_palms(raw_boxes, raw_scores, self._anchors, self._decode)
            corners = (boxes.reshape(-1, 2, 2) * size - offset) / scale + np.array([x0, y0])
            all_boxes.append(corners.reshape(-1, 4))
            all_scores.append(scores)
        boxes, scores = np.concatenate(all_boxes), np.concatenate(all_scores)
        keep = _merge(boxes, scores)
        return boxes[keep], scores[keep]

    def faces(
        self, frames_rgb: np.ndarray, hand_boxes: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """The face boxes to blur in each frame of a batch (consecutive video frames).

        Detected on the key frames (`key_frames`: `detect_every` apart), where a detection more than
        `hand_cover_max` inside a wearer hand's box is that hand and left out; carried to the frames
        between (`carry_faces`).

        Args:
            frames_rgb: RGB frames `(N, H, W, 3)` uint8.
            hand_boxes: per frame the wearer's hand boxes `(h, 4)` (`keypoint_boxes`), or None.

        Returns:
            N arrays `(m, 4)` (x0, y0, x1, y1, pixels, not grown by the margin); empty when disabled.
        """
        if not self.opts.enabled:
            return [np.zeros((0, 4)) for _ in frames_rgb]
        keys = key_frames(len(frames_rgb), self.opts.detect_every)
        found = {}
        for k in map(int, keys):
            boxes = self.detect(frames_rgb[k])[0]
            if hand_boxes is not None and len(boxes):
                boxes = boxes[_inside_fraction(boxes, hand_boxes[k]) <= self.opts.hand_cover_max]
            found[k] = boxes
        out = []
        for i in range(len(frames_rgb)):
            at = int(np.searchsorted(keys, i))  # keys[at] is i or the next key frame after it
            if keys[at] == i:
                out.append(found[i])
                continue
            before, after = int(keys[at - 1]), int(keys[at])
            out.append(carry_faces(found[before], found[after], (i - before) / (after - before)))
        return out

    def blur(
        self, frames_rgb: np.ndarray, hand_boxes: Sequence[np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Blur every face in a batch of consecutive frames (`faces`).

        Args:
            frames_rgb: RGB frames `(N, H, W, 3)` uint8; not modified.
            hand_boxes: per frame the wearer's hand boxes `(h, 4)` (`keypoint_boxes`); detections
                more than `hand_cover_max` inside one are taken for the hand and not blurred.

        Returns:
            The frames with faces pixelated `(N, H, W, 3)` uint8 (the input itself when disabled) and
            the number of faces blurred per frame `(N,)` int64.

        Raises:
            ShapeError: `frames_rgb` is not `(N, H, W, 3)` uint8.
        """
        from pose_core.hands.estimator import check_frames  # noqa: PLC0415 -- see __init__

        check_frames(frames_rgb)
        counts = np.zeros(len(frames_rgb), np.int64)
        if not self.opts.enabled or len(frames_rgb) == 0:
            return frames_rgb, counts
        out = frames_rgb.copy()
        for i, boxes in enumerate(self.faces(frames_rgb, hand_boxes)):
            counts[i] = len(boxes)
            for box in boxes:
                self._pixelate(out[i], box)
        logger.debug("blurred %d faces in %d frames", int(counts.sum()), len(frames_rgb))
        return out, counts

    def _pixelate(self, frame: np.ndarray, box: np.ndarray) -> None:
        """Pixelate the box `(4,)` grown by the margin, in place in `frame` `(H, W, 3)`."""
        height, width = frame.shape[:2]
        grow = self.opts.margin * (box[2:] - box[:2])
        x0, y0 = np.floor(np.maximum(box[:2] - grow, 0)).astype(int)
        x1, y1 = np.ceil(np.minimum(box[2:] + grow, [width, height])).astype(int)
        if x1 <= x0 or y1 <= y0:
            return
        region = frame[y0:y1, x0:x1]
        cells = self.opts.blur_cells / max(x1 - x0, y1 - y0)
        small = cv2.resize(
            region, (max(1, round((x1 - x0) * cells)), max(1, round((y1 - y0) * cells))),
            interpolation=cv2.INTER_AREA,
        )  # fmt: skip
        region[:] = cv2.resize(small, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
