"""64-bit perceptual hashes of frames (DCT pHash) and their Hamming distance."""

from __future__ import annotations

import logging

import cv2
import numpy as np

from pose_core.errors import ShapeError

__all__ = ["hamming", "phash", "sample_positions"]

logger = logging.getLogger(__name__)

_RESIZE_PX = 32  # the grey frame is reduced to 32x32 before the DCT
_LOW_FREQ = 8  # the 8x8 lowest DCT frequencies make the 64 bits


def phash(frame: np.ndarray) -> int:
    """DCT perceptual hash of one frame.

    The frame is converted to grey, area-resized to 32x32, transformed with a 2-D DCT; bit `i`
    of the result (row-major over the 8x8 lowest frequencies, DC included) is 1 where that
    coefficient exceeds the median of the 64. Robust to re-encoding, bitrate and resolution
    changes; not to crops or rotations.

    Args:
        frame: `(H, W, 3)` uint8 RGB or `(H, W)` uint8 grey.

    Returns:
        The hash as an int in `[0, 2**64)`.

    Raises:
        ShapeError: the frame is not `(H, W)` or `(H, W, 3)`.
    """
    if frame.ndim == 3 and frame.shape[2] == 3:
        grey = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    elif frame.ndim == 2:
        grey = frame
    else:
        raise ShapeError("phash frame", tuple(frame.shape), "(H, W, 3) or (H, W)")
    small = cv2.resize(grey, (_RESIZE_PX, _RESIZE_PX), interpolation=cv2.INTER_AREA).astype(np.float32)
    low = cv2.dct(small)[:_LOW_FREQ, :_LOW_FREQ].ravel()
    bits = low > np.median(low)
    return int(np.packbits(bits).view(">u8")[0])


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two 64-bit hashes."""
    return (a ^ b).bit_count()


def sample_positions(length: int, k: int) -> np.ndarray:
    """Indices of `min(k, length)` evenly spread relative positions `(i + 0.5) / k` in `[0, length)`.

    Used both to pick the frames a clip's hashes come from and to align two hash lists, so that
    re-encodes with other frame counts compare frames at the same relative time.

    Returns:
        `(min(k, length),)` int64, increasing.
    """
    k = min(k, length)
    return np.floor((np.arange(k) + 0.5) * length / k).astype(np.int64)
