"""MediaPipe's hand networks in torch: the `.tflite` weights run as batched torch modules, GPU or CPU.

The palm detector and the landmark model are rebuilt from the same model bytes the LiteRT backend
runs (`pose_core.tflite`: the graph read op by op, float16 weights dequantised to float32), so the
two backends agree to float rounding (`tests/pose_core/hands/test_torch_networks.py` measures it on
real frames). A stack of N inputs is one forward pass, in chunks of at most `max_batch`; on CUDA a
chunk is padded to a power of two, so only a few input shapes ever reach cuDNN.

On CUDA, TF32 convolutions are off by default (`allow_tf32`): they trade about three decimal digits
of the weights for speed, which moves keypoints; turn them on only after checking parity.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import numpy as np
import torch

from pose_core.hands.networks import (
    LANDMARK_INPUT,
    PALM_INPUT,
    LandmarkOutputs,
    PalmOutputs,
    check_inputs,
    landmark_outputs,
    palm_outputs,
)
from pose_core.tflite.graph import read_tflite
from pose_core.tflite.torch_module import TfliteModule

__all__ = ["TorchHandNetworks"]

logger = logging.getLogger(__name__)


class TorchHandNetworks:
    """The palm detector and landmark model as torch modules on one device.

    Args:
        palm_model: bytes of ``palm_detection_full.tflite``.
        landmark_model: bytes of ``hand_landmark_full.tflite``.
        device: torch device, e.g. ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        max_batch: most inputs per forward pass (bounds device memory).
        allow_tf32: let cuDNN use TF32 for the convolutions on CUDA (faster, less exact).
        pad_batches: pad each chunk with zero images to a power of two (see `_padded`); default: on CUDA.
    """

    def __init__(
        self,
        palm_model: bytes,
        landmark_model: bytes,
        device: str = "cpu",
        max_batch: int = 256,
        allow_tf32: bool = False,
        pad_batches: bool | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.allow_tf32 = allow_tf32
        self.pad_batches = self.device.type == "cuda" if pad_batches is None else pad_batches
        self._palm = TfliteModule(read_tflite(palm_model)).to(self.device).eval()
        self._landmark = TfliteModule(read_tflite(landmark_model)).to(self.device).eval()
        logger.info("hand networks in torch on %s (max batch %d)", self.device, max_batch)

    def palms(self, squares: np.ndarray) -> PalmOutputs:
        """See `HandNetworks.palms`."""
        check_inputs(squares, PALM_INPUT)
        return palm_outputs(self._run(self._palm, squares))

    def landmarks(self, crops: np.ndarray) -> LandmarkOutputs:
        """See `HandNetworks.landmarks`."""
        check_inputs(crops, LANDMARK_INPUT)
        return landmark_outputs(self._run(self._landmark, crops))

    def _run(self, module: TfliteModule, images: np.ndarray) -> list[np.ndarray]:
        """Forward `images` `(N, H, W, 3)` in chunks; outputs concatenated, in the graph's order."""
        chunks = []
        with torch.inference_mode(), self._precision():
            for start in range(0, len(images), self.max_batch):
                chunk = images[start : start + self.max_batch]
                x = torch.from_numpy(np.ascontiguousarray(self._padded(chunk)))
                outs = module(x.to(self.device, non_blocking=True))
                chunks.append([o[: len(chunk)].float().cpu().numpy() for o in outs])
        return [np.concatenate(column) for column in zip(*chunks, strict=True)]

    def _padded(self, chunk: np.ndarray) -> np.ndarray:
        """`chunk` `(n, H, W, 3)`, padded with zero images to a power of two when `pad_batches`.

        At most `max_batch`. cuDNN builds its plans per input shape (over a second for the landmark
        model on an H200: `bench.torch_shapes`), so a video's varying hand counts would pay that for
        every new batch size.
        """
        if not self.pad_batches:
            return chunk
        size = min(1 << (len(chunk) - 1).bit_length(), self.max_batch)
        if size == len(chunk):
            return chunk
        return np.concatenate([chunk, np.zeros((size - len(chunk), *chunk.shape[1:]), chunk.dtype)])

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        """Set cuDNN's TF32 switch set to `allow_tf32` for the call, restored after (CUDA only)."""
        if self.device.type != "cuda":
            yield
            return
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.allow_tf32
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32 = before
