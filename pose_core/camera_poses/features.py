"""Per-frame features: KLT optical-flow tracks with persistent track ids, hands masked out.

Why KLT tracks and not ORB or SIFT: between consecutive video frames the motion is small, so
pyramidal Lucas-Kanade gives sub-pixel correspondences with identities for free (no descriptor
matching), about 10 ms per 640x480 frame on one core with a forward-backward check; ORB is 2-3x
slower per frame once matching is included and its corners are pixel-quantised, SIFT is ~10x
slower. ``bench/camera_poses.py`` measures the three.

Descriptors re-find a place after its tracks are gone (relocalisation, loop closure, joining
segments): every ``descriptor_every_frames``-th frame (by ``frame_idx``, so shards agree) gets an
upright ORB descriptor (256 bits, 31-px patch at full resolution, ~1 ms for 500 tracks) at each
track's position. Upright because head-mounted cameras barely roll and an upright descriptor tells
more places apart; single-scale because the tracks are found at one scale.

New corners are found only where they are needed: the image is cut into square cells of
``cell_px``; FAST corners are detected once per top-up and each cell without a live track gets
its strongest corner (no per-track masks drawn). Hands are excluded with a per-frame mask or a
list of boxes (``hand_mask_from_boxes``).

The output per frame (``FrameFeatures``) is what every later stage consumes, so no later stage
decodes the video again: ``to_flat`` / ``from_flat`` give a compact form for a table row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import cv2
import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "DESCRIPTOR_BYTES",
    "FeatureOptions",
    "FrameFeatures",
    "HandRegion",
    "KltTracker",
    "extract_features",
    "hand_mask_from_boxes",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureOptions:
    """Knobs of the KLT tracker."""

    # number of tracks kept alive per frame; new corners are detected when fewer survive
    max_features: int = 500
    # re-detect corners when the live tracks fall below this fraction of max_features
    redetect_ratio: float = 0.7
    # side of the square grid cells; a new corner is placed only in a cell without a live track, pixels
    cell_px: int = 18
    # FAST intensity threshold of a corner, grey levels (low: weak texture still gets corners)
    fast_threshold: int = 10
    # KLT window side, pixels
    window_px: int = 13
    # KLT pyramid levels above the base image
    pyramid_levels: int = 3
    # max forward-backward disagreement for a track to survive, pixels
    max_fb_error_px: float = 1.0
    # image border in which no corner is detected, pixels
    border_px: int = 8
    # every this many frames (frame_idx % n == 0) the tracks get ORB descriptors (relocalisation, loop
    # closure); 0: never
    descriptor_every_frames: int = 5


#: Bytes of one ORB descriptor.
DESCRIPTOR_BYTES = 32
_ORB_PATCH_PX = 31  # ORB's patch side at full resolution, pixels
_LK_CRITERIA = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 20, 0.03)  # 20 iterations or 0.03 px


@dataclass(frozen=True)
class FrameFeatures:
    """The tracks seen in one frame.

    Attributes:
        frame_idx: 0-based frame index in decode order.
        track_ids: persistent id of each track, unique within an episode, shape ``(N,)`` int64.
        uv_px: distorted pixel position of each track, shape ``(N, 2)`` float32.
        descriptors: ORB descriptor of each track, ``(N, 32)`` uint8, an all-zero row where the track
            has none (too near the border); None on frames without descriptors.
    """

    frame_idx: int
    track_ids: np.ndarray
    uv_px: np.ndarray
    descriptors: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.track_ids)
        if np.shape(self.uv_px) != (n, 2):
            raise ShapeError("FrameFeatures.uv_px", np.shape(self.uv_px), f"({n}, 2)")
        if self.descriptors is not None and np.shape(self.descriptors) != (n, DESCRIPTOR_BYTES):
            expected = f"({n}, {DESCRIPTOR_BYTES})"
            raise ShapeError("FrameFeatures.descriptors", np.shape(self.descriptors), expected)

    def select(self, keep: np.ndarray) -> FrameFeatures:
        """The tracks picked by a bool mask or index array ``keep``, descriptors kept aligned."""
        desc = None if self.descriptors is None else self.descriptors[keep]
        return FrameFeatures(self.frame_idx, self.track_ids[keep], self.uv_px[keep], desc)

    def with_track_ids(self, track_ids: np.ndarray) -> FrameFeatures:
        """The same tracks under other ids ``(N,)`` (e.g. linked across shards)."""
        return FrameFeatures(self.frame_idx, np.asarray(track_ids, np.int64), self.uv_px, self.descriptors)

    def described(self) -> tuple[np.ndarray, np.ndarray]:
        """Indices ``(D,)`` of the tracks with a descriptor and their descriptors ``(D, 32)``."""
        if self.descriptors is None:
            return np.zeros(0, np.int64), np.zeros((0, DESCRIPTOR_BYTES), np.uint8)
        idx = np.nonzero(self.descriptors.any(axis=1))[0]
        return idx, self.descriptors[idx]

    def to_flat(self) -> tuple[np.ndarray, np.ndarray, bytes | None]:
        """Compact columns for one table row.

        Returns:
            ``track_ids (N,) int64``, ``uv_px (2N,) float32`` and the descriptors as ``32 N`` bytes (None
            when the frame has none).
        """
        desc = None if self.descriptors is None else self.descriptors.astype(np.uint8).tobytes()
        return self.track_ids.astype(np.int64), self.uv_px.astype(np.float32).reshape(-1), desc

    @classmethod
    def from_flat(
        cls, frame_idx: int, track_ids: np.ndarray, uv_px_flat: np.ndarray, descriptors: bytes | None = None
    ) -> FrameFeatures:
        """Inverse of ``to_flat``."""
        uv = np.asarray(uv_px_flat, dtype=np.float32)
        if uv.size != 2 * len(track_ids):
            raise ShapeError("uv_px_flat", uv.shape, f"({2 * len(track_ids)},)")
        desc = None
        if descriptors is not None:
            desc = np.frombuffer(descriptors, np.uint8)
            if desc.size != DESCRIPTOR_BYTES * len(track_ids):
                raise ShapeError("descriptors", desc.shape, f"({DESCRIPTOR_BYTES * len(track_ids)},)")
            desc = desc.reshape(-1, DESCRIPTOR_BYTES)
        return cls(int(frame_idx), np.asarray(track_ids, dtype=np.int64), uv.reshape(-1, 2), desc)


class KltTracker:
    """Sequential KLT tracker: feed grayscale frames in decode order, get ``FrameFeatures`` back.

    Args:
        opts: tracker options.
        first_track_id: id given to the first new track (use distinct ranges per shard).
    """

    def __init__(self, opts: FeatureOptions | None = None, first_track_id: int = 0) -> None:
        self.opts = opts or FeatureOptions()
        self._next_id = int(first_track_id)
        self._prev_img: np.ndarray | None = None
        self._prev_uv = np.zeros((0, 2), np.float32)
        self._prev_ids = np.zeros(0, np.int64)
        self._prev_flow = np.zeros((0, 2), np.float32)  # last motion of each tracked point, pixels
        self._fast = cv2.FastFeatureDetector.create(self.opts.fast_threshold)
        self._orb = cv2.ORB.create(nlevels=1, edgeThreshold=_ORB_PATCH_PX // 2 + 4, patchSize=_ORB_PATCH_PX)

    def step(self, frame_idx: int, gray: np.ndarray, hand_mask: np.ndarray | None = None) -> FrameFeatures:
        """Track the previous frame's points into ``gray`` and top up with new corners.

        Args:
            frame_idx: index of this frame.
            gray: grayscale image, shape ``(H, W)`` uint8.
            hand_mask: True on hand pixels, shape ``(H, W)``; tracks landing there are dropped and no
                corner is detected there. None when the hands table does not exist.

        Returns:
            The tracks of this frame.

        Raises:
            ShapeError: if ``gray`` is not 2-D or the mask has another shape.
        """
        if gray.ndim != 2:
            raise ShapeError("gray", gray.shape, "(H, W)")
        if hand_mask is not None and hand_mask.shape != gray.shape:
            raise ShapeError("hand_mask", hand_mask.shape, str(gray.shape))
        uv, ids, flow = self._track(gray)
        if hand_mask is not None and len(uv):
            ui = np.clip(uv[:, 0].round().astype(int), 0, gray.shape[1] - 1)
            vi = np.clip(uv[:, 1].round().astype(int), 0, gray.shape[0] - 1)
            keep = ~hand_mask[vi, ui]
            uv, ids, flow = uv[keep], ids[keep], flow[keep]
        if len(uv) < self.opts.redetect_ratio * self.opts.max_features:
            n_old = len(uv)
            uv, ids = self._top_up(gray, uv, ids, hand_mask)
            median = np.median(flow, axis=0) if len(flow) else np.zeros(2, np.float32)
            flow = np.concatenate([flow, np.tile(median, (len(uv) - n_old, 1))]).astype(np.float32)
        self._prev_img, self._prev_uv, self._prev_ids, self._prev_flow = gray, uv, ids, flow
        every = self.opts.descriptor_every_frames
        desc = self._describe(gray, uv) if every > 0 and frame_idx % every == 0 else None
        return FrameFeatures(frame_idx, ids.copy(), uv.copy(), desc)

    def _describe(self, gray: np.ndarray, uv: np.ndarray) -> np.ndarray:
        """Upright ORB descriptors ``(N, 32)`` at ``uv (N, 2)``; zero rows where ORB drops the point."""
        out = np.zeros((len(uv), DESCRIPTOR_BYTES), np.uint8)
        if len(uv) == 0:
            return out
        points = [
            cv2.KeyPoint(float(u), float(v), _ORB_PATCH_PX, 0.0, 0.0, 0, i)
            for i, (u, v) in enumerate(uv.tolist())
        ]
        kept, desc = self._orb.compute(gray, points)
        if desc is not None and len(kept):
            out[[k.class_id for k in kept]] = desc
        return out

    def _track(self, gray: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Track the previous points into ``gray``: positions ``(N, 2)``, ids ``(N,)`` and motions ``(N, 2)``.

        Each search starts where the point's last motion (for a new track, the median motion) predicts
        it, so a fast turn's 50-100 px per frame stay within the pyramid's reach.
        """
        if self._prev_img is None or len(self._prev_uv) == 0:
            return np.zeros((0, 2), np.float32), np.zeros(0, np.int64), np.zeros((0, 2), np.float32)
        p0 = self._prev_uv.reshape(-1, 1, 2)
        guess = (self._prev_uv + self._prev_flow).reshape(-1, 1, 2).astype(np.float32)
        p1, st1 = self._flow(self._prev_img, gray, p0, guess)
        p0r, st2 = self._flow(gray, self._prev_img, p1, p0.copy())
        fb = np.linalg.norm((p0r - p0).reshape(-1, 2), axis=1)
        uv = p1.reshape(-1, 2)
        h, w = gray.shape
        b = self.opts.border_px / 2
        inside = (uv[:, 0] >= b) & (uv[:, 0] < w - b) & (uv[:, 1] >= b) & (uv[:, 1] < h - b)
        keep = (st1.ravel() == 1) & (st2.ravel() == 1) & (fb < self.opts.max_fb_error_px) & inside
        flow = (uv - self._prev_uv)[keep].astype(np.float32)
        return uv[keep].astype(np.float32), self._prev_ids[keep], flow

    def _flow(
        self, img0: np.ndarray, img1: np.ndarray, uv0: np.ndarray, guess: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pyramidal Lucas-Kanade from ``img0`` to ``img1`` starting at ``guess``.

        Points and guesses are ``(N, 1, 2)`` pixels; returns the found points ``(N, 1, 2)`` and their
        status ``(N, 1)`` (1 where found).
        """
        w = self.opts.window_px
        uv1, status, _ = cv2.calcOpticalFlowPyrLK(
            img0, img1, uv0, guess, winSize=(w, w), maxLevel=self.opts.pyramid_levels,
            criteria=_LK_CRITERIA, flags=cv2.OPTFLOW_USE_INITIAL_FLOW,
        )  # fmt: skip
        return uv1, status

    def _top_up(
        self, gray: np.ndarray, uv: np.ndarray, ids: np.ndarray, hand_mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        o = self.opts
        h, w = gray.shape
        n_cols = -(-w // o.cell_px)
        keypoints = self._fast.detect(gray)
        if not keypoints:
            return uv, ids
        cand = np.array([k.pt for k in keypoints], np.float32)
        score = np.array([k.response for k in keypoints], np.float32)
        b = o.border_px
        ok = (cand[:, 0] >= b) & (cand[:, 0] < w - b) & (cand[:, 1] >= b) & (cand[:, 1] < h - b)
        if hand_mask is not None:
            ok &= ~hand_mask[cand[:, 1].astype(int), cand[:, 0].astype(int)]
        cell = _grid_cell(cand, o.cell_px, n_cols)
        taken = np.zeros(n_cols * -(-h // o.cell_px), bool)
        taken[_grid_cell(uv, o.cell_px, n_cols)] = True
        ok &= ~taken[cell]
        cand, score, cell = cand[ok], score[ok], cell[ok]
        order = np.lexsort((-score, cell))  # by cell, strongest first
        first = order[np.r_[True, cell[order][1:] != cell[order][:-1]]] if len(order) else order
        best = first[np.argsort(-score[first])][: max(o.max_features - len(uv), 0)]
        new_uv = cand[best]
        new_ids = np.arange(self._next_id, self._next_id + len(new_uv), dtype=np.int64)
        self._next_id += len(new_uv)
        return np.concatenate([uv, new_uv]), np.concatenate([ids, new_ids])


def _grid_cell(uv_px: np.ndarray, cell_px: int, n_cols: int) -> np.ndarray:
    """Row-major index of the grid cell holding each pixel position ``(N, 2)``, ``(N,)``."""
    ij = (uv_px // cell_px).astype(np.int64)
    return ij[:, 1] * n_cols + ij[:, 0]


HandRegion = np.ndarray | None
"""Hands of one frame: a bool mask ``(H, W)`` (True on hand pixels), boxes ``(K, 4)`` as pixel
``(u_min, v_min, u_max, v_max)``, or None when unknown."""


def hand_mask_from_boxes(boxes: np.ndarray, shape: tuple[int, int], margin_px: float = 0.0) -> np.ndarray:
    """Bool mask ``(H, W)`` that is True on pixels whose centre lies inside any box.

    Args:
        boxes: ``(K, 4)`` pixel boxes ``(u_min, v_min, u_max, v_max)``; NaN rows are ignored.
        shape: ``(H, W)`` of the image.
        margin_px: grow each box by this many pixels on every side.

    Returns:
        The mask.

    Raises:
        ShapeError: if ``boxes`` is not ``(K, 4)``.
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ShapeError("hand boxes", boxes.shape, "(K, 4)")
    mask = np.zeros(shape, bool)
    for u0, v0, u1, v1 in boxes[np.isfinite(boxes).all(axis=1)]:
        r0, r1 = max(int(np.ceil(v0 - margin_px)), 0), min(int(np.floor(v1 + margin_px)) + 1, shape[0])
        c0, c1 = max(int(np.ceil(u0 - margin_px)), 0), min(int(np.floor(u1 + margin_px)) + 1, shape[1])
        mask[r0:r1, c0:c1] = True
    return mask


def _as_mask(region: HandRegion, shape: tuple[int, int]) -> np.ndarray | None:
    if region is None or region.dtype == bool:
        return region
    return hand_mask_from_boxes(region, shape)


def extract_features(
    grays: Iterable[np.ndarray],
    opts: FeatureOptions | None = None,
    hand_masks: Iterable[HandRegion] | None = None,
) -> Iterator[FrameFeatures]:
    """Run a ``KltTracker`` over frames in decode order.

    Args:
        grays: grayscale frames, each ``(H, W)`` uint8.
        opts: tracker options.
        hand_masks: per frame a ``HandRegion`` (bool mask ``(H, W)``, boxes ``(K, 4)`` or None), or
            None for no masking.

    Yields:
        ``FrameFeatures`` for frame 0, 1, ...
    """
    tracker = KltTracker(opts)
    masks = iter(hand_masks) if hand_masks is not None else None
    for idx, gray in enumerate(grays):
        yield tracker.step(idx, gray, _as_mask(next(masks), gray.shape) if masks is not None else None)
