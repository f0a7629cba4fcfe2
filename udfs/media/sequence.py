"""Image-sequence folders: frame times and image reading (the folder layout is in `sidecars`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import cv2
import numpy as np

from pose_core.errors import InputError
from udfs.media.sidecars import (
    SEQUENCE_CALIB,
    SEQUENCE_TIMESTAMPS,
    list_sequence_images,
    read_calibration,
    read_timestamps,
)

__all__ = ["DEFAULT_SEQUENCE_FPS", "SequenceTiming", "read_image_rgb", "sequence_timing"]

logger = logging.getLogger(__name__)

# Frame rate assumed for a sequence with neither timestamps.txt nor `fps` in calib.yaml.
DEFAULT_SEQUENCE_FPS = 30.0


@dataclass(frozen=True)
class SequenceTiming:
    """Images and frame times of an image-sequence folder.

    Attributes:
        image_paths: absolute image paths in frame order, F of them.
        ts_s: `(F,)` float64 seconds.
        source: where the times come from: `timestamps.txt`, `calib.yaml fps` or `default fps`.
    """

    image_paths: list[str]
    ts_s: np.ndarray
    source: str


def sequence_timing(folder: str) -> SequenceTiming:
    """Read the frame list and frame times of an image-sequence folder.

    Times come from `timestamps.txt`; lacking it, `idx / fps` with `fps` from `calib.yaml`,
    or `DEFAULT_SEQUENCE_FPS` (logged, and named in `source`).

    Raises:
        InputError: `bad_sidecar` for a malformed timestamps or calibration file.
    """
    images = list_sequence_images(folder)
    stamps = os.path.join(folder, SEQUENCE_TIMESTAMPS)
    if os.path.isfile(stamps):
        return SequenceTiming(images, read_timestamps(stamps, len(images)), SEQUENCE_TIMESTAMPS)
    calib = os.path.join(folder, SEQUENCE_CALIB)
    fps = read_calibration(calib).fps if os.path.isfile(calib) else None
    source = "calib.yaml fps"
    if fps is None:
        fps, source = DEFAULT_SEQUENCE_FPS, "default fps"
        logger.info(
            "%s has no %s and no fps in calib.yaml: assuming %.1f fps", folder, SEQUENCE_TIMESTAMPS, fps
        )
    return SequenceTiming(images, np.arange(len(images), dtype=np.float64) / fps, source)


def read_image_rgb(path: str, size_wh: tuple[int, int] | None = None) -> np.ndarray:
    """Read one image as RGB.

    Args:
        path: PNG or JPEG file.
        size_wh: resize to `(width, height)` pixels (area interpolation), or None for native size.

    Returns:
        `(H, W, 3)` uint8 RGB.

    Raises:
        InputError: `corrupt_frames` when the file cannot be decoded.
    """
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise InputError("corrupt_frames", f"image '{os.path.basename(path)}' cannot be decoded", path)
    if size_wh is not None and size_wh != (bgr.shape[1], bgr.shape[0]):
        bgr = cv2.resize(bgr, size_wh, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
