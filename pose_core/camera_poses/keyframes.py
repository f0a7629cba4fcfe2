"""Keyframe selection by image motion and feature overlap.

A frame becomes a keyframe when, relative to the last keyframe, the shared tracks moved by a
median of ``min_flow_px`` pixels (a parallax proxy), or fewer than ``min_overlap`` of the last
keyframe's tracks are still alive, or ``max_gap_frames`` frames have passed. Tracking adds its
own reasons (too few map points in view) through ``KeyframeSelector.force``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from pose_core.camera_poses.features import FrameFeatures

__all__ = ["KeyframeOptions", "KeyframeSelector", "select_keyframes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyframeOptions:
    """Knobs of keyframe selection."""

    # median displacement of shared tracks since the last keyframe that triggers a keyframe, pixels
    min_flow_px: float = 25.0
    # a keyframe is taken when fewer than this fraction of the last keyframe's tracks survive
    min_overlap: float = 0.6
    # a keyframe is taken at least every this many frames
    max_gap_frames: int = 15


class KeyframeSelector:
    """Streaming keyframe decision over ``FrameFeatures`` in decode order."""

    def __init__(self, opts: KeyframeOptions | None = None) -> None:
        self.opts = opts or KeyframeOptions()
        self._last: FrameFeatures | None = None

    def flow_and_overlap(self, feat: FrameFeatures) -> tuple[float, float]:
        """Median displacement (pixels) and surviving fraction of the last keyframe's tracks."""
        if self._last is None or len(self._last.track_ids) == 0:
            return float("inf"), 0.0
        common, ia, ib = np.intersect1d(self._last.track_ids, feat.track_ids, return_indices=True)
        if len(common) == 0:
            return float("inf"), 0.0
        flow = np.linalg.norm(self._last.uv_px[ia] - feat.uv_px[ib], axis=1)
        return float(np.median(flow)), len(common) / len(self._last.track_ids)

    def wants(self, feat: FrameFeatures) -> bool:
        """Whether ``feat`` should be a keyframe (does not record it)."""
        if self._last is None:
            return True
        flow, overlap = self.flow_and_overlap(feat)
        gap = feat.frame_idx - self._last.frame_idx
        o = self.opts
        return flow >= o.min_flow_px or overlap < o.min_overlap or gap >= o.max_gap_frames

    def force(self, feat: FrameFeatures) -> None:
        """Record ``feat`` as the latest keyframe."""
        self._last = feat


def select_keyframes(features: Iterable[FrameFeatures], opts: KeyframeOptions | None = None) -> np.ndarray:
    """Keyframe flags for a sequence of frames (the first frame is always a keyframe).

    Args:
        features: per-frame tracks in decode order.
        opts: selection options.

    Returns:
        Keyframe flag per frame, shape ``(F,)`` bool.
    """
    selector = KeyframeSelector(opts)
    flags = []
    for feat in features:
        is_kf = selector.wants(feat)
        if is_kf:
            selector.force(feat)
        flags.append(is_kf)
    return np.asarray(flags, dtype=bool)
