"""The decoder's options (`udfs.options` re-exports them).

Apart from the other options so that a process without the pipeline's algorithms (the lerobot baseline of
bench/export.py, in lerobot's own environment) can decode as the pipeline does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DecodeOptions"]


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode.

    Attributes:
        backend: `auto` (decord, PyAV where decord fails or the video is rotated), `decord` or `pyav`.
        max_long_side_px: resize in the decoder so the long side is <= this many pixels; 0 = native.
        threads: decoder threads per call (keep 1 when Spark already runs one task per core).
        prefetch_chunks: chunks `iter_frames` decodes ahead in a background thread; 0 = none.
        skip_deblocking_below: PyAV skips the codec's in-loop deblocking filter when the output is at
            most this fraction of the stored size on both sides (0 = never). The blocking it leaves is
            mostly averaged away by the downscale: at 0.5, Y-PSNR against the full decode >= 40 dB on
            H.264, for 10-35 % less decode CPU (bench/results/decode.md). Decord ignores it.
        decord_window_mb: frames decord decodes in one go, MB (whole chunks, at least one); it is parked
            between windows, so this bounds the decoding process's frames in memory.
        timeout_s: > 0: `iter_frames` decodes in a forked child process (which also decodes ahead,
            in place of `prefetch_chunks`) and kills it when a chunk takes longer than this
            (`decode_timeout`); 0: in this process, unbounded.
    """

    # auto = decord first, PyAV fallback; or force one backend.
    backend: Literal["auto", "decord", "pyav"] = "auto"
    # Long side of the output frames in pixels, aspect kept; 0 keeps the native size.
    max_long_side_px: int = 640
    # Decoder threads per call.
    threads: int = 1
    # Chunks decoded ahead in a background thread while the caller works on the current one
    # (memory: this many extra chunks of frames); 0 decodes in the caller's thread. Unused with
    # timeout_s > 0: the decoding child process runs one chunk ahead instead.
    prefetch_chunks: int = 1
    # decord decodes this many MB of frames in one go and is parked while they are handed out (its
    # decoder thread otherwise decodes on, unasked, while the caller works): memory per decoding
    # process, and one seek back per window after the first (384: a 640x480 priors shard, 272 frames).
    decord_window_mb: float = 384.0
    # Skip the in-loop deblocking filter when the output is at most this fraction of the stored size
    # on both sides (PyAV only); 0 = never.
    skip_deblocking_below: float = 0.0
    # > 0: decode in a child process, killed when one chunk takes longer than this many seconds (the
    # unit fails `decode_timeout`, the batch goes on); 0: decode in the calling process, no limit.
    timeout_s: float = 0.0

    def __post_init__(self) -> None:
        if self.decord_window_mb <= 0:
            raise ValueError(f"decord_window_mb must be > 0, got {self.decord_window_mb}")
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 (0: no limit), got {self.timeout_s}")
        if self.backend not in ("auto", "decord", "pyav"):
            raise ValueError(f"backend must be auto, decord or pyav, got {self.backend!r}")
        if self.max_long_side_px < 0 or self.threads < 1 or self.prefetch_chunks < 0:
            raise ValueError("max_long_side_px and prefetch_chunks must be >= 0 and threads >= 1")
        if not 0.0 <= self.skip_deblocking_below < 1.0:
            raise ValueError(f"skip_deblocking_below must be in [0, 1), got {self.skip_deblocking_below}")
