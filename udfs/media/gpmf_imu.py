"""A GoPro IMU from the GPMF payloads of a video: samples in the camera frame, times on the video's clock.

Pure: payload bytes and their track times in, arrays out (`udfs.media.imu` reads the track).

Time (`_sample_times`): a GPMF payload holds about one second of samples; the container gives only
the payload's nominal time. Following gpmf-parser's `GetGPMFSampleRate`, each stream's clock is a
line fitted to (payload time, samples delivered before it): samples delivered before payload k
are `TSMP_k - n_k` (or counted), payload times are the payloads' `STMP` (microsecond time of their
first sample) where the stream has it, else the container's payload start. Sample j is at
`(j - intercept) / rate`. The line removes the payloads' flush jitter (10 ms on the HERO5 clip:
`ImuStream.clock_residual_s`) and the partial last payload needs no duration. `STMP` is put on
the video's clock by the first `STMP` of the shutter stream (`SHUT`: its first sample is video
frame 0), else by the median offset between `STMP` and the container's payload starts. `TIMO`
(data lag) is subtracted.

Axes (`CAM_FROM_GOPRO`): GoPro's labelled IMU axes are X = camera left, Y = camera back (out of
the rear screen), Z = camera up (a right-handed frame), so in the camera frame (OpenCV: x right,
y down, z forward) a sample is (-X, -Z, -Y). Verified on the two real clips in
`../shared/data/gpmf_samples` (tests/udfs/media/test_gpmf.py): at rest the accelerometer reads
+9.7 m/s^2 on Z with the image upright (Z up); the gyroscope's rotation about camera y correlates
with the image's horizontal flow (yaw); the sideways specific force follows yaw rate times forward
speed (centripetal) with a positive slope of 4.5 m/s (drone) and 1.6 m/s (walking) only when X is
left. Checked by hand as well: the drone's forward specific force (-Y), integrated once, rises for
4 s and falls after 5 s as the ground's image flow (its speed) does; GoPro's own gravity vector
`GRAV`, written as (X, -Z, -Y) (gpmf-parser issue 170), agrees on y and z on the MAX clip.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pose_core.errors import MetadataError
from udfs.media.gpmf import IMU_KEYS, PayloadContent, SensorBlock, read_payload

__all__ = ["CAM_FROM_GOPRO", "GpmfImu", "ImuStream", "PayloadBytes", "imu_from_payloads", "imu_rows"]

logger = logging.getLogger(__name__)

#: Camera frame (x right, y down, z forward) from GoPro's IMU axes (X left, Y back, Z up).
CAM_FROM_GOPRO = np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, -1.0, 0.0]])
# Units the streams are stored in (SIUN as written by GoPro: latin-1 '²'), and their SI factor.
_UNITS: dict[str, dict[str, float]] = {
    "ACCL": {"m/s\xb2": 1.0, "m/s^2": 1.0, "m/s2": 1.0, "g": 9.80665},
    "GYRO": {"rad/s": 1.0, "deg/s": np.pi / 180.0, "\xb0/s": np.pi / 180.0},
}
# A stream's clock line may miss a payload's sample count by this many seconds before it is reported.
_MAX_TIMING_RESIDUAL_S = 0.05


@dataclass(frozen=True)
class PayloadBytes:
    """One sample of the GPMF track.

    Attributes:
        data: the payload's bytes.
        start_s: its presentation time on the video's clock (seconds after the first frame).
        duration_s: its duration in the track, seconds.
    """

    data: bytes
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class ImuStream:
    """One sensor's samples.

    Attributes:
        ts_s: `(N,)` sample times on the video's clock, seconds, strictly increasing.
        values: `(N, 3)` camera frame (x right, y down, z forward); m/s^2 or rad/s.
        rate_hz: the fitted sample rate.
        time_source: `STMP` or `payload times`.
        clock_residual_s: largest distance of a payload's sample count from the fitted clock line,
            in seconds (payload flush jitter; 0 when there was nothing to fit).
    """

    ts_s: np.ndarray
    values: np.ndarray
    rate_hz: float
    time_source: str
    clock_residual_s: float


@dataclass(frozen=True)
class GpmfImu:
    """The accelerometer and gyroscope of a GoPro clip.

    Attributes:
        device: the device name (`DVNM`: `Camera` for HERO5, `GoPro Max`, ...).
        accel: specific force (a camera at rest reads +9.8 m/s^2 towards up), m/s^2.
        gyro: angular velocity, rad/s.
        axes_source: how the stored channels were mapped to GoPro's axes (`MTRX`, `ORIN`,
            `HERO5 order ZXY`).
        warnings: what was left out and why (damaged payloads, unusable streams), in order.
    """

    device: str
    accel: ImuStream
    gyro: ImuStream
    axes_source: str
    warnings: tuple[str, ...]


def _si_factor(block: SensorBlock) -> float:
    if block.unit is None:  # GoPro documents m/s^2 and rad/s for these streams
        return 1.0
    factor = _UNITS[block.key].get(block.unit)
    if factor is None:
        raise MetadataError(f"{block.key} unit {block.unit!r} is not one of {sorted(_UNITS[block.key])}")
    return factor


def _video_clock_offset_s(
    payloads: Sequence[PayloadBytes], contents: Sequence[PayloadContent | None]
) -> float:
    """Seconds to subtract from `STMP` (in seconds) to get the video's clock."""
    for content in contents:
        if content is not None and content.video_timestamp_us is not None:
            return content.video_timestamp_us * 1e-6
    offsets = [
        block.timestamp_us * 1e-6 - payload.start_s
        for payload, content in zip(payloads, contents, strict=True)
        if content is not None
        for block in content.blocks.values()
        if block.timestamp_us is not None
    ]
    return float(np.median(offsets)) if offsets else 0.0


