"""Write RGB frames to a video file with PyAV (H.264 by default; any FFmpeg encoder by name).

Convention:
    Frames are RGB uint8 `(H, W, 3)`, all the same size. Presentation times are either a constant
    rate (`frame_idx / fps`, exactly, in the stream time base `1 / fps`) or given per frame
    (`ts_s`, seconds, strictly increasing, stored in a `1 / 90000` s time base for variable-rate
    video). Chroma-subsampled pixel formats (`yuv420p`) need even width and height. RGB frames are
    converted by swscale, or for `yuv420p` with `rgb_converter="opencv"` by OpenCV (BT.601, limited
    range, as swscale's default, at a fraction of its cost; the export uses it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import av
import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError

__all__ = ["EncodeOptions", "VideoWriter", "encode_packets", "repeat_video", "write_video"]

logger = logging.getLogger(__name__)

# Time base for explicit (variable-rate) timestamps: the MPEG 90 kHz clock.
_VFR_TIME_BASE = Fraction(1, 90000)
# Pixel formats whose chroma planes are halved in both directions.
_SUBSAMPLED_420 = ("yuv420p", "yuvj420p", "nv12", "yuv420p10le")


@dataclass(frozen=True)
class EncodeOptions:
    """Encoder choice and quality.

    Attributes:
        codec: FFmpeg encoder or codec name: `h264` (libx264), `libx265`, `libsvtav1`, `libaom-av1`, ...
        pix_fmt: stored pixel format.
        crf: constant-rate-factor quality (lower is better; x264 default 23); None leaves the encoder default.
        bitrate: target bit rate, bits/s; None for quality-based (crf) encoding.
        preset: encoder speed preset (`medium` for x264, a number such as `8` for SVT-AV1), or None.
        gop_size: frames between key frames; None leaves the encoder default.
        codec_options: extra encoder options, passed as FFmpeg `-opt value` strings.
        rgb_converter: what converts RGB frames to `yuv420p`: FFmpeg's swscale, or OpenCV (a fraction
            of the cost, unbiased; the export's choice). Other pixel formats always use swscale.
    """

    codec: str = "h264"
    pix_fmt: str = "yuv420p"
    crf: int | None = 18
    bitrate: int | None = None
    preset: str | None = None
    gop_size: int | None = None
    codec_options: Mapping[str, str] = field(default_factory=dict)
    rgb_converter: Literal["swscale", "opencv"] = "swscale"


class VideoWriter:
    """Incremental encoder: open, `write` frames one by one, `close` (or use as a context manager).

    Several writers can be fed in lock-step (e.g. the left and right streams of a stereo pair).

    Args:
        path: output file; its folder must exist. The container comes from the extension.
        fps: nominal frame rate, Hz (a `Fraction` such as 30000/1001 is kept exact).
        opts: encoder settings; None uses `EncodeOptions()` (H.264, yuv420p, crf 18).
        variable_rate: True when every `write` gives its own `ts_s` (stored on a 90 kHz clock);
            False stamps frame `i` at exactly `i / fps`.

    Raises:
        ValueError: if `fps` is not positive.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fps: float | Fraction,
        opts: EncodeOptions | None = None,
        variable_rate: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1_000_000)
        if self.rate <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.opts = EncodeOptions() if opts is None else opts
        self.variable_rate = variable_rate
        self.count = 0
        self._last_pts = -1
        self._container = av.open(self.path, mode="w")
        self._stream: av.VideoStream | None = None

    def write(self, frame: NDArray[np.uint8], ts_s: float | None = None) -> None:
        """Encode one RGB uint8 frame `(H, W, 3)`; `ts_s` (seconds) is required iff `variable_rate`.

        Raises:
            ShapeError: if the frame is not RGB uint8, differs in size from the first frame, or has
                odd sides with a 4:2:0 pixel format.
            ValueError: if `ts_s` is missing, unexpected, or not after the previous frame's time.
        """
        if (ts_s is None) == self.variable_rate:
            raise ValueError(f"ts_s is {'required' if self.variable_rate else 'not accepted'} by this writer")
        if self._stream is None:
            self._stream = _open_stream(self._container, frame, self.rate, self.opts, self.variable_rate)
        _check_frame(frame, self._stream.height, self._stream.width, self.count)
        time_base = self._stream.codec_context.time_base
        pts = self.count if ts_s is None else round(float(ts_s) / time_base)
        if pts <= self._last_pts:
            raise ValueError(f"frame {self.count} at {ts_s} s is not after the previous frame")
        video_frame = _video_frame(frame, self.opts)
        video_frame.pts, video_frame.time_base = pts, time_base
        for packet in encode_packets(self._stream, video_frame):
            self._container.mux(packet)
        self._last_pts = pts
        self.count += 1

    def close(self) -> None:
        """Flush the encoder and close the file.

        Raises:
            ValueError: if no frame was written (an empty video is never left behind).
        """
        if self._stream is not None:
            for packet in encode_packets(self._stream, None):
                self._container.mux(packet)
        self._container.close()
        if self._stream is None:
            if os.path.exists(self.path):
                os.remove(self.path)
            raise ValueError(f"no frames were written to {self.path}")
        logger.debug(
            "wrote %d frames to %s (%s, %s)", self.count, self.path, self.opts.codec, self.opts.pix_fmt
        )

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the original error; just release the file
            self._container.close()


