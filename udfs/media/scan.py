"""Decode check of one input: count frames, collect timestamps, find damage, hash sampled frames.

`scan_video` uses PyAV because it reports damage per packet (decord stops at the first error).
`full` mode demuxes and decodes every packet with FFmpeg's error detection raised
(`err_detect=crccheck+bitstream+buffer+explode`) and counts failed packets, frames flagged corrupt
and frames lost (fewer frames out than packets in). `sampled` mode counts frames by demuxing
only and decodes the sampled frames alone (cheap, but damage between samples goes unseen).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Literal

import av
import numpy as np
import PIL.Image

from pose_core.errors import InputError
from udfs.media.decode import decode_frames, video_geometry
from udfs.media.phash import phash, sample_positions
from udfs.media.sequence import read_image_rgb, sequence_timing
from udfs.options import DecodeOptions

__all__ = ["Scan", "scan_sequence", "scan_video", "sniff"]

logger = logging.getLogger(__name__)

# FFmpeg decoder options for the full decode check: fail loudly on any bitstream damage.
ERR_DETECT = "crccheck+bitstream+buffer+explode"
# Frames are hashed from a reduced copy of this size (pHash reduces to 32x32 anyway).
_HASH_INPUT_PX = 64

_VIDEO_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (4, b"ftyp", "ISO-BMFF (mp4/mov)"),
    (4, b"moov", "QuickTime"),
    (4, b"mdat", "QuickTime"),
    (4, b"free", "QuickTime"),
    (4, b"wide", "QuickTime"),
    (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM"),
    (0, b"RIFF", "RIFF (avi)"),
    (0, b"\x00\x00\x01\xba", "MPEG-PS"),
    (0, b"OggS", "Ogg"),
    (0, b"FLV", "FLV"),
)
_OTHER_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive"),
)
# FFmpeg demuxers that read still images: a file they open is not a video.
_IMAGE_DEMUXERS = ("image2", "_pipe")


@dataclass
class Scan:
    """What a decode check measured.

    Attributes:
        container: FFmpeg demuxer name, or `image_sequence`.
        codec: decoder name (`h264`, `libdav1d`, `png`, ...).
        width, height: stored frame size, pixels.
        rotation_deg: display rotation, counterclockwise degrees in {0, 90, 180, 270}.
        has_audio: the container has an audio stream.
        ts_s: `(F,)` float64 presentation times, seconds from the first frame; F frames counted.
        tick_s: timestamp resolution (stream time base), seconds.
        bad_frames: failed packets + frames flagged corrupt + frames lost + unreadable images.
        first_problem: description of the first damage found, or "".
        phashes: pHashes of up to `sample_frames` frames spread evenly over the clip.
        timing_source: where `ts_s` comes from: `container pts` or `SequenceTiming.source`.
    """

    container: str
    codec: str
    width: int
    height: int
    rotation_deg: int = 0
    has_audio: bool = False
    ts_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tick_s: float = 0.0
    bad_frames: int = 0
    first_problem: str = ""
    phashes: list[int] = field(default_factory=list)
    timing_source: str = "container pts"

    def damage(self, count: int, problem: str) -> None:
        """Record `count` bad frames and keep the first problem's description."""
        self.bad_frames += count
        self.first_problem = self.first_problem or problem


def sniff(head: bytes) -> tuple[bool, str]:
    """Guess from the first bytes whether a file is a video container.

    Args:
        head: at least the first 12 bytes of the file.

    Returns:
        `(looks_like_video, description)`, e.g. `(True, "ISO-BMFF (mp4/mov)")` or
        `(False, "a PNG image")`, `(False, "unknown content")`.
    """
    for offset, magic, name in _VIDEO_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return (name != "RIFF (avi)" or head[8:11] == b"AVI"), name
    if len(head) > 188 * 2 and head[0] == head[188] == head[376] == 0x47:
        return True, "MPEG-TS"
    for magic, name in _OTHER_MAGIC:
        if head.startswith(magic):
            return False, name
    return False, "unknown content"


