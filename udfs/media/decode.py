"""Decode a frame range of a video (path or bytes) or an image-sequence folder to RGB arrays.

Backends: decord (fast random access) first, PyAV where decord fails (odd containers, damaged
streams); `DecodedFrames.backend` says which one produced each chunk. Image sequences use OpenCV.

Convention:
    - `frame_idx` is 0-based in presentation order; `[start, stop)` is decoded and nothing else.
    - `ts_s` is the presentation timestamp in seconds from the stream's first presentation time
      (PyAV: `(frame.pts - stream.start_time) * time_base`; decord: `get_frame_timestamp`, which
      is float32 inside decord, so about 0.1 ms precision after an hour). Never `idx / fps`, so
      variable-frame-rate video keeps its true times. Image sequences: `timestamps.txt`, else
      `idx / fps` (see `udfs.media.sequence.sequence_timing`).
    - Frames are returned as STORED, not rotated for display. A container's rotation metadata
      (FFmpeg display matrix, counterclockwise degrees) is reported by the probe as
      `rotation_deg`; `np.rot90(frame, k=rotation_deg // 90)` gives the displayed picture.
      decord rotates internally, so its output is turned back; `auto` uses PyAV for rotated video.
    - Resizing happens in the decoder: the long side becomes <= `max_long_side_px`, aspect kept.
      PyAV scales in YUV (swscale, area filter) and OpenCV converts to RGB (BT.601, limited range,
      as swscale's own RGB output, which costs more); odd output sizes take swscale's RGB path.
    - `iter_frames` decodes up to `prefetch_chunks` chunks ahead in a background thread, so decoding
      the next chunk overlaps the caller's work on the current one (decord, PyAV and OpenCV release
      the GIL while they decode). With `timeout_s` it decodes in a forked child instead
      (`udfs.media.forked`), which decodes ahead the same way and is killed when a chunk takes longer:
      a hung decoder (native code, a file that blocks on open) costs the unit, not the task.
    - decord decodes a window of `decord_window_mb` at a time and is parked between windows: its
      decoder thread would otherwise decode on to the end of the video while the caller works. Each
      window is read on from the keyframe before it: decord's own skip can silently land elsewhere.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import av
import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import InputError
from udfs.media.forked import forked_items
from udfs.media.options import DecodeOptions
from udfs.media.sequence import read_image_rgb, sequence_timing

__all__ = [
    "DecodedFrames",
    "decord_can_decode",
    "decode_frames",
    "iter_frames",
    "output_size",
    "video_geometry",
]

logger = logging.getLogger(__name__)


def _import_decord() -> ModuleType:
    """decord, imported without its CUDA preload.

    On import, decord2 dlopens every library under `site-packages/nvidia/*/lib` with RTLD_GLOBAL (for
    its CUDA builds). Where torch's CUDA wheels put cuBLAS there, that includes NVBLAS, which then
    takes the CPU BLAS calls of torch loaded later and crashes them (a segfault in torch's first CPU
    convolution: the torch hand networks, `tests/udfs/media/test_decord_import.py`). egolake decodes
    on the CPU (`decord.cpu(0)`), so the `nvidia` package is hidden while decord loads.
    """
    before = sys.modules.get("nvidia", ...)
    sys.modules["nvidia"] = None  # importlib's find_spec then answers None
    try:
        return importlib.import_module("decord")
    finally:
        if before is ...:
            del sys.modules["nvidia"]
        else:
            sys.modules["nvidia"] = before


decord = _import_decord()
_DECORD_ERRORS = (decord.DECORDError, RuntimeError)


@dataclass(frozen=True)
class DecodedFrames:
    """A chunk of decoded frames.

    Attributes:
        frames: `(F, H, W, 3)` uint8 RGB, stored orientation.
        frame_idx: `(F,)` int64, 0-based presentation order.
        ts_s: `(F,)` float64 presentation time, seconds from the first frame's.
        backend: `decord`, `pyav` or `opencv` (image sequences); `decode_frames` joins them
            with `+` when a fallback happened mid-range (`decord+pyav`).
    """

    frames: np.ndarray
    frame_idx: np.ndarray
    ts_s: np.ndarray
    backend: str


def output_size(width: int, height: int, max_long_side_px: int) -> tuple[int, int]:
    """Return the `(width, height)` in pixels with the long side <= `max_long_side_px` (0 = native)."""
    long_side = max(width, height)
    if max_long_side_px <= 0 or long_side <= max_long_side_px:
        return width, height
    scale = max_long_side_px / long_side
    return max(1, round(width * scale)), max(1, round(height * scale))


def _open_av(source: str | bytes) -> av.container.InputContainer:
    try:
        return av.open(io.BytesIO(source) if isinstance(source, bytes) else source, mode="r")
    except av.FFmpegError as err:
        raise InputError("unreadable", f"cannot open video: {err}", _name(source)) from err


def _name(source: str | bytes) -> str:
    return source if isinstance(source, str) else f"<{len(source)} bytes>"


def video_geometry(source: str | bytes) -> tuple[int, int, int]:
    """Return the first video stream's stored `(width, height)` in pixels and `rotation_deg`.

    `rotation_deg` is the display rotation (counterclockwise degrees, one of 0, 90, 180, 270)
    read from the first decoded frame.

    Raises:
        InputError: `unreadable`, `no_video_stream` or `decode_error`.
    """
    with _open_av(source) as container:
        if not container.streams.video:
            raise InputError("no_video_stream", "the container has no video stream", _name(source))
        stream = container.streams.video[0]
        try:
            first = next(container.decode(stream), None)
        except av.FFmpegError as err:
            raise InputError("decode_error", f"first frame cannot be decoded: {err}", _name(source)) from err
        if first is None:
            raise InputError("decode_error", "the video stream has no decodable frame", _name(source))
        return first.width, first.height, int(round((first.rotation or 0) / 90.0)) % 4 * 90


def _presentation_pts(container: av.container.InputContainer, stream: av.VideoStream) -> list[int] | None:
    """Sorted packet pts of `stream` (one per frame) by demuxing only; None if any pts is missing."""
    pts: list[int] = []
    for packet in container.demux(stream):
        if packet.size == 0:
            continue
        if packet.pts is None:
            return None
        pts.append(packet.pts)
    return sorted(pts)


@dataclass(frozen=True)
class _Request:
    """One `iter_frames` call: decode frames `[start, stop)` of `source` in chunks of `chunk`."""

    source: str | bytes
    start: int
    stop: int
    opts: DecodeOptions
    chunk: int


def _pyav_chunks(req: _Request, start: int, size_wh: tuple[int, int]) -> Iterator[DecodedFrames]:
    """PyAV frames `[start, req.stop)` at `size_wh` (width, height) pixels."""
    source, stop, opts, chunk = req.source, req.stop, req.opts, req.chunk
    with _open_av(source) as container:
        stream = container.streams.video[0]
        stream.thread_count = opts.threads
        stream.thread_type = "AUTO" if opts.threads > 1 else "SLICE"
        stored_wh = (stream.codec_context.width, stream.codec_context.height)
        if max(o / s for o, s in zip(size_wh, stored_wh, strict=True)) <= opts.skip_deblocking_below:
            stream.codec_context.options = {"skip_loop_filter": "all"}
        sorted_pts = _presentation_pts(container, stream) if start > 0 else None
        if sorted_pts is not None and start < len(sorted_pts):
            container.seek(sorted_pts[start], stream=stream, backward=True)
        else:
            container.seek(0, stream=stream, backward=True)
            sorted_pts = None
        t0 = stream.start_time or 0
        frames: list[np.ndarray] = []
        idx: list[int] = []
        ts: list[float] = []
        counter = 0
        for packet in container.demux(stream):
            try:
                decoded = packet.decode()
            except av.FFmpegError as err:
                msg = f"decoding failed after frame {counter}: {err}"
                raise InputError("corrupt_frames", msg, _name(source)) from err
            for frame in decoded:
                if frame.pts is None:
                    raise InputError(
                        "decode_error", f"frame {counter} has no presentation timestamp", _name(source)
                    )
                i = int(np.searchsorted(sorted_pts, frame.pts)) if sorted_pts is not None else counter
                counter = i + 1
                if i < start:
                    continue
                if i >= stop:
                    break
                frames.append(_rgb(frame, size_wh))
                idx.append(i)
                ts.append(float((frame.pts - t0) * frame.time_base))
                if len(frames) == chunk:
                    yield _chunk(frames, idx, ts, "pyav")
                    frames, idx, ts = [], [], []
            if counter >= stop:
                break
        if frames:
            yield _chunk(frames, idx, ts, "pyav")


def _plane(frame: av.VideoFrame, index: int) -> np.ndarray:
    """Plane `index` of `frame` as a `(rows, cols)` uint8 view, without its line padding."""
    plane = frame.planes[index]
    rows = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)
    return rows[: plane.height, : plane.width]


# Full-range ("JPEG", `yuvj420p`) luma and chroma levels to limited range, the range OpenCV converts.
_FULL_TO_LIMITED = (
    np.round(16 + np.arange(256) * 219 / 255).astype(np.uint8),
    np.round(128 + (np.arange(256) - 128) * 224 / 255).astype(np.uint8),
)


def _rgb(frame: av.VideoFrame, size_wh: tuple[int, int]) -> np.ndarray:
    """`frame` as RGB `(H, W, 3)` uint8 at `size_wh`, aspect as given.

    8-bit 4:2:0 frames (nearly all H.264/HEVC) are scaled plane by plane (OpenCV, area filter) and
    converted by OpenCV (BT.601, limited range, as swscale's default, unbiased where swscale's RGB
    output is ~1 level dark); full-range frames are mapped to limited range first; any other format,
    or an odd size, is first scaled and converted to 4:2:0 by swscale. Both cost a fraction of
    swscale's scaling to RGB.
    """
    width, height = size_wh
    if width % 2 or height % 2:  # 4:2:0 needs even sides
        return frame.to_ndarray(format="rgb24", width=width, height=height, interpolation="AREA")
    yuv = _i420(frame, width, height)
    name = frame.format.name
    if name.startswith("yuvj") or (name.startswith("yuv") and frame.color_range == 2):  # JPEG range
        luma = width * height
        flat = yuv.reshape(-1)
        flat[:luma] = _FULL_TO_LIMITED[0][flat[:luma]]
        flat[luma:] = _FULL_TO_LIMITED[1][flat[luma:]]
    return cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_I420)


def _i420(frame: av.VideoFrame, width: int, height: int) -> np.ndarray:
    """`frame`'s YUV 4:2:0 planes at `width` x `height` (even), as one I420 array `(H * 3 / 2, W)`.

    Levels as stored (swscale, used for formats other than 8-bit 4:2:0, does not convert the range).
    """
    if frame.format.name not in ("yuv420p", "yuvj420p"):
        return frame.to_ndarray(format="yuv420p", width=width, height=height, interpolation="AREA")
    yuv = np.empty((height * 3 // 2, width), np.uint8)
    flat, luma, chroma = yuv.reshape(-1), width * height, width * height // 4
    targets = (
        yuv[:height],
        flat[luma : luma + chroma].reshape(height // 2, width // 2),
        flat[luma + chroma :].reshape(height // 2, width // 2),
    )
    for index, target in enumerate(targets):
        source = _plane(frame, index)
        if source.shape == target.shape:
            target[:] = source
        else:
            cv2.resize(source, target.shape[::-1], dst=target, interpolation=cv2.INTER_AREA)
    return yuv


def _chunk(frames: list[np.ndarray], idx: list[int], ts: list[float], backend: str) -> DecodedFrames:
    return DecodedFrames(
        np.stack(frames), np.asarray(idx, dtype=np.int64), np.asarray(ts, dtype=np.float64), backend
    )


def _decord_chunks(req: _Request, size_wh: tuple[int, int], rotation: int) -> Iterator[DecodedFrames]:
    """Frames from decord at stored `size_wh`; decord's display rotation is undone.

    decord's decoder thread never stops on its own: after a `get_batch` it decodes on towards the end of
    the video while the caller works, its frames held in memory (dmlc/decord#157, #208: a hands shard's
    8 s of work left 2.6 GB and half the shard's CPU in frames nobody asked for). So each window of the
    range (`opts.decord_window_mb` of frames, whole chunks) is decoded in one go, and `seek(0)` parks
    the decoder before the window's chunks are handed out. Each window is read from the keyframe at or
    before its first frame (`_lead_in`), never reached by decord's own skip.
    """
    source, start, opts, chunk = req.source, req.start, req.opts, req.chunk
    width, height = (size_wh[1], size_wh[0]) if rotation in (90, 270) else size_wh
    reader = decord.VideoReader(
        io.BytesIO(source) if isinstance(source, bytes) else source,
        ctx=decord.cpu(0),
        width=width,
        height=height,
        num_threads=opts.threads,
    )
    stop = min(req.stop, len(reader))
    window = chunk * max(1, int(opts.decord_window_mb * 2**20 // (width * height * 3 * chunk)))
    keyframes = np.asarray(reader.get_key_indices(), dtype=np.int64)
    for lo in range(start, stop, window):
        _lead_in(reader, keyframes, lo, chunk)
        # The window's chunks back to back (decord's cost per frame is lowest in chunk-sized calls).
        decoded = []
        for first in range(lo, min(lo + window, stop), chunk):
            idx = list(range(first, min(first + chunk, stop)))
            batch = reader.get_batch(idx).asnumpy()
            if rotation:
                batch = np.ascontiguousarray(np.rot90(batch, k=-rotation // 90, axes=(1, 2)))
            ts = np.asarray(reader.get_frame_timestamp(idx), dtype=np.float64)[:, 0]
            decoded.append(DecodedFrames(batch, np.asarray(idx, dtype=np.int64), ts, "decord"))
        reader.seek(0)
        yield from decoded


def _lead_in(reader: decord.VideoReader, keyframes: NDArray[np.int64], frame: int, chunk: int) -> None:
    """Leave `reader` at `frame` by decoding (and dropping) the frames from the keyframe before it.

    decord reaches a frame after a keyframe by skipping decoded frames in a loop that gives up after a
    fixed number of empty polls of its decoder thread, logs at INFO and carries on from wherever it is
    (`VideoReader::SkipFramesImpl`): frames from the wrong place, no error. It happened on a 10-minute
    640x480 H.264 file on every seek past ~50 frames after a keyframe (max pixel difference 255).
    Reading on from the keyframe itself takes no skip: `get_batch` continues from the current frame.
    """
    before = keyframes[keyframes <= frame]
    first = int(before[-1]) if len(before) else 0
    for lo in range(first, frame, chunk):
        reader.get_batch(list(range(lo, min(lo + chunk, frame))))


def _sequence_chunks(req: _Request, folder: str) -> Iterator[DecodedFrames]:
    start, opts, chunk = req.start, req.opts, req.chunk
    timing = sequence_timing(folder)
    stop = min(req.stop, len(timing.image_paths))
    if stop <= start:
        return
    first = read_image_rgb(timing.image_paths[start])
    size_wh = output_size(first.shape[1], first.shape[0], opts.max_long_side_px)
    for lo in range(start, stop, chunk):
        idx = np.arange(lo, min(lo + chunk, stop), dtype=np.int64)
        frames = np.stack([read_image_rgb(timing.image_paths[i], size_wh) for i in idx])
        yield DecodedFrames(frames, idx, timing.ts_s[idx], "opencv")


def _video_chunks(req: _Request) -> Iterator[DecodedFrames]:
    source, opts = req.source, req.opts
    width, height, rotation = video_geometry(source)
    size_wh = output_size(width, height, opts.max_long_side_px)
    use_decord = opts.backend == "decord" or (opts.backend == "auto" and rotation == 0)
    if not use_decord:
        yield from _pyav_chunks(req, req.start, size_wh)
        return
    next_idx = req.start
    try:
        for decoded in _decord_chunks(req, size_wh, rotation):
            yield decoded
            next_idx = int(decoded.frame_idx[-1]) + 1
        return
    except _DECORD_ERRORS as err:
        if opts.backend == "decord":
            raise InputError("decode_error", f"decord failed: {err}", _name(source)) from err
        logger.warning(
            "decord failed on %s at frame %d (%s); falling back to PyAV", _name(source), next_idx, err
        )
    yield from _pyav_chunks(req, next_idx, size_wh)


def decord_can_decode(source: str | bytes, frame_count: int) -> bool:
    """True when decord opens `source`, sees `frame_count` frames and decodes the first and last."""
    try:
        reader = decord.VideoReader(
            io.BytesIO(source) if isinstance(source, bytes) else source, ctx=decord.cpu(0)
        )
        if len(reader) != frame_count or frame_count == 0:
            return False
        reader.get_batch([0, frame_count - 1])
    except _DECORD_ERRORS as err:
        logger.info("decord cannot decode %s: %s", _name(source), err)
        return False
    return True


def iter_frames(
    source: str | bytes,
    start: int = 0,
    stop: int | None = None,
    opts: DecodeOptions | None = None,
    chunk_frames: int = 32,
) -> Iterator[DecodedFrames]:
    """Decode frames `[start, stop)` in chunks of at most `chunk_frames`.

    Args:
        source: video file path, video file bytes, or image-sequence folder path.
        start: first frame index (0-based, presentation order).
        stop: one past the last frame index; None or past the end = to the end.
        opts: decoding options (default `DecodeOptions()`).
        chunk_frames: frames per yielded chunk.

    Yields:
        `DecodedFrames` chunks in frame order.

    Raises:
        InputError: `unreadable`, `no_video_stream`, `decode_error` or `corrupt_frames`;
            `bad_sidecar` for a malformed image-sequence sidecar; `decode_timeout` when, with
            `opts.timeout_s`, a chunk took longer (`decode_error` also when the decoder crashed).
    """
    opts = opts or DecodeOptions()
    if start < 0 or chunk_frames < 1:
        raise ValueError(f"start must be >= 0 and chunk_frames >= 1, got {start}, {chunk_frames}")
    req = _Request(source, start, np.iinfo(np.int64).max if stop is None else stop, opts, chunk_frames)

    def chunks() -> Iterator[DecodedFrames]:
        is_sequence = isinstance(source, str) and os.path.isdir(source)
        return _sequence_chunks(req, source) if is_sequence else _video_chunks(req)

    if opts.timeout_s > 0:
        doing = f"decoding frames [{start}, {'end' if stop is None else stop})"
        yield from forked_items(chunks, opts.timeout_s, _name(source), doing)
    elif opts.prefetch_chunks:
        yield from _prefetched(chunks(), opts.prefetch_chunks)
    else:
        yield from chunks()


_DONE = object()


def _prefetched(chunks: Iterator[DecodedFrames], depth: int) -> Iterator[DecodedFrames]:
    """`chunks`, produced up to `depth` items ahead by a background thread.

    Errors of the producer are raised in the consumer, in order. Closing the consumer early (a
    `break`, an exception) stops the producer after at most one more chunk.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            put(exc)
            return
        put(_DONE)

    worker = threading.Thread(target=produce, name="decode-prefetch", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()
        chunks.close()


def decode_frames(
    source: str | bytes, start: int = 0, stop: int | None = None, opts: DecodeOptions | None = None
) -> DecodedFrames:
    """Decode frames `[start, stop)` at once; see `iter_frames` for arguments and errors.

    Returns:
        One `DecodedFrames` (F may be 0 when the range is past the end).
    """
    chunks = list(iter_frames(source, start, stop, opts, chunk_frames=1024))
    if not chunks:
        empty = np.zeros((0, 0, 0, 3), dtype=np.uint8)
        return DecodedFrames(empty, np.zeros(0, np.int64), np.zeros(0, np.float64), "none")
    backends = list(dict.fromkeys(c.backend for c in chunks))
    return DecodedFrames(
        np.concatenate([c.frames for c in chunks]),
        np.concatenate([c.frame_idx for c in chunks]),
        np.concatenate([c.ts_s for c in chunks]),
        "+".join(backends) if len(backends) > 1 else backends[0],
    )
