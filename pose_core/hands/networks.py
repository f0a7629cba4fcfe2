"""The two networks of MediaPipe's hand pipeline behind one batched interface, and its LiteRT backend.

`MediaPipeHandEstimator` calls `HandNetworks.palms` and `.landmarks` with stacks of prepared images
(letterboxed or windowed detector inputs, rotated hand crops: `rois.py` makes them) and decodes what
comes back; the backend only runs the networks. `LiteRtHandNetworks` runs the `.tflite` files with
the LiteRT interpreter, one image per invoke (the CPU default); `torch_networks.TorchHandNetworks`
runs the same files' weights in torch, a whole stack per call (GPU, or CPU).

Both take the models' bytes: the caller reads the (hash-checked) files; nothing here reads a path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "LANDMARK_INPUT",
    "PALM_INPUT",
    "HandNetworks",
    "LandmarkOutputs",
    "LiteRtHandNetworks",
    "PalmOutputs",
    "check_inputs",
    "landmark_outputs",
    "palm_outputs",
]

logger = logging.getLogger(__name__)

#: Side of the palm detector's square input and of the landmark model's crop, pixels.
PALM_INPUT = 192
LANDMARK_INPUT = 224


@dataclass(frozen=True)
class PalmOutputs:
    """Raw palm-detector outputs of N inputs.

    Attributes:
        boxes: `(N, 2016, 18)`: per anchor, box centre offset and size, then 7 keypoints (x, y), input pixels.
        logits: `(N, 2016)` palm score logits.
    """

    boxes: np.ndarray
    logits: np.ndarray


@dataclass(frozen=True)
class LandmarkOutputs:
    """Raw landmark-model outputs of N crops.

    Attributes:
        keypoints: `(N, 21, 3)`: x, y in crop pixels (of `LANDMARK_INPUT`), relative depth.
        presence: `(N,)` hand-presence score in [0, 1].
        label0: `(N,)` score of the model's handedness label 0 ("Left" on a mirrored image).
        world: `(N, 21, 3)` metric keypoints, metres, origin near the hand's centre.
    """

    keypoints: np.ndarray
    presence: np.ndarray
    label0: np.ndarray
    world: np.ndarray


def palm_outputs(outputs: Sequence[np.ndarray]) -> PalmOutputs:
    """The palm graph's outputs in graph order (boxes `(N, 2016, 18)`, logits `(N, 2016, 1)`), named."""
    boxes, logits = outputs
    return PalmOutputs(np.asarray(boxes, np.float32), np.asarray(logits, np.float32).reshape(len(boxes), -1))


def landmark_outputs(outputs: Sequence[np.ndarray]) -> LandmarkOutputs:
    """The landmark graph's outputs in graph order (keypoints, presence, handedness, world), named."""
    keypoints, presence, label0, world = (np.asarray(o, np.float32) for o in outputs)
    n = len(keypoints)
    return LandmarkOutputs(
        keypoints.reshape(n, 21, 3), presence.reshape(n), label0.reshape(n), world.reshape(n, 21, 3)
    )


def check_inputs(images: np.ndarray, side: int) -> None:
    """Raise `ShapeError` unless `images` is a float32 stack `(N, side, side, 3)` with N >= 1."""
    shape_ok = images.ndim == 4 and images.shape[1:] == (side, side, 3) and len(images) > 0
    if not shape_ok or images.dtype != np.float32:
        expected = f"(N>=1, {side}, {side}, 3) float32"
        raise ShapeError(f"network inputs (dtype {images.dtype})", images.shape, expected)


@runtime_checkable
class HandNetworks(Protocol):
    """Runs the palm detector and the landmark model on stacks of prepared inputs."""

    def palms(self, squares: np.ndarray) -> PalmOutputs:
        """Palm detector on `(N, 192, 192, 3)` float32 inputs in [0, 1]."""
        ...

    def landmarks(self, crops: np.ndarray) -> LandmarkOutputs:
        """Landmark model on `(N, 224, 224, 3)` float32 hand crops in [0, 1]."""
        ...


class LiteRtHandNetworks:
    """The two `.tflite` models on the LiteRT interpreter (XNNPACK on CPU), one input per invoke.

    Args:
        palm_model: bytes of ``palm_detection_full.tflite``.
        landmark_model: bytes of ``hand_landmark_full.tflite``.
        num_threads: interpreter threads per model; 1 when Spark already runs one task per core.
    """

    def __init__(self, palm_model: bytes, landmark_model: bytes, num_threads: int = 1) -> None:
        from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 -- heavy; only for this backend

        self._palm = Interpreter(model_content=palm_model, num_threads=num_threads)
        self._landmark = Interpreter(model_content=landmark_model, num_threads=num_threads)
        for interp in (self._palm, self._landmark):
            interp.allocate_tensors()

    def palms(self, squares: np.ndarray) -> PalmOutputs:
        """See `HandNetworks.palms`."""
        check_inputs(squares, PALM_INPUT)
        return palm_outputs(self._run(self._palm, squares))

    def landmarks(self, crops: np.ndarray) -> LandmarkOutputs:
        """See `HandNetworks.landmarks`."""
        check_inputs(crops, LANDMARK_INPUT)
        return landmark_outputs(self._run(self._landmark, crops))

    @staticmethod
    def _run(interp: Any, images: np.ndarray) -> list[np.ndarray]:
        """Invoke once per image; outputs stacked, in the graph's output order."""
        index = interp.get_input_details()[0]["index"]
        outs = interp.get_output_details()
        per_image = []
        for image in images:
            interp.set_tensor(index, image[None])
            interp.invoke()
            per_image.append([interp.get_tensor(o["index"])[0].copy() for o in outs])
        return [np.stack(column) for column in zip(*per_image, strict=True)]
