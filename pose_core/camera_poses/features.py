"""Per-frame features: KLT optical-flow tracks with persistent track ids, hands masked out.

Why KLT tracks and not ORB or SIFT: between consecutive video frames the motion is small, so
pyramidal Lucas-Kanade gives sub-pixel correspondences with identities for free (no descriptor
matching), about 10 ms per 640x480 frame on one core with a forward-backward check; ORB is 2-3x
slower per frame once matching is included and its corners are pixel-quantised, SIFT is ~10x
slower. ``bench/camera_poses.py`` measures the three. Descriptors would be needed to re-find a
track after it is lost (loop closure); that is not done here.

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

__all__ = ["FeatureOptions", "FrameFeatures", "KltTracker", "extract_features"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureOptions:
    """Knobs of the KLT tracker."""

    # number of tracks kept alive per frame; new corners are detected when fewer survive
    max_features: int = 500
    # re-detect corners when the live tracks fall below this fraction of max_features
    redetect_ratio: float = 0.7
    # minimum distance between corners, pixels
    min_distance_px: float = 12.0
    # Shi-Tomasi quality level, relative to the strongest corner
    corner_quality: float = 0.005
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
        mask = np.zeros(gray.shape, np.uint8)
        mask[o.border_px:-o.border_px, o.border_px:-o.border_px] = 255
        if hand_mask is not None:
            mask[hand_mask] = 0
        for u, v in uv:
            cv2.circle(mask, (int(u), int(v)), int(o.min_distance_px), 0, -1)
        want = o.max_features - len(uv)
        corners = cv2.goodFeaturesToTrack(gray, want, o.corner_quality, o.min_distance_px, mask=mask)
        if corners is None:
            return uv, ids
        new_uv = corners.reshape(-1, 2).astype(np.float32)
        new_ids = np.arange(self._next_id, self._next_id + len(new_uv), dtype=np.int64)
        self._next_id += len(new_uv)
        return np.concatenate([uv, new_uv]), np.concatenate([ids, new_ids])


def extract_features(
    grays: Iterable[np.ndarray],
    opts: FeatureOptions | None = None,
    hand_masks: Iterable[np.ndarray | None] | None = None,
) -> Iterator[FrameFeatures]:
    """Run a ``KltTracker`` over frames in decode order.

    Args:
        grays: grayscale frames, each ``(H, W)`` uint8.
        opts: tracker options.
        hand_masks: per-frame hand masks ``(H, W)`` bool (or None entries), or None for no masking.

    Yields:
        ``FrameFeatures`` for frame 0, 1, ...
    """
    tracker = KltTracker(opts)
    masks = iter(hand_masks) if hand_masks is not None else None
    for idx, gray in enumerate(grays):
        yield tracker.step(idx, gray, next(masks) if masks is not None else None)
