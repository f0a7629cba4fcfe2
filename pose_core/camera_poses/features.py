"""Per-frame features: KLT optical-flow tracks with persistent track ids, hands masked out.

Why KLT tracks and not ORB or SIFT: between consecutive video frames the motion is small, so
pyramidal Lucas-Kanade gives sub-pixel correspondences with identities for free (no descriptor
matching), about 10 ms per 640x480 frame on one core with a forward-backward check; ORB is 2-3x
slower per frame once matching is included and its corners are pixel-quantised, SIFT is ~10x
slower. ``bench/camera_poses.py`` measures the three. Descriptors would be needed to re-find a
track after it is lost (loop closure); that is not done here.

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
    "FeatureOptions", "FrameFeatures", "HandRegion", "KltTracker", "extract_features", "hand_mask_from_boxes",
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


@dataclass(frozen=True)
class FrameFeatures:
    """The tracks seen in one frame.

    Attributes:
        frame_idx: 0-based frame index in decode order.
        track_ids: persistent id of each track, unique within an episode, shape ``(N,)`` int64.
        uv_px: distorted pixel position of each track, shape ``(N, 2)`` float32.
    """

    frame_idx: int
    track_ids: np.ndarray
    uv_px: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.track_ids)
        if np.shape(self.uv_px) != (n, 2):
            raise ShapeError("FrameFeatures.uv_px", np.shape(self.uv_px), f"({n}, 2)")

    def to_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """Compact columns for one table row: ``track_ids (N,) int64`` and ``uv_px (2N,) float32``."""
        return self.track_ids.astype(np.int64), self.uv_px.astype(np.float32).reshape(-1)

    @classmethod
    def from_flat(cls, frame_idx: int, track_ids: np.ndarray, uv_px_flat: np.ndarray) -> FrameFeatures:
        """Inverse of ``to_flat``."""
        uv = np.asarray(uv_px_flat, dtype=np.float32)
        if uv.size != 2 * len(track_ids):
            raise ShapeError("uv_px_flat", uv.shape, f"({2 * len(track_ids)},)")
        return cls(int(frame_idx), np.asarray(track_ids, dtype=np.int64), uv.reshape(-1, 2))


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
        w = self.opts.window_px
        self._lk = {"winSize": (w, w), "maxLevel": self.opts.pyramid_levels,
                    "criteria": (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 20, 0.03)}
        self._fast = cv2.FastFeatureDetector_create(self.opts.fast_threshold)

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
        uv, ids = self._track(gray)
        if hand_mask is not None and len(uv):
            ui = np.clip(uv[:, 0].round().astype(int), 0, gray.shape[1] - 1)
            vi = np.clip(uv[:, 1].round().astype(int), 0, gray.shape[0] - 1)
            keep = ~hand_mask[vi, ui]
            uv, ids = uv[keep], ids[keep]
        if len(uv) < self.opts.redetect_ratio * self.opts.max_features:
            uv, ids = self._top_up(gray, uv, ids, hand_mask)
        self._prev_img, self._prev_uv, self._prev_ids = gray, uv, ids
        return FrameFeatures(frame_idx, ids.copy(), uv.copy())

    def _track(self, gray: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._prev_img is None or len(self._prev_uv) == 0:
            return np.zeros((0, 2), np.float32), np.zeros(0, np.int64)
        p0 = self._prev_uv.reshape(-1, 1, 2)
        p1, st1, _ = cv2.calcOpticalFlowPyrLK(self._prev_img, gray, p0, None, **self._lk)
        p0r, st2, _ = cv2.calcOpticalFlowPyrLK(gray, self._prev_img, p1, None, **self._lk)
        fb = np.linalg.norm((p0r - p0).reshape(-1, 2), axis=1)
        uv = p1.reshape(-1, 2)
        h, w = gray.shape
        b = self.opts.border_px / 2
        inside = (uv[:, 0] >= b) & (uv[:, 0] < w - b) & (uv[:, 1] >= b) & (uv[:, 1] < h - b)
        keep = (st1.ravel() == 1) & (st2.ravel() == 1) & (fb < self.opts.max_fb_error_px) & inside
        return uv[keep].astype(np.float32), self._prev_ids[keep]

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