def write_video(
    path: str | os.PathLike[str],
    frames: Iterable[NDArray[np.uint8]],
    fps: float | Fraction,
    opts: EncodeOptions | None = None,
    ts_s: Sequence[float] | None = None,
) -> int:
    """Encode frames into a video file (container chosen from the extension by FFmpeg).

    Args:
        path: output file; its folder must exist.
        frames: RGB uint8 frames `(H, W, 3)`, consumed one at a time (an iterator is fine).
        fps: nominal frame rate, Hz (a `Fraction` such as 30000/1001 is kept exact).
        opts: encoder settings; None uses `EncodeOptions()` (H.264, yuv420p, crf 18).
        ts_s: per-frame presentation times, seconds, for variable-rate video; None means `idx / fps`.

    Returns:
        Number of frames written.

    Raises:
        ShapeError: if a frame is not `(H, W, 3)` uint8, differs in size from the first, or has odd
            sides with a 4:2:0 pixel format.
        ValueError: if `fps` is not positive, there are no frames, or `ts_s` is not strictly
            increasing or is shorter than the frame sequence.
    """
    with VideoWriter(path, fps, opts, variable_rate=ts_s is not None) as writer:
        for i, frame in enumerate(frames):
            if ts_s is not None and i >= len(ts_s):
                raise ValueError(f"ts_s has {len(ts_s)} entries but more frames were given")
            writer.write(frame, None if ts_s is None else ts_s[i])
    return writer.count


def repeat_video(src: str | os.PathLike[str], dst: str | os.PathLike[str], times: int) -> int:
    """Write the video stream of `src` `times` times over into `dst`, without decoding or encoding.

    The packets are copied with their times shifted by the clip's length per copy, so an hour of a closed
    loop (`pose_core.synth` with `loop`) costs one rendered minute and a file copy. Each copy starts at
    a key frame and refers to no frame of another (as every file `VideoWriter` writes: its first frame is
    a key frame and its groups of pictures are closed), so every copy decodes to the same frames.

    Args:
        src: a video written by `VideoWriter` at a constant rate.
        dst: output file; its folder must exist.
        times: copies, >= 1.

    Returns:
        Number of frames written.

    Raises:
        ValueError: if `times` < 1, or `src` has no video packets or does not start at a key frame.
    """
    if times < 1:
        raise ValueError(f"times must be >= 1, got {times}")
    with av.open(os.fspath(src)) as source:
        stream = source.streams.video[0]
        packets = [p for p in source.demux(stream) if p.dts is not None]  # not the demuxer's flush packet
        if not packets or not packets[0].is_keyframe:
            raise ValueError(f"{os.fspath(src)}: no video packets, or the first is not a key frame")
        first = min(p.pts for p in packets)
        span = max(p.pts for p in packets) + (packets[-1].duration or 1) - first  # the clip's length, ticks
        with av.open(os.fspath(dst), mode="w") as out:
            copy = out.add_stream_from_template(stream)
            for k in range(times):
                for packet in packets:
                    shifted = av.Packet(bytes(packet))
                    shifted.pts, shifted.dts = packet.pts + k * span, packet.dts + k * span
                    shifted.duration, shifted.is_keyframe = packet.duration, packet.is_keyframe
                    shifted.time_base, shifted.stream = packet.time_base, copy
                    out.mux(shifted)
    return len(packets) * times


