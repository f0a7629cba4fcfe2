"""The default hand estimator: MediaPipe's palm detector and 21-keypoint landmark model.

The two `.tflite` models (mediapipe 0.10.21's `palm_detection_full` and `hand_landmark_full`) run on
a `HandNetworks` backend (`networks.py`): the LiteRT interpreter on CPU (`ai_edge_litert`, works with
numpy 2), or the same weights in torch, batched, on a GPU (`torch_networks.py`). Everything around the
networks is shared by both backends: the geometry (anchors, suppression, rotated crops, tracking
from the previous frame, detection windows) is in `rois.py`, the decisions (which regions to look
at, which hands to keep) here. The caller builds the backend from the model files' bytes (the
set-up command caches them); nothing downloads here.

Batching: the per-frame decisions are MediaPipe's, made in rounds (tracked regions, then each
detection view), and every round runs the networks once for all the frames that take part: all
frames of a batch in image mode, one frame in video mode (its hands batched), one frame of each
stream in `estimate_streams` (streams tracked independently, in lockstep).

Modes: ``"image"`` detects palms in every frame; ``"video"`` tracks, as MediaPipe's own video graph
does: each frame first runs the landmark model in the region predicted from the previous frame's
keypoints (moved by the hand's last frame-to-frame motion), and runs the palm detector only while
fewer than `max_num_hands` are tracked. Call `reset` between episodes.

Three additions for first-person footage, where hands are often small, blurred or cut by the frame's
edge: a tracked hand is kept while its presence score stays above a lower threshold than a new
hand needs (hysteresis); the palm detector looks, besides the whole frame, at zoomed square
windows that reach beyond the frame's edges (`rois.detection_windows`); and the landmark model
itself looks for hands entering from the bottom edge with their palm out of view, in square regions
along that edge (`rois.edge_regions`, one more detection view; regions holding a hand already found
are left out). In image mode and on a
video's first frame it looks at all of them; in video mode, while a hand is missing, at one view per
frame, taking turns with the whole frame, and every other frame near where a tracked hand was just
lost. On the ego clips the palm detector scores a blurred hand at the edge 0.3-0.4 on the whole
frame and 0.8-0.9 in a window of 0.6 of the frame.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import numpy as np

from pose_core.hands.estimator import Handedness, HandObservation, StreamState, check_frames
from pose_core.hands.networks import LANDMARK_INPUT, PALM_INPUT, HandNetworks
from pose_core.hands.rois import (
    PalmDecodeOptions,
    RotatedRect,
    crop_rect,
    decode_palms,
    detection_windows,
    edge_regions,
    letterbox,
    palm_anchors,
    rect_from_keypoints,
    rect_from_palm,
    square_crop,
)

__all__ = ["MediaPipeHandEstimator", "MediaPipeOptions"]

logger = logging.getLogger(__name__)


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
    # A hand whose keypoint box's long side is shorter than this fraction of the frame's short side is
    # dropped (0 keeps all): a wearer's hand at arm's length is several times larger under any
    # first-person field of view (0.18 m at 1 m with a 120-degree lens: 0.17 of a 4:3 frame's short
    # side), the landmark model's keypoints on a region upsampled that much are guesses, and the palm
    # detector's smallest detections are mostly texture (a 24x22 px "hand" on a 640x480 background
    # took a tracking slot from the wearer's hand).
    min_hand_side: float = 0.06
    # The landmark model's handedness assumes a mirrored (selfie) image; True for such input.
    mirrored_input: bool = False
    # Which runtime runs the networks: "litert" (the LiteRT interpreter, CPU), "torch" (the same
    # weights in torch, batched; on the task's GPU, else CPU) or "auto" (torch when the task runs on a
    # CUDA GPU and torch is installed, else litert). Same networks and decisions: a frame's hands
    # agree to float rounding, which video-mode tracking carries on like noise
    # (bench/results/hands_torch.md).
    backend: Literal["auto", "litert", "torch"] = "auto"
    # LiteRT: interpreter threads per model; 1 when Spark already runs one task per core.
    num_threads: int = 1
    # torch on CUDA: let cuDNN use TF32 convolutions (faster, ~3 fewer digits; check parity first).
    allow_tf32: bool = False
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
    # Hands entering from the bottom edge with their palm out of view (the first-person wearer's, close
    # to the camera) give the palm detector nothing to find: the landmark model itself looks for them in
    # this many upright square regions side by side along the bottom edge (one detection view,
    # `rois.edge_regions`); 0 disables ...
    edge_region_count: int = 5
    # ... each region's side, fraction of the frame's short side ...
    edge_region_side: float = 1.0
    # ... how far it reaches below the edge, fraction of its side ...
    edge_region_reach: float = 0.25
    # ... and the presence score a hand found there needs (no palm detection vouches for it).
    edge_region_presence: float = 0.8
    # Video mode: detection views per frame while fewer than `max_num_hands` are tracked. The views
    # take turns: whole frame, window 1, whole frame, window 2, ..., then the bottom edge's regions
    # (MediaPipe runs the whole frame every such frame: one run costs about as much as the landmark
    # model on a tracked hand) ...
    detections_per_frame: int = 1
    # ... except for this many frames after a tracked hand was lost: then every other frame the window
    # nearest to where it was is searched first.
    reacquire_frames: int = 10

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "litert", "torch"):
            raise ValueError(
                f"hands.estimator.mediapipe.backend must be auto, litert or torch, got {self.backend!r}"
            )
        if not 0.0 <= self.min_tracking_presence <= self.min_presence_score <= 1.0:
            raise ValueError(
                "hands.estimator.mediapipe: need 0 <= min_tracking_presence <= min_presence_score <= 1, got "
                f"{self.min_tracking_presence}, {self.min_presence_score}"
            )
        if not 0 <= self.min_hand_side < 1:
            raise ValueError(
                f"hands.estimator.mediapipe.min_hand_side must be in [0, 1), got {self.min_hand_side}"
            )
        presence_ok = 0 <= self.edge_region_presence <= 1
        if self.edge_region_count < 0 or self.edge_region_side <= 0 or not presence_ok:
            raise ValueError(
                "hands.estimator.mediapipe: edge_region_count >= 0, edge_region_side > 0 and 0 <= "
                f"edge_region_presence <= 1 needed, got {self.edge_region_count}, {self.edge_region_side}, "
                f"{self.edge_region_presence}"
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


@dataclass(eq=False)
class _Stream:
    """What tracking carries from one frame of a stream of consecutive frames to the next."""

    tracked: list[_Tracked] = field(default_factory=list)
    lost: list[tuple[np.ndarray, int]] = field(default_factory=list)  # where a hand was lost, frames ago
    next_view: int = 0
    first_frame: bool = True


# A region the landmark model looks at: (region, least presence score to keep the hand, the tracked
# hand it was predicted from or None for a detection).
_Candidate = tuple[RotatedRect, float, "_Tracked | None"]

# Where the detectors look: None for the palm detector on the whole frame, `(x0, y0, side)` for it in a
# zoomed window, `EDGE` for the landmark model in the regions along the bottom edge.
EDGE: Literal["edge"] = "edge"
_View = tuple[float, float, float] | None | Literal["edge"]


class MediaPipeHandEstimator:
    """MediaPipe hand landmarker on a `HandNetworks` backend; implements `HandEstimator`.

    Args:
        networks: runs the two models (`LiteRtHandNetworks`, or `torch_networks.TorchHandNetworks`).
        opts: estimator settings.
    """

    def __init__(self, networks: HandNetworks, opts: MediaPipeOptions | None = None) -> None:
        self.opts = opts or MediaPipeOptions()
        self.networks = networks
        self._palm_opts = PalmDecodeOptions(input_size=PALM_INPUT, min_score=self.opts.min_detection_score)
        self._anchors = palm_anchors(self._palm_opts.input_size)
        self._stream = _Stream()

    def reset(self) -> None:
        """Forget the hands tracked from the previous frame."""
        self._stream = _Stream()

    def estimate(self, frames: np.ndarray, camera_k: np.ndarray) -> list[list[HandObservation]]:
        """Find hands in each frame (see `HandEstimator.estimate`); `camera_k` is not used.

        Image mode batches all frames; video mode goes frame by frame, batching each frame's hands.
        """
        return self.estimate_streams([frames], [camera_k], [self._stream])[0]

    def new_stream(self) -> StreamState:
        """The tracking state of a new stream of consecutive frames (see `estimate_streams`)."""
        return _Stream()

    def estimate_streams(
        self, chunks: Sequence[np.ndarray], camera_ks: Sequence[np.ndarray], streams: Sequence[StreamState]
    ) -> list[list[list[HandObservation]]]:
        """Advance independent streams, each by its next chunk of consecutive frames, in lockstep.

        Every network call is batched over the streams (image mode: over all the chunks' frames), so
        many shards on one GPU cost a few large calls instead of many small ones. A stream's hands are
        the same as when it runs alone (to float rounding of the batched networks).

        Args:
            chunks: per stream, its next RGB frames, uint8, `(B_i, H_i, W_i, 3)` (`B_i` may be 0).
            camera_ks: per stream, the frames' pinhole intrinsics `(3, 3)`; not used.
            streams: per stream, its state from `new_stream`, updated here.

        Returns:
            Per stream, per frame of its chunk, the hands found.
        """
        for chunk in chunks:
            check_frames(chunk)
        states = [cast(_Stream, s) for s in streams]
        if self.opts.mode == "image":
            frames = [frame for chunk in chunks for frame in chunk]
            flat = self._step(frames, [_Stream() for _ in frames])
            bounds = np.cumsum([0, *(len(chunk) for chunk in chunks)])
            return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        results: list[list[list[HandObservation]]] = [[] for _ in chunks]
        for t in range(max((len(chunk) for chunk in chunks), default=0)):
            active = [i for i, chunk in enumerate(chunks) if t < len(chunk)]
            found = self._step([chunks[i][t] for i in active], [states[i] for i in active])
            for i, hands in zip(active, found, strict=True):
                results[i].append(hands)
        return results

    def _step(self, images: list[np.ndarray], streams: list[_Stream]) -> list[list[HandObservation]]:
        """One frame of each stream: its hands; updates each stream's tracking.

        Per stream this is MediaPipe's order: landmarks in the regions tracked from the previous frame,
        then, while hands are missing, palm detection in each chosen view in turn and landmarks in
        the regions of the new palms. The streams go through those rounds together, one batched
        network call per round.
        """
        opts = self.opts
        hands: list[list[HandObservation]] = [[] for _ in images]
        sources: list[list[_Tracked | None]] = [[] for _ in images]
        regions: list[list[_Candidate]] = [
            [(t.predicted() if opts.predict_motion else t.rect, opts.min_tracking_presence, t)
             for t in s.tracked]
            for s in streams
        ]  # fmt: skip
        self._add_hands(images, regions, hands, sources)
        views = [self._views(s, *image.shape[:2]) for s, image in zip(streams, images, strict=True)]
        for depth in range(max((len(v) for v in views), default=0)):
            active = [i for i, v in enumerate(views) if depth < len(v) and len(hands[i]) < opts.max_num_hands]
            if not active:
                break
            palm_views = [(i, view) for i in active if not isinstance(view := views[i][depth], str)]
            palms = self._detect_palms([images[i] for i, _ in palm_views], [view for _, view in palm_views])
            strong, weak = opts.min_tracking_presence, opts.min_presence_score
            detected: dict[int, list[tuple[RotatedRect, float]]] = {
                i: [(rect, strong if score >= opts.strong_palm_score else weak) for rect, score in found]
                for (i, _), found in zip(palm_views, palms, strict=True)
            }
            for i in active:
                if views[i][depth] == EDGE:
                    edge = self._edge_regions(images[i], hands[i])
                    detected[i] = [(rect, opts.edge_region_presence) for rect in edge]
            fresh: list[list[_Candidate]] = [[] for _ in images]
            for i, regions_found in detected.items():
                kept = [_rect_box(rect_from_keypoints(h.keypoints_px)) for h in hands[i]]
                fresh[i] = [
                    (rect, least, None)
                    for rect, least in regions_found
                    if all(_box_iou(_rect_box(rect), box) <= opts.duplicate_iou for box in kept)
                ]  # fmt: skip
            self._add_hands(images, fresh, hands, sources)
        for stream, tracked_regions, found, origins in zip(streams, regions, hands, sources, strict=True):
            self._carry(stream, tracked_regions, found, origins)
        return hands

    def _carry(
        self,
        stream: _Stream,
        regions: list[_Candidate],
        hands: list[HandObservation],
        sources: list[_Tracked | None],
    ) -> None:
        """Hands found this frame become the stream's tracked hands; tracked hands not found, lost ones."""
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
        stream.lost = lost + [(c, age + 1) for c, age in stream.lost if age + 1 < self.opts.reacquire_frames]
        stream.tracked = tracked

    def _views(self, stream: _Stream, height: int, width: int) -> list[_View]:
        """Where the detectors look this frame (see `_View`)."""
        windows = detection_windows(
            height, width, self.opts.window_fraction, self.opts.window_padding, self.opts.window_overlap
        )
        edge: list[_View] = [EDGE] if self.opts.edge_region_count > 0 else []
        if self.opts.mode == "image" or stream.first_frame:
            stream.first_frame = False
            return [None, *windows, *edge]
        chosen: list[_View] = []
        if stream.lost and windows and stream.lost[0][1] % 2 == 0:
            centres = np.array([[x + side / 2.0, y + side / 2.0] for x, y, side in windows])
            chosen.append(windows[int(np.argmin(np.linalg.norm(centres - stream.lost[0][0], axis=1)))])
        cycle: list[_View] = [view for window in windows for view in (None, window)] or [None]
        cycle += edge
        while len(chosen) < self.opts.detections_per_frame:
            chosen.append(cycle[stream.next_view % len(cycle)])
            stream.next_view += 1
        return chosen

    def _add_hands(
        self,
        images: list[np.ndarray],
        candidates: list[list[_Candidate]],
        hands: list[list[HandObservation]],
        sources: list[list[_Tracked | None]],
    ) -> None:
        """Per image, run the landmark model in each candidate region and keep the hands that pass.

        A hand passes when present (its candidate's threshold), at least `min_hand_side` and new. Kept
        hands and their origins are appended to `hands[i]` and `sources[i]`, in candidate order, until
        `max_num_hands`. A kept hand that is a part of a new one (see `part_cover`) gives way to it.
        The landmark model runs on every candidate of every image in one batch (and once more for the
        second passes), so a candidate after the last kept hand costs a crop it did not need.
        """
        looks = self._looks(images, candidates)
        for image, image_hands, image_sources, image_candidates, image_looks in zip(
            images, hands, sources, candidates, looks, strict=True
        ):
            min_side = self.opts.min_hand_side * min(image.shape[:2])
            for (_, min_presence, origin), hand in zip(image_candidates, image_looks, strict=True):
                if len(image_hands) >= self.opts.max_num_hands:
                    break
                box = _box(hand.keypoints_px)
                if hand.score < min_presence or max(box[2] - box[0], box[3] - box[1]) < min_side:
                    continue
                others = [_box(other.keypoints_px) for other in image_hands]
                dup, cover = self.opts.duplicate_iou, self.opts.part_cover
                if any(_box_iou(box, other) > dup or _is_part(box, other, cover) for other in others):
                    continue
                parts = [i for i, other in enumerate(others) if _is_part(other, box, self.opts.part_cover)]
                for i in reversed(parts):
                    del image_hands[i], image_sources[i]
                image_hands.append(hand)
                image_sources.append(origin)

    def _looks(
        self, images: list[np.ndarray], candidates: list[list[_Candidate]]
    ) -> list[list[HandObservation]]:
        """The landmark model's hand in each candidate region, aligned with `candidates`.

        A region whose presence score is short of its threshold but at least `refine_presence` is
        looked at again in the region of its own keypoints (as tracking would next frame).
        """
        flat = [(i, rect, least) for i, cands in enumerate(candidates) for rect, least, _ in cands]
        if not flat:
            return [[] for _ in candidates]
        found = self._landmarks([images[i] for i, _, _ in flat], [rect for _, rect, _ in flat])
        low = self.opts.refine_presence
        again = [k for k, (_, _, least) in enumerate(flat) if low <= found[k].score < least]
        if again:
            refined = [rect_from_keypoints(found[k].keypoints_px) for k in again]
            second = self._landmarks([images[flat[k][0]] for k in again], refined)
            for k, hand in zip(again, second, strict=True):
                found[k] = hand
        bounds = np.cumsum([0, *(len(c) for c in candidates)])
        return [found[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _edge_regions(self, image: np.ndarray, found: list[HandObservation]) -> list[RotatedRect]:
        """The bottom edge's regions that do not hold most (`part_cover`) of a hand already found.

        The landmark model in such a region would find that hand again, or stretch a second one from its
        fingers to the forearm at the edge.
        """
        o = self.opts
        height, width = image.shape[:2]
        boxes = [_box(hand.keypoints_px) for hand in found]
        regions = edge_regions(height, width, o.edge_region_count, o.edge_region_side, o.edge_region_reach)
        return [
            rect
            for rect in regions
            if all(_intersection(box, _rect_box(rect)) < o.part_cover * _area(box) for box in boxes)
        ]

    def _detect_palms(
        self, images: list[np.ndarray], windows: list[tuple[float, float, float] | None]
    ) -> list[list[tuple[RotatedRect, float]]]:
        """Palm detections of each image in its view (None: the whole image, else a square window).

        Returns:
            Per image, the hand rectangles (pixels of the image) and palm scores.
        """
        if not images:
            return []
        size = self._palm_opts.input_size
        squares, scales, offsets = [], [], []
        for image, window in zip(images, windows, strict=True):
            if window is None:
                square, scale, offset = letterbox(image, size)
            else:
                square, scale, offset = square_crop(image, *window, size)
            squares.append(square)
            scales.append(scale)
            offsets.append(offset)
        raw = self.networks.palms(np.stack(squares))
        results = []
        for k, (scale, offset) in enumerate(zip(scales, offsets, strict=True)):
            boxes, kps, scores = decode_palms(raw.boxes[k], raw.logits[k], self._anchors, self._palm_opts)
            rects = []
            for box, kp, score in zip(boxes, kps, scores, strict=True):
                box_px = (box.reshape(2, 2) * size - offset) / scale
                rects.append((rect_from_palm(box_px.ravel(), (kp * size - offset) / scale), float(score)))
            results.append(rects)
        return results

    def _landmarks(self, images: list[np.ndarray], rects: list[RotatedRect]) -> list[HandObservation]:
        """Landmark model in each rect of its image (a hand's `score` is the model's presence score)."""
        crops = np.stack([crop_rect(im, r, LANDMARK_INPUT) for im, r in zip(images, rects, strict=True)])
        raw = self.networks.landmarks(crops)
        hands = []
        for k, rect in enumerate(rects):
            local = raw.keypoints[k, :, :2] / LANDMARK_INPUT
            img_from_unit = rect.image_from_rect()
            keypoints_px = local @ img_from_unit[:, :2].T + img_from_unit[:, 2]
            # The model's label 0 ("Left") is for a mirrored image: on a plain image it is the right hand.
            p_label0 = float(raw.label0[k])
            p_right = p_label0 if not self.opts.mirrored_input else 1.0 - p_label0
            side: Handedness = "right" if p_right >= 0.5 else "left"
            hands.append(HandObservation(
                keypoints_px=keypoints_px.astype(np.float64),
                score=float(raw.presence[k]),
                handedness=side,
                handedness_score=max(p_right, 1.0 - p_right),
                keypoints_rel_m=raw.world[k].astype(np.float64),
            ))  # fmt: skip
        return hands
