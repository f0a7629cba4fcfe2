"""The hand-estimator interface: what any 2-D hand model gives per frame.

A user can plug in a stronger model on a cluster by writing a class with an `estimate` method of the
same signature (structural typing: no base class to inherit) and naming it in the config.

Keypoints are the 21 of MediaPipe, in its order (`KEYPOINT_NAMES`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "FINGER_BASES",
    "FINGER_CHAINS",
    "KEYPOINT_NAMES",
    "NUM_KEYPOINTS",
    "HandEstimator",
    "HandObservation",
    "Handedness",
    "MultiStreamEstimator",
    "RIGID_PALM",
    "StreamState",
    "check_frames",
    "palm_sizes",
]

logger = logging.getLogger(__name__)

NUM_KEYPOINTS = 21
KEYPOINT_NAMES: tuple[str, ...] = (
    "wrist",
    "thumb_cmc", "thumb_mcp", "thumb_ip", "thumb_tip",
    "index_mcp", "index_pip", "index_dip", "index_tip",
    "middle_mcp", "middle_pip", "middle_dip", "middle_tip",
    "ring_mcp", "ring_pip", "ring_dip", "ring_tip",
    "pinky_mcp", "pinky_pip", "pinky_dip", "pinky_tip",
)  # fmt: skip
# Keypoint indices of each finger from the wrist outwards (the skeleton's bones are consecutive pairs).
FINGER_CHAINS: tuple[tuple[int, ...], ...] = (
    (0, 1, 2, 3, 4),
    (0, 5, 6, 7, 8),
    (0, 9, 10, 11, 12),
    (0, 13, 14, 15, 16),
    (0, 17, 18, 19, 20),
)
#: The four finger bases (index, middle, ring, little MCP); wrist -> these is the hand's palm size.
FINGER_BASES: tuple[int, ...] = (5, 9, 13, 17)
#: Wrist and finger bases: rigid, unlike the fingers, whose fitted articulation can change between frames.
RIGID_PALM: tuple[int, ...] = (0, *FINGER_BASES)


def palm_sizes(keypoints: np.ndarray) -> np.ndarray:
    """Palm size of each hand: mean wrist -> finger-base distance, in the keypoints' units.

    Args:
        keypoints: hands `(..., 21, D)` (pixels `D = 2`, metres `D = 3`).

    Returns:
        `(...)`.
    """
    to_bases = keypoints[..., list(FINGER_BASES), :] - keypoints[..., :1, :]
    return np.linalg.norm(to_bases, axis=-1).mean(axis=-1)


Handedness = Literal["left", "right"]


@dataclass(frozen=True)
class HandObservation:
    """One hand seen in one frame.

    Attributes:
        keypoints_px: keypoint positions in the image, pixels (x right, y down), `(21, 2)`.
        score: detector confidence that this is a hand, in [0, 1].
        handedness: the detector's guess, *anatomical* side (the estimator undoes any mirrored-image
            convention); wearer association does not trust it alone.
        handedness_score: probability of `handedness`, in [0.5, 1].
        keypoints_rel_m: optional articulated metric hand shape from the model, metres, `(21, 3)`, any
            rotation and origin; the metric fit uses it as the hand's shape when present.
    """

    keypoints_px: np.ndarray
    score: float
    handedness: Handedness
    handedness_score: float
    keypoints_rel_m: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.keypoints_px.shape != (NUM_KEYPOINTS, 2):
            raise ShapeError("keypoints_px", self.keypoints_px.shape, "(21, 2)")
        if self.keypoints_rel_m is not None and self.keypoints_rel_m.shape != (NUM_KEYPOINTS, 3):
            raise ShapeError("keypoints_rel_m", self.keypoints_rel_m.shape, "(21, 3)")


@runtime_checkable
class HandEstimator(Protocol):
    """Finds hands in a batch of frames.

    An implementation loads its model once (in its constructor) and may keep state between calls
    (video mode: the previous frame's hands seed the next); `reset` forgets it between episodes.
    """

    def estimate(self, frames: np.ndarray, camera_k: np.ndarray) -> list[list[HandObservation]]:
        """Find every hand in each frame.

        Args:
            frames: consecutive RGB frames of one episode, uint8, `(B, H, W, 3)`.
            camera_k: pinhole intrinsics of those frames, pixels, `(3, 3)`; a 2-D model may ignore it.

        Returns:
            For each frame, the hands found (possibly none).
        """
        ...

    def reset(self) -> None:
        """Forget state carried between frames (call between episodes)."""
        ...


#: A stream's tracking state, opaque to callers (`MultiStreamEstimator.new_stream`).
StreamState = object


@runtime_checkable
class MultiStreamEstimator(HandEstimator, Protocol):
    """An estimator that can advance several independent streams (e.g. shards) in lockstep.

    Batching the streams' network calls is what keeps a GPU busy (bench/results/hands_torch.md);
    an estimator without this capability runs one stream at a time (`estimate`, `reset`).
    """

    def new_stream(self) -> StreamState:
        """The state of a new stream of consecutive frames."""
        ...

    def estimate_streams(
        self, chunks: Sequence[np.ndarray], camera_ks: Sequence[np.ndarray], streams: Sequence[StreamState]
    ) -> list[list[list[HandObservation]]]:
        """Per stream, per frame of its next chunk, the hands found; `streams` advance.

        Args:
            chunks: per stream, its next consecutive RGB frames, uint8, `(B_i, H_i, W_i, 3)`.
            camera_ks: per stream, pinhole intrinsics of those frames, pixels, `(3, 3)`.
            streams: per stream, its state from `new_stream`.
        """
        ...


def check_frames(frames: np.ndarray) -> None:
    """Raise `ShapeError` unless `frames` is a uint8 RGB batch `(B, H, W, 3)`."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ShapeError(f"frames (dtype {frames.dtype})", frames.shape, "(B, H, W, 3) uint8")
