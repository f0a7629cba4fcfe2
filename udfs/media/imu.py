"""An episode's IMU, whatever carries it: the `<stem>.imu.csv` sidecar or the video's GoPro GPMF track.

One IMU path: ingest decides where an episode's IMU comes from (`attach_imu`) and records it in
`videos` (`imu_path`, `imu_source`, `imu_warning`); fusion reads it with `read_episode_imu`, which
returns the sidecar's layout either way (`(N, 7)`: `t_s, ax, ay, az, gx, gy, gz`, seconds on the
video's clock, m/s^2, rad/s, camera frame). An explicit sidecar wins over the embedded track. A
damaged track never costs the episode: damaged payloads are left out and a track with no usable
IMU is not attached, with the reason in `imu_warning`. No derived file is written: the video is
the source (its content hash is the episode id), and only its small metadata track is read
(the other streams are discarded by the demuxer, so their bytes are skipped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import av
import numpy as np

from pose_core.errors import MetadataError
from udfs.media.gpmf_imu import GpmfImu, PayloadBytes, imu_from_payloads, imu_rows
from udfs.media.sidecars import read_imu

__all__ = [
    "IMU_SOURCES",
    "ImuAttachment",
    "ImuSource",
    "attach_imu",
    "read_embedded_imu",
    "read_episode_imu",
    "read_gpmf_payloads",
]

logger = logging.getLogger(__name__)

ImuSource = Literal["sidecar", "gpmf"]
#: Values of `videos.imu_source`: the `.imu.csv` sidecar, or the video's GPMF track.
IMU_SOURCES: tuple[str, ...] = ("sidecar", "gpmf")
# Handler name of GoPro's metadata track (its sample description is 'gpmd').
_GPMF_HANDLER = "GoPro MET"


@dataclass(frozen=True)
class ImuAttachment:
    """Where an episode's IMU comes from.

    Attributes:
        path: the file it is read from (the sidecar, or the video itself); None without IMU.
        source: `sidecar` | `gpmf`; None without IMU.
        warning: why the embedded track was not attached, or what was left out of it; None when clean.
    """

    path: str | None = None
    source: ImuSource | None = None
    warning: str | None = None


def _data_streams(container: av.container.InputContainer) -> list[tuple[int, bool]]:
    """(index, named GoPro MET) of the data streams, GoPro's metadata track first."""
    data = [(s.index, _GPMF_HANDLER in s.metadata.get("handler_name", "")) for s in container.streams
            if s.type == "data"]  # fmt: skip
    return sorted(data, key=lambda d: not d[1])


def _payloads_of(path: str, index: int, named: bool) -> list[PayloadBytes] | None:
    """The packets of data stream `index` if it is a GPMF track, else None.

    A stream named `GoPro MET` is taken even when damaged (for the parser to report); another data
    stream only when its first packet starts with `DEVC`.
    """
    with av.open(path) as container:
        video = container.streams.video[0] if container.streams.video else None
        origin = float(video.start_time * video.time_base) if video and video.start_time else 0.0
        stream = container.streams[index]
        for other in container.streams:
            if other.index != index:
                other.discard = av.stream.Discard.all
        tick = float(stream.time_base)
        payloads = []
        for packet in container.demux(stream):
            if packet.size == 0 or packet.pts is None:
                continue
            data = bytes(packet)
            if not payloads and not named and data[:4] != b"DEVC":
                return None
            payloads.append(PayloadBytes(data, packet.pts * tick - origin, (packet.duration or 0) * tick))
    return payloads or None


def read_gpmf_payloads(path: str) -> list[PayloadBytes] | None:
    """The GPMF payloads of a video with their times on the video's clock; None without a GPMF track.

    Raises:
        MetadataError: the container or its metadata track cannot be read (the message names the file).
    """
    try:
        with av.open(path) as container:
            candidates = _data_streams(container)
        for index, named in candidates:
            payloads = _payloads_of(path, index, named)
            if payloads is not None:
                return payloads
    except av.FFmpegError as err:
        raise MetadataError(f"{path}: the metadata track cannot be read: {err}") from err
    return None


def read_embedded_imu(path: str) -> GpmfImu | None:
    """The IMU in a video's GPMF track (GoPro); None when the video has no GPMF track.

    Raises:
        MetadataError: the track exists but gives no usable IMU (the message names the file).
    """
    payloads = read_gpmf_payloads(path)
    if payloads is None:
        return None
    try:
        return imu_from_payloads(payloads)
    except MetadataError as err:
        raise MetadataError(f"{path}: {err}") from err


def read_episode_imu(path: str, source: str | None) -> np.ndarray:
    """An episode's IMU in the sidecar's layout, from `videos.imu_path` and `videos.imu_source`.

    Args:
        path: the sidecar, or the video for `gpmf`.
        source: `sidecar`, `gpmf`, or None (a `videos` row written before `imu_source` existed:
            the path is a sidecar).

    Returns:
        `(N, 7)` float64: `t_s, ax, ay, az, gx, gy, gz`, camera frame, times strictly increasing.

    Raises:
        InputError: `bad_sidecar` when the sidecar cannot be read.
        MetadataError: the video's GPMF track is gone or gives no usable IMU.
    """
    if source in (None, "sidecar"):
        return read_imu(path)
    if source != "gpmf":
        raise ValueError(f"unknown IMU source {source!r}; known: {IMU_SOURCES}")
    imu = read_embedded_imu(path)
    if imu is None:
        raise MetadataError(f"{path}: the video has no GPMF track (imu_source is gpmf)")
    return imu_rows(imu)


def attach_imu(video_path: str, sidecar_path: str | None, read_embedded: bool) -> ImuAttachment:
    """Where an episode's IMU comes from: the sidecar if any, else the video's GPMF track.

    Args:
        video_path: the video file (not an image-sequence folder).
        sidecar_path: the `<stem>.imu.csv` sidecar, or None.
        read_embedded: look for a GPMF track when there is no sidecar.

    Returns:
        The attachment; a damaged or unusable track gives a `warning`, never an exception.
    """
    if sidecar_path:
        return ImuAttachment(sidecar_path, "sidecar")
    if not read_embedded:
        return ImuAttachment()
    try:
        imu = read_embedded_imu(video_path)
    except MetadataError as err:
        logger.warning("embedded IMU not attached: %s", err)
        return ImuAttachment(warning=f"GPMF IMU not attached: {err}")
    if imu is None:
        return ImuAttachment()
    logger.info(
        "embedded IMU attached %s: device=%s accel %d samples at %.1f Hz, gyro %d at %.1f Hz, axes %s",
        video_path, imu.device, len(imu.accel.ts_s), imu.accel.rate_hz, len(imu.gyro.ts_s), imu.gyro.rate_hz,
        imu.axes_source,
    )  # fmt: skip
    warning = f"GPMF IMU attached; {len(imu.warnings)} problem(s): " + "; ".join(imu.warnings)
    return ImuAttachment(video_path, "gpmf", warning if imu.warnings else None)