def _sample_times(
    key: str, starts: list[PayloadBytes], blocks: list[SensorBlock], runs: np.ndarray, stmp_offset_s: float
) -> tuple[np.ndarray, float, str, float]:
    """Times of every sample of one stream, its rate, time source and worst clock-line residual (s).

    Args:
        key: the stream's key (for messages).
        starts: the payloads that hold `blocks`, same order.
        blocks: the stream's non-empty blocks, in track order.
        runs: `(len(blocks),)` run index: consecutive payloads share a run; without `TSMP`, each
            run after a lost payload gets its own intercept (its samples before are unknown).
        stmp_offset_s: `_video_clock_offset_s`.
    """
    counts = np.array([len(b.raw) for b in blocks])
    use_stmp = all(b.timestamp_us is not None for b in blocks)
    if all(b.total_samples is not None for b in blocks):
        before = np.array([b.total_samples for b in blocks], dtype=np.float64) - counts
        runs = np.zeros(len(blocks), int)
    else:
        before = np.concatenate([[0.0], np.cumsum(counts)[:-1]])
    x = np.array([b.timestamp_us * 1e-6 - stmp_offset_s if use_stmp and b.timestamp_us is not None
                  else p.start_s for b, p in zip(blocks, starts, strict=True)])  # fmt: skip
    if len(blocks) - (runs.max() + 1) < 1:  # no run with two payloads: the container's durations
        span = sum(p.duration_s for p in starts)
        if not span > 0:
            raise MetadataError(f"{key}: no two consecutive payloads and no payload duration to time it")
        rate = float(counts.sum() / span)
        intercepts, worst = before - rate * x, 0.0
        runs = np.arange(len(blocks))
    else:
        design = np.column_stack([x, np.eye(runs.max() + 1)[runs]])
        solution, *_ = np.linalg.lstsq(design, before, rcond=None)
        rate, intercepts = float(solution[0]), solution[1:]
        worst = float(np.max(np.abs(design @ solution - before))) / rate if rate > 0 else np.inf
    if not rate > 0:
        raise MetadataError(f"{key}: sample counts do not increase with time (rate {rate:.3g} Hz)")
    index = np.concatenate([b + np.arange(n) for b, n in zip(before, counts, strict=True)])
    offsets = np.repeat(intercepts[runs], counts)
    lag = np.repeat([b.time_offset_s for b in blocks], counts)
    return (index - offsets) / rate - lag, rate, "STMP" if use_stmp else "payload times", worst


