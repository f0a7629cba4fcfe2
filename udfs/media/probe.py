"""Probe one input: checksum, validate sidecars, decode-check, measure, find its IMU, give a verdict.

`probe` never raises for bad input: it returns `ProbeResult(ok=False, reason_code, message)` with
a code of `udfs.media.reasons.REASONS` and a message naming the file and the problem.
`probe_with_timeout` runs it in a forked child so a hung or crashing decoder cannot stall the job.
Duplicates are not judged here (they need the whole batch): see `udfs.media.dedup`. The IMU is the
`.imu.csv` sidecar or, without one, the video's GoPro GPMF track (`udfs.media.imu.attach_imu`); a
damaged track only sets `imu_warning`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from pose_core.errors import InputError
from udfs.media.decode import decord_can_decode
from udfs.media.forked import forked_items
from udfs.media.imu import attach_imu
from udfs.media.inputs import InputItem
from udfs.media.reasons import check_reason
from udfs.media.scan import Scan, scan_sequence, scan_video
from udfs.media.sidecars import list_sequence_images, read_calibration, read_imu, read_task
from udfs.options import ProbeOptions

__all__ = ["ProbeResult", "content_size", "probe", "probe_with_timeout"]

logger = logging.getLogger(__name__)

_HASH_BLOCK_BYTES = 1 << 20


@dataclass
class ProbeResult:
    """Verdict and measurements of one input; measurement fields are None when not reached.

    Attributes:
        content_sha256: video: SHA-256 of the bytes; image sequence: SHA-256 over the sorted
            `name<TAB>sha256(image)` lines.
        container: FFmpeg demuxer name or `image_sequence`; codec: decoder name.
        rotation_deg: display rotation, counterclockwise degrees (frames are not rotated).
        fps: `(F - 1) / (last ts - first ts)`; frame_count: frames counted by decoding (or
            demuxing in `sampled` mode), never the header's; duration_s: last - first ts + the
            median frame duration.
        timing_source: `container pts`, `timestamps.txt`, `calib.yaml fps` or `default fps`.
        imu_path, imu_source, imu_warning: where the IMU is read from (`udfs.media.imu.attach_imu`):
            the sidecar, or the video itself for its GPMF track (`gpmf`); a damaged or unusable
            track leaves a warning, never a rejection.
        decoder: backend `DecodeOptions(backend="auto")` will use: `decord`, `pyav` or `opencv`.
        phashes: 64-bit pHashes (unsigned) of up to `sample_frames` evenly spread frames.
        probe_s: wall time of the probe, seconds.
    """

    path: str
    kind: str
    ok: bool = False
    reason_code: str | None = None
    message: str = ""
    size_bytes: int | None = None
    content_sha256: str | None = None
    container: str | None = None
    codec: str | None = None
    width: int | None = None
    height: int | None = None
    rotation_deg: int | None = None
    fps: float | None = None
    frame_count: int | None = None
    duration_s: float | None = None
    variable_frame_rate: bool | None = None
    timing_source: str | None = None
    has_audio: bool | None = None
    decoder: str | None = None
    phashes: list[int] = field(default_factory=list)
    stereo_partner_path: str | None = None
    calibration_path: str | None = None
    task_path: str | None = None
    imu_path: str | None = None
    imu_source: str | None = None
    imu_warning: str | None = None
    timestamps_path: str | None = None
    probe_s: float = 0.0


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def content_size(item: InputItem) -> int:
    """Bytes of a video file, or of the images of an image-sequence folder (sidecars excluded)."""
    if item.kind == "video":
        return os.path.getsize(item.path)
    return sum(os.path.getsize(p) for p in list_sequence_images(item.path))


def _content_identity(item: InputItem) -> tuple[int, str]:
    """Return `(size_bytes, content_sha256)` of a video file or an image-sequence folder."""
    if item.kind == "video":
        return content_size(item), _sha256_file(item.path)
    images = list_sequence_images(item.path)
    lines = "".join(f"{os.path.basename(p)}\t{_sha256_file(p)}\n" for p in images)
    return content_size(item), hashlib.sha256(lines.encode("utf-8")).hexdigest()


def _check_sidecars(item: InputItem) -> None:
    """Read every attached sidecar (timestamps are read by the sequence scan)."""
    side = item.sidecars
    if side.calibration_path:
        read_calibration(side.calibration_path)
    if side.imu_path:
        read_imu(side.imu_path)
    if side.task_path:
        read_task(side.task_path)


def _scan(path: str, kind: str, opts: ProbeOptions) -> Scan:
    if kind == "video":
        return scan_video(path, opts.decode_check, opts.sample_frames, opts.max_pixels)
    return scan_sequence(path, opts.decode_check, opts.sample_frames, opts.max_pixels)


def _timing(scan: Scan, result: ProbeResult, opts: ProbeOptions) -> None:
    ts = scan.ts_s
    result.frame_count = len(ts)
    if len(ts) < 2:
        result.duration_s, result.variable_frame_rate = 0.0, False
        return
    steps = np.diff(ts)
    median = float(np.median(steps))
    result.fps = (len(ts) - 1) / float(ts[-1] - ts[0])
    result.duration_s = float(ts[-1] - ts[0]) + median
    spread = max(0.0, float(steps.max() - steps.min()) - scan.tick_s) / median
    result.variable_frame_rate = spread > opts.vfr_tolerance


def _verdict(scan: Scan, result: ProbeResult, opts: ProbeOptions, path: str) -> None:
    """Raise the InputError the measurements call for, if any."""
    if result.frame_count == 0:
        raise InputError(
            "decode_error", f"no frame could be decoded ({scan.first_problem or 'empty stream'})", path
        )
    if scan.bad_frames:
        raise InputError(
            "corrupt_frames",
            f"{scan.bad_frames} damaged packet(s) or frame(s); first: {scan.first_problem}",
            path,
        )
    if (result.frame_count or 0) < opts.min_frames:
        raise InputError(
            "too_short", f"{result.frame_count} frame(s), at least {opts.min_frames} needed", path
        )
    if scan.width < opts.min_width or scan.height < opts.min_height:
        raise InputError(
            "too_small",
            f"frames are {scan.width}x{scan.height}, minimum {opts.min_width}x{opts.min_height}",
            path,
        )
    if (result.duration_s or 0.0) > opts.max_duration_s:
        raise InputError(
            "too_long", f"{result.duration_s:.1f} s long, limit {opts.max_duration_s:.1f} s", path
        )


def _check_stereo(item: InputItem, scan: Scan, result: ProbeResult, opts: ProbeOptions) -> None:
    partner = item.sidecars.stereo_partner_path
    if not partner:
        return
    right = _scan(partner, item.kind, opts)
    if right.bad_frames or len(right.ts_s) == 0:
        raise InputError("corrupt_frames", f"right stream is damaged: {right.first_problem}", partner)
    left_desc = f"{result.frame_count} frames of {scan.width}x{scan.height}"
    right_desc = f"{len(right.ts_s)} frames of {right.width}x{right.height}"
    if left_desc != right_desc:
        raise InputError("stereo_mismatch", f"left has {left_desc}, right has {right_desc}", partner)


def _check_calibration_size(item: InputItem, scan: Scan) -> None:
    path = item.sidecars.calibration_path
    if not path:
        return
    calib = read_calibration(path)
    if (calib.width, calib.height) != (scan.width, scan.height):
        raise InputError(
            "bad_sidecar",
            f"calibration is for {calib.width}x{calib.height} frames but the stored frames are "
            f"{scan.width}x{scan.height}",
            path,
        )


def _probe_into(item: InputItem, opts: ProbeOptions, result: ProbeResult) -> None:
    if item.kind == "video":
        size = os.path.getsize(item.path)
        if size == 0:
            raise InputError("empty_file", "the file has zero bytes", item.path)
        if size > opts.max_size_bytes:
            raise InputError("too_large", f"{size} bytes, limit {opts.max_size_bytes}", item.path)
    result.size_bytes, result.content_sha256 = _content_identity(item)
    _check_sidecars(item)
    scan = _scan(item.path, item.kind, opts)
    result.container, result.codec, result.has_audio = scan.container, scan.codec, scan.has_audio
    result.width, result.height, result.rotation_deg = scan.width, scan.height, scan.rotation_deg
    result.phashes = list(scan.phashes)
    _timing(scan, result, opts)
    _verdict(scan, result, opts, item.path)
    _check_calibration_size(item, scan)
    _check_stereo(item, scan, result, opts)
    result.timing_source = scan.timing_source
    if item.kind == "image_sequence":
        result.decoder = "opencv"
        result.imu_source = "sidecar" if result.imu_path else None
    else:
        usable = scan.rotation_deg == 0 and decord_can_decode(item.path, result.frame_count or 0)
        result.decoder = "decord" if usable else "pyav"
        imu = attach_imu(item.path, item.sidecars.imu_path, opts.embedded_imu)
        result.imu_path, result.imu_source, result.imu_warning = imu.path, imu.source, imu.warning


def probe(item: InputItem, opts: ProbeOptions | None = None) -> ProbeResult:
    """Probe one input and give its verdict.

    Args:
        item: the input, from `udfs.media.inputs.list_inputs`.
        opts: limits and decode-check settings (default `ProbeOptions()`).

    Returns:
        `ok=True` with every measurement, or `ok=False` with `reason_code` and a `message`
        that starts with the offending file's path. Never raises for bad input.
    """
    opts = opts or ProbeOptions()
    started = time.monotonic()
    side = item.sidecars
    result = ProbeResult(
        path=item.path,
        kind=item.kind,
        stereo_partner_path=side.stereo_partner_path,
        calibration_path=side.calibration_path,
        task_path=side.task_path,
        imu_path=side.imu_path,
        timestamps_path=side.timestamps_path,
    )
    try:
        _probe_into(item, opts, result)
        result.ok = True
    except InputError as err:
        result.reason_code = check_reason(err.reason_code)
        result.message = f"{err.path or item.path}: {err.message}"
        logger.info("rejected %s: %s", item.path, result.message)
    except OSError as err:
        result.reason_code = "unreadable"
        result.message = f"{item.path}: cannot be read ({err})"
    result.probe_s = time.monotonic() - started
    return result


def probe_with_timeout(item: InputItem, opts: ProbeOptions | None = None) -> ProbeResult:
    """Run `probe` in a forked child process, killed after `opts.timeout_s` (`udfs.media.forked`).

    Returns:
        The child's result; `decode_timeout` when it ran too long (the child is killed), or
        `decode_error` when the child died from a signal (a crashing decoder).

    Raises:
        Exception: what `probe` raised in the child: a bug (bad input never raises).
        EgolakeError: the child exited without a result and without a signal.
    """
    opts = opts or ProbeOptions()
    started = time.monotonic()
    try:
        (result,) = forked_items(lambda: [probe(item, opts)], opts.timeout_s, item.path, "probing")
    except InputError as err:  # `probe` returns its verdicts: these come from the child's end
        failed = ProbeResult(path=item.path, kind=item.kind, probe_s=time.monotonic() - started)
        failed.reason_code, failed.message = err.reason_code, f"{item.path}: {err.message}"
        logger.warning("%s", failed.message)
        return failed
    return result
