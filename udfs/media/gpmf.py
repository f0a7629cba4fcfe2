"""Decode GoPro GPMF payloads (the `gpmd` metadata track of GoPro MP4 files): bytes in, arrays out.

Format (gopro/gpmf-parser, README and GPMF_parser.c): a payload is a sequence of KLV entries, all
big-endian and 32-bit aligned. Each entry is an 8-byte header, a 4-character key, a type character
(NUL = nested KLV entries), a struct size in bytes (1 byte) and a repeat count (2 bytes), then
`struct size * repeat` bytes of value padded to a multiple of 4. A payload holds devices
(`DEVC`, with `DVID` id and `DVNM` name), each holding streams (`STRM`). Inside a stream, property
entries that come before the data entry modify it: `SCAL` (divisor, one or one per element),
`SIUN`/`UNIT` (units), `TSMP` (samples delivered since the recording started, this payload's
included), `STMP` (microsecond time of the payload's first sample), `TIMO` (the data lags by this
many seconds), `ORIN` / `ORIO` / `MTRX` (axis order of the stored and the presented data).

Axes: GoPro presents IMU data in the order Z, X, Y of its camera axes (HERO5 stored it that way
and wrote no orientation; later models state their stored order in `ORIN`, e.g. `XzY`, where a
lower-case letter is a negated axis, and `ORIO` = `ZXY`). `gopro_from_raw` below maps the stored
channels to the vector (X, Y, Z) of GoPro's labelled axes; `udfs.media.gpmf_imu` maps those to
the camera frame. Only the accelerometer (`ACCL`) and the gyroscope (`GYRO`) are extracted, plus
the first `STMP` of the shutter stream (`SHUT`, one sample per video frame) as the video's clock.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

import numpy as np

from pose_core.errors import MetadataError

__all__ = [
    "IMU_KEYS",
    "Klv",
    "PayloadContent",
    "SensorBlock",
    "numeric_values",
    "parse_klv",
    "read_payload",
]

logger = logging.getLogger(__name__)

#: Sensor streams extracted: accelerometer and gyroscope.
IMU_KEYS = ("ACCL", "GYRO")
# Numeric GPMF types: numpy dtype and fixed-point divisor (q: Q15.16, Q: Q31.32).
_NUMERIC: dict[str, tuple[str, float]] = {
    "b": (">i1", 1.0), "B": (">u1", 1.0), "s": (">i2", 1.0), "S": (">u2", 1.0), "l": (">i4", 1.0),
    "L": (">u4", 1.0), "j": (">i8", 1.0), "J": (">u8", 1.0), "f": (">f4", 1.0), "d": (">f8", 1.0),
    "q": (">i4", 65536.0), "Q": (">i8", 2.0**32),
}  # fmt: skip
# Entries of a stream that describe the data entry after them rather than being data.
_PROPERTIES = frozenset(
    {"SCAL", "SIUN", "UNIT", "TSMP", "STMP", "TIMO", "ORIN", "ORIO", "MTRX", "STNM", "RMRK", "TYPE",
     "TMPC", "EMPT", "TICK", "TOCK"}
)  # fmt: skip
# Deepest nesting accepted (gpmf-parser's GPMF_NEST_LIMIT).
_MAX_DEPTH = 16
# Device name of HERO5-family cameras, whose IMU data is stored Z, X, Y without an ORIN entry.
_HERO5_DEVICE = "Camera"


@dataclass(frozen=True)
class Klv:
    """One KLV entry.

    Attributes:
        key: four-character key, e.g. `ACCL`.
        type_char: GPMF type character; NUL (`chr(0)`) for nested entries.
        struct_size: bytes per sample.
        repeat: number of samples.
        data: the value bytes without padding (`struct_size * repeat`).
        children: nested entries (only when `type_char` is NUL).
    """

    key: str
    type_char: str
    struct_size: int
    repeat: int
    data: bytes
    children: tuple[Klv, ...] = ()


@dataclass(frozen=True)
class SensorBlock:
    """One payload's samples of one sensor stream.

    Attributes:
        key: `ACCL` or `GYRO`.
        raw: `(n, 3)` float64 samples in the stored channel order, scaled (`SCAL` applied) to
            `unit`.
        gopro_from_raw: `(3, 3)` matrix mapping a stored sample to GoPro's axes (X, Y, Z).
        axes_source: how `gopro_from_raw` was found: `MTRX`, `ORIN` or `HERO5 order ZXY`.
        unit: the stream's `SIUN` (or `UNIT`), None when absent.
        total_samples: `TSMP` (samples delivered so far, this payload's included), None when absent.
        timestamp_us: `STMP`, microseconds, None when absent.
        time_offset_s: `TIMO`, seconds the data lags (0 when absent).
    """

    key: str
    raw: np.ndarray
    gopro_from_raw: np.ndarray
    axes_source: str
    unit: str | None
    total_samples: int | None
    timestamp_us: int | None
    time_offset_s: float


@dataclass(frozen=True)
class PayloadContent:
    """What one payload holds for the IMU.

    Attributes:
        device: name (`DVNM`) of the device whose IMU streams were taken (the first device that
            has any); "" when there is none.
        blocks: `ACCL` / `GYRO` blocks of that device, by key.
        video_timestamp_us: `STMP` of the shutter stream (`SHUT`, one sample per video frame) of
            the same device, None when absent.
        problems: why a stream of the payload was left out (unknown axes, unsupported type, ...).
    """

    device: str
    blocks: dict[str, SensorBlock]
    video_timestamp_us: int | None
    problems: tuple[str, ...] = ()


def parse_klv(buf: bytes, start: int = 0, end: int | None = None, depth: int = 0) -> list[Klv]:
    """Parse the KLV entries in `buf[start:end]`, nested entries recursively.

    All-zero 4-byte words between entries are padding and are skipped.

    Raises:
        MetadataError: a key is not printable ASCII, an entry runs past its container, or nesting
            is deeper than 16 levels; the message gives the byte offset.
    """
    end = len(buf) if end is None else end
    if depth > _MAX_DEPTH:
        raise MetadataError(f"byte {start}: KLV nesting deeper than {_MAX_DEPTH} levels")
    entries: list[Klv] = []
    pos = start
    while pos + 4 <= end:
        if buf[pos : pos + 4] == b"\0\0\0\0":
            pos += 4
            continue
        if pos + 8 > end:
            raise MetadataError(f"byte {pos}: KLV header cut short ({end - pos} of 8 bytes)")
        key_bytes, type_byte, size, repeat = struct.unpack_from(">4sBBH", buf, pos)
        if not all(0x20 <= c < 0x7F for c in key_bytes):
            raise MetadataError(f"byte {pos}: invalid KLV key {key_bytes!r}")
        key = key_bytes.decode("ascii")
        length = size * repeat
        stop = pos + 8 + length
        if stop > end:
            raise MetadataError(
                f"byte {pos}: KLV '{key}' needs {length} value bytes, its container has {end - pos - 8}"
            )
        children = tuple(parse_klv(buf, pos + 8, stop, depth + 1)) if type_byte == 0 else ()
        entries.append(Klv(key, chr(type_byte), size, repeat, bytes(buf[pos + 8 : stop]), children))
        pos = pos + 8 + ((length + 3) & ~3)
    if pos < end and any(buf[pos:end]):
        raise MetadataError(f"byte {pos}: {end - pos} stray bytes after the last KLV entry")
    return entries


def numeric_values(klv: Klv) -> np.ndarray:
    """The values of a numeric entry as float64, `(repeat, struct_size / type size)`.

    Raises:
        MetadataError: the type is not numeric or the struct size is not a multiple of its size.
    """
    if klv.type_char not in _NUMERIC:
        raise MetadataError(f"KLV '{klv.key}' has type {klv.type_char!r}, not a numeric type")
    dtype, divisor = _NUMERIC[klv.type_char]
    item = np.dtype(dtype).itemsize
    if klv.struct_size % item:
        raise MetadataError(f"KLV '{klv.key}': struct size {klv.struct_size} is not a multiple of {item}")
    values = np.frombuffer(klv.data, dtype=dtype).astype(np.float64) / divisor
    return values.reshape(klv.repeat, klv.struct_size // item)


def _text(klv: Klv) -> str:
    return klv.data.split(b"\0", 1)[0].decode("latin-1").strip()


def _axis_matrix(letters: str) -> np.ndarray:
    """`(3, 3)` matrix mapping channels labelled `letters` (e.g. `XzY`) to GoPro's (X, Y, Z)."""
    if len(letters) != 3 or sorted(letters.upper()) != ["X", "Y", "Z"]:
        raise MetadataError(f"axis order {letters!r} is not a signed permutation of X, Y, Z")
    matrix = np.zeros((3, 3))
    for channel, letter in enumerate(letters):
        matrix["XYZ".index(letter.upper()), channel] = 1.0 if letter.isupper() else -1.0
    return matrix


def _orientation(props: dict[str, Klv], device: str) -> tuple[np.ndarray, str]:
    """`gopro_from_raw` of a stream and where it came from (gpmf-parser's GPMF_ScaledData order)."""
    out_order = _text(props["ORIO"]) if "ORIO" in props else "ZXY"
    if "MTRX" in props:
        mtrx = numeric_values(props["MTRX"]).reshape(-1)
        if mtrx.size != 9:
            raise MetadataError(f"MTRX has {mtrx.size} values, a 3-axis stream needs 9")
        return _axis_matrix(out_order) @ mtrx.reshape(3, 3), "MTRX"
    if "ORIN" in props:
        return _axis_matrix(_text(props["ORIN"])), "ORIN"
    if device == _HERO5_DEVICE:
        return _axis_matrix("ZXY"), "HERO5 order ZXY"
    raise MetadataError(f"device {device!r} states no axis order (no ORIN or MTRX) and has no known default")


def _sensor_block(data: Klv, props: dict[str, Klv], device: str) -> SensorBlock:
    """Scale and label the samples of one `ACCL`/`GYRO` entry with the properties before it."""
    raw = numeric_values(data)
    if raw.shape[1] != 3:
        raise MetadataError(f"{data.key} has {raw.shape[1]} values per sample, expected 3")
    if "SCAL" in props:
        scale = numeric_values(props["SCAL"]).reshape(-1)
        if scale.size not in (1, 3) or not np.all(scale != 0):
            raise MetadataError(f"{data.key}: SCAL {scale.tolist()} is not 1 or 3 non-zero divisors")
        raw = raw / scale
    gopro_from_raw, axes_source = _orientation(props, device)
    unit_klv = props.get("SIUN", props.get("UNIT"))

    def first_int(key: str) -> int | None:
        return int(numeric_values(props[key]).reshape(-1)[0]) if key in props else None

    timo = float(numeric_values(props["TIMO"]).reshape(-1)[0]) if "TIMO" in props else 0.0
    return SensorBlock(
        data.key, raw, gopro_from_raw, axes_source, _text(unit_klv) if unit_klv else None,
        first_int("TSMP"), first_int("STMP"), timo,
    )  # fmt: skip


def _device_streams(devc: Klv) -> tuple[str, list[tuple[Klv, dict[str, Klv]]]]:
    """A device's name and its streams' data entries, each with the properties written before it."""
    name = next((_text(k) for k in devc.children if k.key == "DVNM"), "")
    streams = []
    for strm in (k for k in devc.children if k.key == "STRM"):
        props: dict[str, Klv] = {}
        for entry in strm.children:
            if entry.key in _PROPERTIES:
                props[entry.key] = entry
            elif entry.type_char != "\0":
                streams.append((entry, dict(props)))
    return name, streams


def read_payload(buf: bytes) -> PayloadContent:
    """The IMU content of one GPMF payload.

    Args:
        buf: the payload's bytes (one sample of the `gpmd` track, or a `.raw` file).

    Returns:
        The accelerometer and gyroscope blocks of the first device that has any (the camera;
        a Karma drone or a Bluetooth sensor comes after it), and the shutter stream's `STMP`.
        A stream that cannot be used (unknown axes, non-numeric type) is left out and named in
        `problems`.

    Raises:
        MetadataError: the payload is not valid GPMF (does not start with `DEVC`, or its KLV
            structure is broken).
    """
    if buf[:4] != b"DEVC":
        raise MetadataError(f"payload starts with {bytes(buf[:4])!r}, not a GPMF device (DEVC)")
    problems: list[str] = []
    for devc in (k for k in parse_klv(buf) if k.key == "DEVC"):
        name, streams = _device_streams(devc)
        blocks: dict[str, SensorBlock] = {}
        video_us = None
        for data, props in streams:
            if data.key == "SHUT" and "STMP" in props and video_us is None:
                video_us = int(numeric_values(props["STMP"]).reshape(-1)[0])
            if data.key not in IMU_KEYS or data.key in blocks:
                continue
            try:
                blocks[data.key] = _sensor_block(data, props, name)
            except MetadataError as err:
                problems.append(f"{data.key} of {name!r}: {err}")
        if blocks or problems:
            return PayloadContent(name, blocks, video_us, tuple(problems))
    return PayloadContent("", {}, None, ())
