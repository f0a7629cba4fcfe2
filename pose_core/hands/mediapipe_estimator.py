"""The default hand estimator: MediaPipe's palm detector and 21-keypoint landmark model on LiteRT.

The two `.tflite` models (mediapipe 0.10.21's `palm_detection_full` and `hand_landmark_full`) are run
with the LiteRT interpreter (`ai_edge_litert`), which works with numpy 2; the pipeline around them
(anchors, suppression, rotated crops, tracking from the previous frame) is in `rois.py`. The caller
passes the model files' paths (the set-up command caches them); nothing downloads here.

Modes: ``"image"`` detects palms in every frame; ``"video"`` seeds each frame with the hands of the
previous one and runs the palm detector only while fewer than `max_num_hands` are tracked (as
MediaPipe's VIDEO mode does). Call `reset` between episodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from pose_core.hands.estimator import HandObservation, check_frames
from pose_core.hands.rois import (
    PalmDecodeOptions,
    RotatedRect,
    crop_rect,
    decode_palms,
    letterbox,
    palm_anchors,
    rect_from_keypoints,
    rect_from_palm,
)

__all__ = ["MediaPipeHandEstimator", "MediaPipeOptions"]

logger = logging.getLogger(__name__)

_LANDMARK_INPUT = 224


@dataclass(frozen=True)
class MediaPipeOptions:
    """Settings of the MediaPipe hand estimator."""

    # "video": track hands from frame to frame (frames of a batch must be consecutive); "image": independent.
    mode: Literal["image", "video"] = "video"
    # Most hands reported per frame.
    max_num_hands: int = 2
    # Palm detections with a lower score are dropped.
    min_detection_score: float = 0.5
    # Hands whose landmark-model presence score is lower are dropped (and stop being tracked).
    min_presence_score: float = 0.5
    # A new hand whose keypoint box overlaps a kept hand's by more than this IoU is a duplicate.
    duplicate_iou: float = 0.5
    # The landmark model's handedness assumes a mirrored (selfie) image; True for such input.
    mirrored_input: bool = False
    # Interpreter threads per model; 1 when Spark already runs one task per core.
    num_threads: int = 1


def _box(points: np.ndarray) -> np.ndarray:
    return np.concatenate([points.min(axis=0), points.max(axis=0)])


def _rect_box(rect: RotatedRect) -> np.ndarray:
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    img_from_unit = rect.image_from_rect()
    return _box(corners @ img_from_unit[:, :2].T + img_from_unit[:, 2])


def _box_iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


class MediaPipeHandEstimator:
    """MediaPipe hand landmarker on LiteRT; implements `HandEstimator`.

    Args:
        palm_model: path of ``palm_detection_full.tflite``.
        landmark_model: path of ``hand_landmark_full.tflite``.
        opts: estimator settings.
    """

    def __init__(self, palm_model: Path, landmark_model: Path, opts: MediaPipeOptions | None = None) -> None:
        from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 -- heavy; only for this estimator

        self.opts = opts or MediaPipeOptions()
        self._palm = Interpreter(model_path=str(palm_model), num_threads=self.opts.num_threads)
        self._landmark = Interpreter(model_path=str(landmark_model), num_threads=self.opts.num_threads)
        for interp in (self._palm, self._landmark):
            interp.allocate_tensors()
        self._palm_opts = PalmDecodeOptions(min_score=self.opts.min_detection_score)
        self._anchors = palm_anchors(self._palm_opts.input_size)
        self._tracked: list[RotatedRect] = []

    def reset(self) -> None:
        """Forget the hands tracked from the previous frame."""
        self._tracked = []

    def estimate(self, frames: np.ndarray, camera_k: np.ndarray) -> list[list[HandObservation]]:
        """Find hands in each frame (see `HandEstimator.estimate`); `camera_k` is not used."""
        check_frames(frames)
        results = []
        for frame in frames:
            if self.opts.mode == "image":
                self._tracked = []
            hands = self._estimate_one(frame)
            self._tracked = [rect_from_keypoints(h.keypoints_px) for h in hands]
            results.append(hands)
        return results

    def _estimate_one(self, image: np.ndarray) -> list[HandObservation]:
        rects = list(self._tracked)
        hands: list[HandObservation] = []
        boxes: list[np.ndarray] = []
        self._add_hands(image, rects, hands, boxes)
        if len(hands) < self.opts.max_num_hands:
            kept = [_rect_box(rect_from_keypoints(h.keypoints_px)) for h in hands]
            fresh = [
                rect for rect in self._detect_palms(image)
                if all(_box_iou(_rect_box(rect), box) <= self.opts.duplicate_iou for box in kept)
            ]  # fmt: skip
            self._add_hands(image, fresh, hands, boxes)
        return hands

    def _add_hands(
        self,
        image: np.ndarray,
        rects: list[RotatedRect],
        hands: list[HandObservation],
        boxes: list[np.ndarray],
    ) -> None:
        """Run the landmark model in each rect and keep new, present, non-duplicate hands (in place)."""
        for rect in rects:
            if len(hands) >= self.opts.max_num_hands:
                return
            hand = self._landmarks(image, rect)
            if hand is None:
                continue
            box = _box(hand.keypoints_px)
            if any(_box_iou(box, other) > self.opts.duplicate_iou for other in boxes):
                continue
            hands.append(hand)
            boxes.append(box)

    def _detect_palms(self, image: np.ndarray) -> list[RotatedRect]:
        """Palm detections of one image as hand rectangles, best first."""
        size = self._palm_opts.input_size
        square, scale, offset = letterbox(image, size)
        inp, out = self._palm.get_input_details()[0], self._palm.get_output_details()
        self._palm.set_tensor(inp["index"], square[None])
        self._palm.invoke()
        raw_boxes = self._palm.get_tensor(out[0]["index"])[0]
        raw_scores = self._palm.get_tensor(out[1]["index"])[0]
        boxes, kps, _ = decode_palms(raw_boxes, raw_scores, self._anchors, self._palm_opts)
        rects = []
        for box, kp in zip(boxes, kps, strict=True):
            box_px = (box.reshape(2, 2) * size - offset) / scale
            rects.append(rect_from_palm(box_px.ravel(), (kp * size - offset) / scale))
        return rects

    def _landmarks(self, image: np.ndarray, rect: RotatedRect) -> HandObservation | None:
        """Landmark model in one rect; None when the hand-presence score is too low."""
        crop = crop_rect(image, rect, _LANDMARK_INPUT)
        inp, out = self._landmark.get_input_details()[0], self._landmark.get_output_details()
        self._landmark.set_tensor(inp["index"], crop[None])
        self._landmark.invoke()
        landmarks, presence, left_score, world = (self._landmark.get_tensor(o["index"])[0] for o in out)
        score = float(presence.reshape(-1)[0])
        if score < self.opts.min_presence_score:
            return None
        local = landmarks.reshape(21, 3)[:, :2] / _LANDMARK_INPUT
        img_from_unit = rect.image_from_rect()
        keypoints_px = local @ img_from_unit[:, :2].T + img_from_unit[:, 2]
        # The model's label 0 ("Left") is for a mirrored image: on a plain image it is the right hand.
        p_label0 = float(left_score.reshape(-1)[0])
        p_right = p_label0 if not self.opts.mirrored_input else 1.0 - p_label0
        side = "right" if p_right >= 0.5 else "left"
        shape = world.reshape(21, 3).astype(np.float64)
        return HandObservation(
            keypoints_px=keypoints_px.astype(np.float64),
            score=score,
            handedness=side,
            handedness_score=max(p_right, 1.0 - p_right),
            keypoints_rel_m=shape,
        )
