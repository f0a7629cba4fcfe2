"""Model files from the cache for the algorithms that need them (`conf.models` fills the cache at set-up).

The algorithms in `pose_core` take model bytes (or paths, for the face detector); this is where the
pipeline, the benchmarks and the tests get them, hash-checked, so no caller spells the file names.
It also picks the hand networks' runtime (`hand_backend`) for a device: torch on a CUDA GPU when the
options allow it, else LiteRT on CPU. torch's CPU threads are the task's (`udfs.device.enter`).
"""

from __future__ import annotations

import logging

from conf.models import model_bytes, model_path
from pose_core.errors import EgolakeError
from pose_core.hands.mediapipe_estimator import MediaPipeHandEstimator, MediaPipeOptions
from pose_core.hands.networks import HandNetworks, LiteRtHandNetworks
from pose_core.privacy.faces import DETECTORS, FaceBlurOptions, FaceBlurrer

__all__ = ["face_blurrer", "hand_backend", "hand_estimator", "hand_model_bytes", "hand_networks"]

logger = logging.getLogger(__name__)


def hand_model_bytes() -> tuple[bytes, bytes]:
    """(palm detector, landmark model) `.tflite` bytes of the default MediaPipe hand estimator.

    Raises:
        FileNotFoundError: a model is missing or damaged (the message gives the fix).
    """
    return model_bytes("palm_detection_full.tflite"), model_bytes("hand_landmark_full.tflite")


def hand_backend(opts: MediaPipeOptions, device: str | None = None) -> tuple[str, str]:
    """Which runtime and device run the hand networks: ``("litert", "cpu")`` or ``("torch", device)``.

    Args:
        opts: the estimator's options (`backend`: auto, litert or torch).
        device: torch device to use (e.g. the task's ``"cuda:1"``); None: ``"cuda"`` when torch sees a
            GPU, else ``"cpu"``. "auto" takes torch only on a GPU: on CPU LiteRT is the faster one.

    Raises:
        EgolakeError: backend "torch" without torch installed.
    """
    if opts.backend == "litert":
        return "litert", "cpu"
    try:
        import torch  # noqa: PLC0415 -- optional (extra `gpu`), heavy
    except ImportError as err:
        if opts.backend == "torch":
            raise EgolakeError(
                "hands.estimator.mediapipe.backend is 'torch' but torch is not installed: "
                "pip install 'egolake[gpu]' or use backend 'litert'"
            ) from err
        return "litert", "cpu"
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if opts.backend == "auto" and torch.device(chosen).type != "cuda":
        return "litert", "cpu"
    return "torch", chosen


def hand_networks(opts: MediaPipeOptions, device: str | None = None) -> HandNetworks:
    """The hand networks on the runtime and device `hand_backend` picks, weights from the cache.

    Raises:
        FileNotFoundError: a model is missing or damaged (the message gives the fix).
        EgolakeError: backend "torch" without torch installed.
    """
    backend, chosen = hand_backend(opts, device)
    palm, landmark = hand_model_bytes()
    logger.info("hand networks: %s on %s", backend, chosen)
    if backend == "litert":
        return LiteRtHandNetworks(palm, landmark, opts.num_threads)
    from pose_core.hands.torch_networks import TorchHandNetworks  # noqa: PLC0415 -- imports torch

    return TorchHandNetworks(palm, landmark, chosen, allow_tf32=opts.allow_tf32)


def hand_estimator(opts: MediaPipeOptions, device: str | None = None) -> MediaPipeHandEstimator:
    """The MediaPipe hand estimator with `hand_networks(opts, device)`.

    Raises:
        FileNotFoundError: a model is missing or damaged (the message gives the fix).
        EgolakeError: backend "torch" without torch installed.
    """
    return MediaPipeHandEstimator(hand_networks(opts, device), opts)


def face_blurrer(opts: FaceBlurOptions) -> FaceBlurrer:
    """A face blurrer with `opts.detector`'s cached model (none is read when blurring is off).

    Raises:
        FileNotFoundError: the model is missing or damaged (the message gives the fix).
    """
    return FaceBlurrer(opts, model_path(DETECTORS[opts.detector].model) if opts.enabled else None)