def _open_stream(
    container: av.container.OutputContainer,
    first: NDArray[np.uint8],
    rate: Fraction,
    opts: EncodeOptions,
    variable_rate: bool,
) -> av.VideoStream:
    """Add and configure the video stream from the first frame's size (time base 1/fps or 1/90000)."""
    first = np.asarray(first)
    if first.ndim != 3 or first.shape[2] != 3 or first.dtype != np.uint8:
        raise ShapeError(f"frame 0 must be RGB uint8, got dtype {first.dtype}", first.shape, "(H, W, 3)")
    height, width = first.shape[:2]
    if opts.pix_fmt in _SUBSAMPLED_420 and (height % 2 or width % 2):
        raise ShapeError(
            f"{opts.pix_fmt} needs even width and height; crop or pad the frames",
            first.shape,
            "(even H, even W, 3)",
        )
    stream = container.add_stream(opts.codec, rate=rate)
    stream.width, stream.height, stream.pix_fmt = width, height, opts.pix_fmt
    stream.codec_context.time_base = _VFR_TIME_BASE if variable_rate else 1 / rate
    options = dict(opts.codec_options)
    if opts.crf is not None and opts.bitrate is None:
        options.setdefault("crf", str(opts.crf))
    if opts.preset is not None:
        options.setdefault("preset", opts.preset)
    if opts.bitrate is not None:
        stream.bit_rate = opts.bitrate
    if opts.gop_size is not None:
        stream.codec_context.gop_size = opts.gop_size
    stream.options = options
    return stream


def encode_packets(stream: av.VideoStream, frame: av.VideoFrame | None) -> list[av.Packet]:
    """`stream.encode(frame)` (None flushes), leaving the calling thread's scheduling as it was.

    SVT-AV1 (`libsvtav1`, v4.1), when the process may (root), switches the thread that opens it to
    real-time SCHED_FIFO priority 99 and leaves it so: a Spark worker that exported once would then
    starve every other thread of its core whenever it computes. Four syscalls a frame check it.
    """
    policy, priority = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    try:
        return stream.encode(frame)
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0).sched_priority != priority:
            os.sched_setscheduler(0, policy, os.sched_param(priority))


def _video_frame(frame: NDArray[np.uint8], opts: EncodeOptions) -> av.VideoFrame:
    """An RGB frame `(H, W, 3)` as a PyAV frame, already in `yuv420p` where OpenCV converts to it."""
    if opts.pix_fmt == "yuv420p" and opts.rgb_converter == "opencv":
        return av.VideoFrame.from_ndarray(
            cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2YUV_I420), format="yuv420p"
        )
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")


def _check_frame(frame: NDArray[np.uint8], height: int, width: int, index: int) -> None:
    """Raise ShapeError unless `frame` is RGB uint8 of the stream's size."""
    if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
        raise ShapeError(
            f"frame {index} must be RGB uint8 like frame 0, got dtype {frame.dtype}",
            frame.shape,
            f"({height}, {width}, 3)",
        )
