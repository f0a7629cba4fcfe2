"""The default hand estimator: MediaPipe's palm detector and 21-keypoint landmark model on LiteRT.

The two `.tflite` models (mediapipe 0.10.21's `palm_detection_full` and `hand_landmark_full`) are run
with the LiteRT interpreter (`ai_edge_litert`), which works with numpy 2; the pipeline around them
(anchors, suppression, rotated crops, tracking from the previous frame, detection windows) is in
`rois.py`. The caller passes the model files' paths (the set-up command caches them); nothing
downloads here.

Modes: ``"image"`` detects palms in every frame; ``"video"`` tracks, as MediaPipe's own video graph
does: each frame first runs the landmark model in the region predicted from the previous frame's
keypoints (moved by the hand's last frame-to-frame motion), and runs the palm detector only while
fewer than `max_num_hands` are tracked. Call `reset` between episodes.

Two additions for first-person footage, where hands are often small, blurred or cut by the frame's
edge: a tracked hand is kept while its presence score stays above a lower threshold than a new
hand needs (hysteresis), and the palm detector looks, besides the whole frame, at zoomed square
windows that reach beyond the frame's edges (`rois.detection_windows`). In image mode and on a
video's first frame it looks at all of them; in video mode, while a hand is missing, at one view per
frame, taking turns with the whole frame, and every other frame near where a tracked hand was just
lost. On the ego clips the palm detector scores a blurred hand at the edge 0.3-0.4 on the whole
frame and 0.8-0.9 in a window of 0.6 of the frame.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from pose_core.hands.estimator import Handedness, HandObservation, check_frames
from pose_core.hands.rois import (
    PalmDecodeOptions,
    RotatedRect,
    crop_rect,
    decode_palms,
    detection_windows,
    letterbox,
    palm_anchors,
    rect_from_keypoints,
    rect_from_palm,
    square_crop,
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
    # A new hand (from a palm detection) whose landmark-model presence score is lower is dropped ...
    min_presence_score: float = 0.5
    # ... unless its palm detection scored at least this: then it needs `min_tracking_presence` only.
    strong_palm_score: float = 0.8
    # A hand tracked from the previous frame stays while its presence score is at least this: a hand
    # turning, blurred or half out of view scores lower while it is still there (MediaPipe uses one
    # threshold for both, and drops such hands until the palm detector finds them again).
    min_tracking_presence: float = 0.25
    # A new hand whose keypoint box overlaps a kept hand's by more than this IoU is a duplicate.
    duplicate_iou: float = 0.5
    # A hand whose keypoint box lies at least this much (fraction of its area) inside a hand's box
    # at least twice its area is a part of that hand (the palm detector also fires on curled fingers,
    # which the landmark model then takes for a small hand) and is dropped.
    part_cover: float = 0.6
    # The landmark model's handedness assumes a mirrored (selfie) image; True for such input.
    mirrored_input: bool = False
    # Interpreter threads per model; 1 when Spark already runs one task per core.
    num_threads: int = 1
    # Move a tracked hand's region by the hand's last frame-to-frame motion before the landmark model
    # runs in it (constant velocity; MediaPipe uses the previous region as it is).
    predict_motion: bool = True
    # A region whose presence score is short of its threshold but at least this gets a second landmark
    # pass in the region of its own keypoints (as tracking would next frame): a palm detection of a
    # hand cut by the edge often gives a poor first region. 1 disables.
    refine_presence: float = 0.05
    # Side of the zoomed detection windows, fraction of the frame's long side; 0 disables them.
    window_fraction: float = 0.6
    # The windows reach this fraction of their side beyond the frame's edges (black), so a hand cut by
    # the edge is not at a window's border.
    window_padding: float = 0.15
    # Least overlap of neighbouring windows, fraction of their side.
    window_overlap: float = 0.25
    # Video mode: palm-detector runs per frame while fewer than `max_num_hands` are tracked. The views
    # take turns: whole frame, window 1, whole frame, window 2, ... (MediaPipe runs the whole frame
    # every such frame: one run costs about as much as the landmark model on a tracked hand) ...
    detections_per_frame: int = 1
    # ... except for this many frames after a tracked hand was lost: then every other frame the window
    # nearest to where it was is searched first.
    reacquire_frames: int = 10

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_tracking_presence <= self.min_presence_score <= 1.0:
            raise ValueError(
                "hands.estimator.mediapipe: need 0 <= min_tracking_presence <= min_presence_score <= 1, got "
                f"{self.min_tracking_presence}, {self.min_presence_score}"
            )
        if self.window_fraction < 0 or not 0 <= self.window_overlap < 1 or self.detections_per_frame < 1:
            raise ValueError(
                "hands.estimator.mediapipe: window_fraction >= 0, 0 <= window_overlap < 1 and "
                f"detections_per_frame >= 1 needed, got {self.window_fraction}, {self.window_overlap}, "
                f"{self.detections_per_frame}"
            )


@dataclass(frozen=True, eq=False)
class _Tracked:
    """A hand carried to the next frame: its region from this frame's keypoints and its last motion."""

    rect: RotatedRect
    velocity_px: np.ndarray  # (2,) move of the region's centre since the frame before, pixels

    def predicted(self) -> RotatedRect:
        r = self.rect
        return RotatedRect(r.cx + self.velocity_px[0], r.cy + self.velocity_px[1], r.w, r.h, r.angle)