def _hash_frame(frame: av.VideoFrame) -> int:
    return phash(frame.to_ndarray(width=_HASH_INPUT_PX, height=_HASH_INPUT_PX, format="rgb24"))


def _open_video(path: str) -> tuple[av.container.InputContainer, av.VideoStream]:
    try:
        container = av.open(path, mode="r")
    except av.FFmpegError as err:
        with open(path, "rb") as f:
            is_video, what = sniff(f.read(1024))
        if is_video:
            raise InputError("unreadable", f"{what} container cannot be opened: {err}", path) from err
        raise InputError("not_a_video", f"content is {what}, not a video container ({err})", path) from err
    if any(part in container.format.name for part in _IMAGE_DEMUXERS):
        container.close()
        raise InputError(
            "not_a_video", f"content is a still image ({container.format.name}), not a video", path
        )
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["no streams"]
        container.close()
        raise InputError("no_video_stream", f"container has no video stream (has: {', '.join(kinds)})", path)
    return container, container.streams.video[0]


def _scan_full(
    container: av.container.InputContainer, stream: av.VideoStream, scan: Scan
) -> tuple[list[int], list[int]]:
    """Decode every packet; return the frames' pts and pHashes in decoder output order."""
    stream.codec_context.options = {"err_detect": ERR_DETECT}
    pts: list[int] = []
    hashes: list[int] = []
    packets = failed = frames_out = 0
    for packet in container.demux(stream):
        packets += packet.size > 0
        try:
            frames = packet.decode()
        except av.FFmpegError as err:
            failed += 1
            scan.damage(1, f"packet {packets - 1} failed to decode: {err}")
            continue
        for frame in frames:
            frames_out += 1
            if frame.is_corrupt:
                scan.damage(1, f"frame {frames_out - 1} is flagged corrupt by the decoder")
            if frame.pts is None:
                scan.damage(1, f"frame {frames_out - 1} has no presentation timestamp")
                continue
            if not pts:
                scan.rotation_deg = round((frame.rotation or 0) / 90.0) % 4 * 90
            pts.append(frame.pts)
            hashes.append(_hash_frame(frame))
    lost = packets - failed - frames_out
    if lost > 0:
        scan.damage(lost, f"{lost} of {packets} packets produced no frame")
    return pts, hashes


def _refuse_too_large(path: str, what: str, width: int, height: int, max_pixels: int | None) -> None:
    """Raise `frames_too_large` when `width x height` (read from a header) is above `max_pixels`."""
    if max_pixels is not None and width * height > max_pixels:
        message = (f"{what} {width}x{height} = {width * height / 1e6:.0f} Mpx, limit "
                   f"{max_pixels / 1e6:.0f} Mpx (ingest.probe.max_pixels); nothing was decoded")
        raise InputError("frames_too_large", message, path)


def _image_size(path: str) -> tuple[int, int] | None:
    """An image's `(width, height)` from its header, without decoding it; None when Pillow cannot tell.

    OpenCV then decodes it under its own limit (OPENCV_IO_MAX_IMAGE_PIXELS, 1 Gpx).

    Raises:
        InputError: `frames_too_large` when Pillow's own guard refuses the header (above twice
            `PIL.Image.MAX_IMAGE_PIXELS`, ~179 Mpx).
    """
    try:
        with PIL.Image.open(path) as image:
            return image.size
    except PIL.Image.DecompressionBombError as err:  # its size is in the message only
        message = f"image '{os.path.basename(path)}' refused from its header: {err} (ingest.probe.max_pixels)"
        raise InputError("frames_too_large", message, path) from err
    except (OSError, ValueError):
        return None


