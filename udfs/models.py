"""Model files from the cache for the algorithms that need them (`conf.models` fills the cache at set-up).

The algorithms in `pose_core` take model paths; this is where the pipeline, the benchmarks and the
tests get them, hash-checked, so no caller spells the file names.
"""

from __future__ import annotations

from pathlib import Path

from conf.models import model_path
from pose_core.privacy.faces import DETECTORS, FaceBlurOptions, FaceBlurrer

__all__ = ["face_blurrer", "hand_model_paths"]


def hand_model_paths() -> tuple[Path, Path]:
    """(palm detector, landmark model) `.tflite` files of the default MediaPipe hand estimator.

    Raises:
        FileNotFoundError: a model is missing or damaged (the message gives the fix).
    """
    return model_path("palm_detection_full.tflite"), model_path("hand_landmark_full.tflite")


def face_blurrer(opts: FaceBlurOptions) -> FaceBlurrer:
    """A face blurrer with `opts.detector`'s cached model (none is read when blurring is off).

    Raises:
        FileNotFoundError: the model is missing or damaged (the message gives the fix).
    """
    return FaceBlurrer(opts, model_path(DETECTORS[opts.detector].model) if opts.enabled else None)