def _box(points: np.ndarray) -> np.ndarray:
    return np.concatenate([points.min(axis=0), points.max(axis=0)])


def _rect_box(rect: RotatedRect) -> np.ndarray:
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    img_from_unit = rect.image_from_rect()
    return _box(corners @ img_from_unit[:, :2].T + img_from_unit[:, 2])


def _area(box: np.ndarray) -> float:
    return float(max(box[2] - box[0], 0.0) * max(box[3] - box[1], 0.0))


def _intersection(a: np.ndarray, b: np.ndarray) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _box_iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = _intersection(a, b)
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def _is_part(small: np.ndarray, large: np.ndarray, cover: float) -> bool:
    """Box `small` lies at least `cover` inside box `large`, which has at least twice its area."""
    return 2.0 * _area(small) <= _area(large) and _intersection(small, large) >= cover * _area(small)


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
        self._tracked: list[_Tracked] = []
        self._lost: list[tuple[np.ndarray, int]] = []  # where a tracked hand was lost, frames ago
        self._next_view = 0
        self._first_frame = True

    def reset(self) -> None:
        """Forget the hands tracked from the previous frame."""
        self._tracked = []
        self._lost = []
        self._next_view = 0
        self._first_frame = True

    def estimate(self, frames: np.ndarray, camera_k: np.ndarray) -> list[list[HandObservation]]:
        """Find hands in each frame (see `HandEstimator.estimate`); `camera_k` is not used."""
        check_frames(frames)
        results = []
        for frame in frames:
            if self.opts.mode == "image":
                self._tracked = []
            results.append(self._estimate_one(frame))
        return results

    def _estimate_one(self, image: np.ndarray) -> list[HandObservation]:
        """Hands of one frame; updates the tracked hands."""
        hands: list[HandObservation] = []
        sources: list[_Tracked | None] = []
        tracking = self.opts.min_tracking_presence
        regions = [
            (t.predicted() if self.opts.predict_motion else t.rect, tracking, t) for t in self._tracked
        ]
        self._add_hands(image, regions, hands, sources)
        for window in self._windows(image.shape[0], image.shape[1]):
            if len(hands) >= self.opts.max_num_hands:
                break
            kept = [_rect_box(rect_from_keypoints(h.keypoints_px)) for h in hands]
            strong, weak = tracking, self.opts.min_presence_score
            fresh = [
                (rect, strong if score >= self.opts.strong_palm_score else weak, None)
                for rect, score in self._detect_palms(image, window)
                if all(_box_iou(_rect_box(rect), box) <= self.opts.duplicate_iou for box in kept)
            ]  # fmt: skip
            self._add_hands(image, fresh, hands, sources)
        tracked = []
        for hand, source in zip(hands, sources, strict=True):
            rect = rect_from_keypoints(hand.keypoints_px)
            velocity = (
                np.zeros(2)
                if source is None
                else np.array([rect.cx - source.rect.cx, rect.cy - source.rect.cy])
            )
            tracked.append(_Tracked(rect, velocity))
        continued = {id(source) for source in sources}
        lost = [(np.array([r.cx, r.cy]), 0) for (r, _, t) in regions if id(t) not in continued]
        self._lost = lost + [(c, age + 1) for c, age in self._lost if age + 1 < self.opts.reacquire_frames]
        self._tracked = tracked
        return hands

    def _windows(self, height: int, width: int) -> list[tuple[float, float, float] | None]:
        """Where the palm detector looks this frame: None for the whole frame, else a zoomed window."""
        windows = detection_windows(
            height, width, self.opts.window_fraction, self.opts.window_padding, self.opts.window_overlap
        )
        if self.opts.mode == "image" or self._first_frame:
            self._first_frame = False
            return [None, *windows]
        chosen: list[tuple[float, float, float] | None] = []
        if self._lost and windows and self._lost[0][1] % 2 == 0:
            centres = np.array([[x + side / 2.0, y + side / 2.0] for x, y, side in windows])
            chosen.append(windows[int(np.argmin(np.linalg.norm(centres - self._lost[0][0], axis=1)))])
        cycle = [view for window in windows for view in (None, window)] or [None]
        while len(chosen) < self.opts.detections_per_frame:
            chosen.append(cycle[self._next_view % len(cycle)])
            self._next_view += 1
        return chosen

    def _add_hands(
        self,
        image: np.ndarray,
        candidates: Sequence[tuple[RotatedRect, float, _Tracked | None]],
        hands: list[HandObservation],
        sources: list[_Tracked | None],
    ) -> None:
        """Run the landmark model in each candidate region and keep new, present, non-duplicate hands.

        A candidate is (region, least presence score, the tracked hand it was predicted from or None
        for a palm detection); kept hands and their origins are appended to `hands` and `sources`. A
        kept hand that is a part of a new one (see `part_cover`) gives way to it.
        """
        for rect, min_presence, origin in candidates:
            if len(hands) >= self.opts.max_num_hands:
                return
            hand = self._landmarks(image, rect)
            if self.opts.refine_presence <= hand.score < min_presence:
                hand = self._landmarks(image, rect_from_keypoints(hand.keypoints_px))
            if hand.score < min_presence:
                continue
            box = _box(hand.keypoints_px)
            others = [_box(other.keypoints_px) for other in hands]
            if any(
                _box_iou(box, other) > self.opts.duplicate_iou or _is_part(box, other, self.opts.part_cover)
                for other in others
            ):
                continue
            parts = [i for i, other in enumerate(others) if _is_part(other, box, self.opts.part_cover)]
            for i in reversed(parts):
                del hands[i], sources[i]
            hands.append(hand)
            sources.append(origin)

    def _detect_palms(
        self, image: np.ndarray, window: tuple[float, float, float] | None
    ) -> list[tuple[RotatedRect, float]]:
        """Palm detections in the whole image (window None) or a square window: hand rectangles and scores."""
        size = self._palm_opts.input_size
        if window is None:
            square, scale, offset = letterbox(image, size)
        else:
            square, scale, offset = square_crop(image, *window, size)
        inp, out = self._palm.get_input_details()[0], self._palm.get_output_details()
        self._palm.set_tensor(inp["index"], square[None])
        self._palm.invoke()
        raw_boxes = self._palm.get_tensor(out[0]["index"])[0]
        raw_scores = self._palm.get_tensor(out[1]["index"])[0]
        boxes, kps, scores = decode_palms(raw_boxes, raw_scores, self._anchors, self._palm_opts)
        rects = []
        for box, kp, score in zip(boxes, kps, scores, strict=True):
            box_px = (box.reshape(2, 2) * size - offset) / scale
            rects.append((rect_from_palm(box_px.ravel(), (kp * size - offset) / scale), float(score)))
        return rects

    def _landmarks(self, image: np.ndarray, rect: RotatedRect) -> HandObservation:
        """Landmark model in one rect (its `score` is the model's hand-presence score)."""
        crop = crop_rect(image, rect, _LANDMARK_INPUT)
        inp, out = self._landmark.get_input_details()[0], self._landmark.get_output_details()
        self._landmark.set_tensor(inp["index"], crop[None])
        self._landmark.invoke()
        landmarks, presence, left_score, world = (self._landmark.get_tensor(o["index"])[0] for o in out)
        score = float(presence.reshape(-1)[0])
        local = landmarks.reshape(21, 3)[:, :2] / _LANDMARK_INPUT
        img_from_unit = rect.image_from_rect()
        keypoints_px = local @ img_from_unit[:, :2].T + img_from_unit[:, 2]
        # The model's label 0 ("Left") is for a mirrored image: on a plain image it is the right hand.
        p_label0 = float(left_score.reshape(-1)[0])
        p_right = p_label0 if not self.opts.mirrored_input else 1.0 - p_label0
        side: Handedness = "right" if p_right >= 0.5 else "left"
        shape = world.reshape(21, 3).astype(np.float64)
        return HandObservation(
            keypoints_px=keypoints_px.astype(np.float64),
            score=score,
            handedness=side,
            handedness_score=max(p_right, 1.0 - p_right),
            keypoints_rel_m=shape,
        )