def scan_video(
    path: str, mode: Literal["full", "sampled"], sample_frames: int, max_pixels: int | None = None
) -> Scan:
    """Decode-check a video file with PyAV.

    Args:
        path: the video file.
        mode: `full` decodes every frame; `sampled` counts frames by demuxing and decodes
            `sample_frames` evenly spread frames.
        sample_frames: number of frames hashed (and, in `sampled` mode, decoded).
        max_pixels: refuse frames larger than this (width x height, from the stream header) before
            decoding any; None: no limit.

    Returns:
        The scan; damage is reported in `bad_frames`, not raised.

    Raises:
        InputError: `not_a_video`, `unreadable` or `no_video_stream` when there is nothing to scan;
            `frames_too_large` above `max_pixels`.
    """
    container, stream = _open_video(path)
    with container:
        width, height = stream.codec_context.width, stream.codec_context.height
        _refuse_too_large(path, "frames are", width, height, max_pixels)
        scan = Scan(
            container=container.format.name,
            codec=stream.codec_context.name,
            width=width,
            height=height,
            has_audio=bool(container.streams.audio),
            tick_s=float(stream.time_base or 0.0),
        )
        t0 = stream.start_time or 0
        if mode == "full":
            pts, hashes = _scan_full(container, stream, scan)
            order = np.argsort(pts, kind="stable")
            scan.ts_s = (np.asarray(pts, dtype=np.float64)[order] - t0) * scan.tick_s
            scan.phashes = [hashes[order[i]] for i in sample_positions(len(pts), sample_frames)]
            return scan
        pts = sorted(p.pts for p in container.demux(stream) if p.size > 0 and p.pts is not None)
    scan.ts_s = (np.asarray(pts, dtype=np.float64) - t0) * scan.tick_s
    if len(pts) > 0:
        scan.rotation_deg = video_geometry(path)[2]
    _hash_samples(path, scan, sample_frames)
    return scan


def _hash_samples(path: str, scan: Scan, sample_frames: int) -> None:
    """Decode and hash the sampled frames alone (sampled mode); damage is recorded on `scan`."""
    opts = DecodeOptions(backend="pyav", max_long_side_px=_HASH_INPUT_PX)
    for i in sample_positions(len(scan.ts_s), sample_frames):
        try:
            decoded = decode_frames(path, int(i), int(i) + 1, opts)
        except InputError as err:
            scan.damage(1, f"sampled frame {i}: {err.message}")
            continue
        if len(decoded.frames) == 0:
            scan.damage(1, f"sampled frame {i} could not be decoded")
            continue
        scan.phashes.append(phash(decoded.frames[0]))


def scan_sequence(
    folder: str, mode: Literal["full", "sampled"], sample_frames: int, max_pixels: int | None = None
) -> Scan:
    """Decode-check an image-sequence folder with OpenCV.

    Args:
        folder: the image-sequence folder.
        mode: `full` reads every image; `sampled` reads the `sample_frames` sampled images.
        sample_frames: number of images hashed.
        max_pixels: refuse an image larger than this (width x height, from its header) before decoding
            it; None: no limit.

    Returns:
        The scan; unreadable images and images of another size count as `bad_frames`.

    Raises:
        InputError: `bad_sidecar` for malformed timestamps.txt / calib.yaml; `frames_too_large` above
            `max_pixels`.
    """
    timing = sequence_timing(folder)
    paths = timing.image_paths
    codecs = sorted({os.path.splitext(p)[1].lower().lstrip(".").replace("jpg", "jpeg") for p in paths})
    scan = Scan(
        "image_sequence", ",".join(codecs), 0, 0, ts_s=timing.ts_s, tick_s=1e-9, timing_source=timing.source
    )
    sampled = set(sample_positions(len(paths), sample_frames).tolist())
    to_read = range(len(paths)) if mode == "full" else sorted(sampled)
    for i in to_read:
        size = _image_size(paths[i]) if max_pixels is not None else None
        if size is not None:
            _refuse_too_large(folder, f"image '{os.path.basename(paths[i])}' is", *size, max_pixels)
        try:
            image = read_image_rgb(paths[i])
        except InputError as err:
            scan.damage(1, err.message)
            continue
        if scan.width == 0:
            scan.height, scan.width = image.shape[:2]
        elif image.shape[:2] != (scan.height, scan.width):
            scan.damage(
                1,
                f"image '{os.path.basename(paths[i])}' is {image.shape[1]}x{image.shape[0]}, "
                f"the first is {scan.width}x{scan.height}",
            )
        if i in sampled:
            scan.phashes.append(phash(image))
    return scan