def _stream(
    key: str,
    payloads: Sequence[PayloadBytes],
    contents: Sequence[PayloadContent | None],
    stmp_offset_s: float,
    warnings: list[str],
) -> tuple[ImuStream, str]:
    """One sensor's samples in the camera frame, on the video's clock, and its axes source."""
    held = [(k, c.blocks[key]) for k, c in enumerate(contents) if c is not None and key in c.blocks]
    held = [(k, b) for k, b in held if len(b.raw) > 0]
    if not held:
        raise MetadataError(f"no payload has a usable {key} stream")
    index = np.array([k for k, _ in held])
    blocks = [b for _, b in held]
    runs = np.concatenate([[0], np.cumsum(np.diff(index) != 1)])
    starts = [payloads[k] for k in index]
    ts, rate, time_source, worst = _sample_times(key, starts, blocks, runs, stmp_offset_s)
    if worst > _MAX_TIMING_RESIDUAL_S:
        warnings.append(f"{key}: payload sample counts stray up to {worst:.3f} s from a constant rate")
    values = np.concatenate([(b.raw @ (CAM_FROM_GOPRO @ b.gopro_from_raw).T) * _si_factor(b) for b in blocks])
    keep = np.concatenate([[True], ts[1:] > np.maximum.accumulate(ts)[:-1]])
    if not keep.all():
        warnings.append(f"{key}: {int((~keep).sum())} samples out of time order left out")
    return ImuStream(ts[keep], values[keep], rate, time_source, worst), blocks[0].axes_source


def imu_from_payloads(payloads: Sequence[PayloadBytes]) -> GpmfImu:
    """The IMU of a clip from its GPMF payloads, tolerating damaged payloads.

    Args:
        payloads: the track's samples in order, times on the video's clock.

    Returns:
        Accelerometer and gyroscope in the camera frame (see the module doc for axes and time).
        A payload that cannot be parsed is left out and named in `warnings`; samples of the
        others keep their times (`TSMP` counts across the gap).

    Raises:
        MetadataError: no payload gives an accelerometer and a gyroscope, or their axis order or
            units are unknown; the message says why.
    """
    warnings: list[str] = []
    contents: list[PayloadContent | None] = []
    for k, payload in enumerate(payloads):
        try:
            content = read_payload(payload.data)
        except MetadataError as err:
            warnings.append(f"payload {k} at {payload.start_s:.3f} s left out: {err}")
            content = None
        if content is not None and content.problems:
            warnings.extend(f"payload {k}: {p}" for p in content.problems)
        contents.append(content)
    devices = sorted({c.device for c in contents if c is not None and c.blocks})
    if len(devices) > 1:
        raise MetadataError(f"IMU streams come from several devices: {devices}")
    if not devices:
        first = next(iter(warnings), "the track holds no ACCL or GYRO stream")
        raise MetadataError(f"no usable IMU in {len(payloads)} GPMF payloads; first problem: {first}")
    offset = _video_clock_offset_s(payloads, contents)
    (accel, axes), (gyro, _) = (_stream(key, payloads, contents, offset, warnings) for key in IMU_KEYS)
    for warning in warnings:
        logger.warning("GPMF: %s", warning)
    return GpmfImu(devices[0], accel, gyro, axes, tuple(warnings))


def imu_rows(imu: GpmfImu) -> np.ndarray:
    """The IMU as sidecar rows `(N, 7)`: `t_s, ax, ay, az, gx, gy, gz` (`udfs.media.sidecars.read_imu`).

    The faster stream's times are kept (where the other stream covers them) and the other stream
    is interpolated linearly at them; streams sampled at the same times (GoPro MAX) pass unchanged.
    """
    fast, slow = (imu.gyro, imu.accel) if len(imu.gyro.ts_s) >= len(imu.accel.ts_s) else (imu.accel, imu.gyro)
    inside = (fast.ts_s >= slow.ts_s[0]) & (fast.ts_s <= slow.ts_s[-1])
    ts = fast.ts_s[inside]
    other = np.column_stack([np.interp(ts, slow.ts_s, c) for c in slow.values.T])
    accel, gyro = (other, fast.values[inside]) if fast is imu.gyro else (fast.values[inside], other)
    return np.column_stack([ts, accel, gyro])
