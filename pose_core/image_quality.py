"""Cheap per-frame image statistics used by QA (exposure, blur)."""

from __future__ import annotations

import cv2
import numpy as np

from pose_core.errors import ShapeError

__all__ = ["frame_quality"]


def frame_quality(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Brightness and sharpness of each frame.

    Args:
        frames: RGB frames, uint8, `(B, H, W, 3)`.

    Returns:
        brightness: mean luma in 0..255, float32 `(B,)`.
        sharpness: variance of the Laplacian of luma, float32 `(B,)`; below ~50 is blurred.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ShapeError("frames", frames.shape, "(B, H, W, 3)")
    brightness = np.empty(len(frames), np.float32)
    sharpness = np.empty(len(frames), np.float32)
    for i, frame in enumerate(frames):
        luma = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        brightness[i] = luma.mean()
        sharpness[i] = cv2.Laplacian(luma, cv2.CV_32F).var()
    return brightness, sharpness
