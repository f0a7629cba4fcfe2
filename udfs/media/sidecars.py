"""Sidecar file conventions and readers.

Conventions (the ingest listing attaches a sidecar to its input by name alone):

A video `<dir>/<stem>.<ext>` (ext one of mp4, mov, mkv, avi, webm, any letter case) may have, in
the same folder:

- `<stem>.calib.yaml`: pinhole intrinsics of the (left) camera, YAML mapping with keys
  `fx, fy, cx, cy` (pixels), `width, height` (pixels, the stored frame size),
  `distortion_model` (`none` | `radtan` | `equidistant`), `distortion` (list of floats:
  `none` 0, `radtan` 4 or 5 `[k1, k2, p1, p2(, k3)]`, `equidistant` 4 `[k1, k2, k3, k4]`),
  optional `baseline_m` (stereo baseline, metres, > 0), optional `right_from_left` (4x4 rigid
  transform mapping left-camera coordinates to right-camera coordinates, metres), optional `fps`
  (only used by image sequences). Unknown keys are an error (they are usually typos).
- `<stem>.right.<ext>`: the right stream of a stereo pair. It is NOT an input of its own; it
  must have the same frame count and frame size as the left stream.
- `<stem>.imu.csv`: header `t_s,ax,ay,az,gx,gy,gz`, then one row per sample: time in seconds
  on the video's clock, accelerometer in m/s^2, gyroscope in rad/s, both in the camera frame
  (OpenCV: x right, y down, z forward); times strictly increasing.
- `<stem>.task.txt`: UTF-8 text describing the task shown in the video (not empty).

An image-sequence folder `<dir>/<name>/` holds images `*.png | *.jpg | *.jpeg` (any letter case)
taken in name order, and optionally, inside it:

- `timestamps.txt`: one float (seconds) per line, one line per image, strictly increasing.
  Without it, frame times are `idx / fps` with `fps` from `calib.yaml`, or 30.
- `calib.yaml`, `imu.csv`, `task.txt`: as above.
- `right/`: a folder of right-camera images for stereo, same count and size as the left.

A malformed sidecar raises `InputError("bad_sidecar", message, path)`; the message names the
key or line at fault.
"""

from __future__ import annotations

import logging
import math
import os
import stat
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import yaml

from pose_core.errors import InputError, ShapeError

__all__ = [
    "CALIB_SUFFIX",
    "IMAGE_EXTENSIONS",
    "IMU_HEADER",
    "IMU_SUFFIX",
    "RIGHT_INFIX",
    "SEQUENCE_CALIB",
    "SEQUENCE_IMU",
    "SEQUENCE_RIGHT_DIR",
    "SEQUENCE_TASK",
    "SEQUENCE_TIMESTAMPS",
    "TASK_SUFFIX",
    "Calibration",
    "Sidecars",
    "is_image_name",
    "list_sequence_images",
    "read_calibration",
    "read_imu",
    "read_task",
    "read_timestamps",
    "write_imu",
]

logger = logging.getLogger(__name__)

#: Largest calibration or task sidecar read (a few hundred bytes in practice; a cap keeps a hostile file from
#: filling memory).
_MAX_TEXT_SIDECAR_BYTES = 1 << 20
#: Largest IMU or timestamps sidecar read: 10 hours of a 200 Hz IMU as CSV is ~450 MB.
_MAX_TABLE_SIDECAR_BYTES = 512 << 20

CALIB_SUFFIX = ".calib.yaml"
IMU_SUFFIX = ".imu.csv"
TASK_SUFFIX = ".task.txt"
RIGHT_INFIX = ".right"
SEQUENCE_CALIB = "calib.yaml"
SEQUENCE_IMU = "imu.csv"
SEQUENCE_TASK = "task.txt"
SEQUENCE_TIMESTAMPS = "timestamps.txt"
SEQUENCE_RIGHT_DIR = "right"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
IMU_HEADER = ("t_s", "ax", "ay", "az", "gx", "gy", "gz")

DistortionModel = Literal["none", "radtan", "equidistant"]
_DISTORTION_LENGTHS: dict[str, tuple[int, ...]] = {"none": (0,), "radtan": (4, 5), "equidistant": (4,)}
_REQUIRED_KEYS = ("fx", "fy", "cx", "cy", "width", "height", "distortion_model", "distortion")
_OPTIONAL_KEYS = ("baseline_m", "right_from_left", "fps")
# Tolerance on R^T R = I and on the [0, 0, 0, 1] last row of `right_from_left`.
_RIGID_TOL = 1e-4


@dataclass(frozen=True)
class Calibration:
    """Pinhole camera intrinsics of the stored (unrotated) frames.

    Attributes:
        fx, fy: focal lengths, pixels.
        cx, cy: principal point, pixels.
        width, height: frame size the intrinsics refer to, pixels.
        distortion_model: `none`, `radtan` (k1, k2, p1, p2[, k3]) or `equidistant` (k1..k4).
        distortion: coefficients of `distortion_model`, `(0,)`, `(4,)` or `(5,)`.
        baseline_m: stereo baseline in metres, or None.
        right_from_left: `(4, 4)` rigid transform left camera -> right camera (metres), or None.
        fps: nominal frame rate for image sequences without timestamps, or None.
    """

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    distortion_model: DistortionModel
    distortion: tuple[float, ...]
    baseline_m: float | None = None
    right_from_left: np.ndarray | None = None
    fps: float | None = None


@dataclass(frozen=True)
class Sidecars:
    """Paths of the sidecars attached to one input (absolute), None where absent.

    Attributes:
        calibration_path: `<stem>.calib.yaml` or `<folder>/calib.yaml`.
        stereo_partner_path: `<stem>.right.<ext>` or `<folder>/right/`.
        imu_path: `<stem>.imu.csv` or `<folder>/imu.csv`.
        task_path: `<stem>.task.txt` or `<folder>/task.txt`.
        timestamps_path: `<folder>/timestamps.txt` (image sequences only).
    """

    calibration_path: str | None = None
    stereo_partner_path: str | None = None
    imu_path: str | None = None
    task_path: str | None = None
    timestamps_path: str | None = None


def is_image_name(name: str) -> bool:
    """True when `name` ends with an image extension of `IMAGE_EXTENSIONS` (any case)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def list_sequence_images(folder: str) -> list[str]:
    """Return the absolute paths of the images directly inside `folder`, sorted by name."""
    names = sorted(
        n for n in os.listdir(folder) if is_image_name(n) and os.path.isfile(os.path.join(folder, n))
    )
    return [os.path.join(os.path.abspath(folder), n) for n in names]


def _bad(path: str, message: str) -> InputError:
    return InputError("bad_sidecar", message, path)


def _number(doc: dict[str, Any], key: str, problems: list[str], positive: bool) -> float:
    if key not in doc:
        return math.nan
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"key '{key}' must be a finite number, got {value!r}")
        return math.nan
    if positive and value <= 0:
        problems.append(f"key '{key}' must be > 0, got {value!r}")
    return float(value)


def _integer(doc: dict[str, Any], key: str, problems: list[str]) -> int:
    if key not in doc:
        return 0
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problems.append(f"key '{key}' must be a positive integer, got {value!r}")
        return 0
    return value


def _distortion(doc: dict[str, Any], problems: list[str]) -> tuple[str, tuple[float, ...]]:
    if "distortion_model" not in doc or "distortion" not in doc:
        return str(doc.get("distortion_model", "none")), ()
    model = doc["distortion_model"]
    coeffs = doc["distortion"]
    if model not in _DISTORTION_LENGTHS:
        problems.append(f"key 'distortion_model' must be one of {sorted(_DISTORTION_LENGTHS)}, got {model!r}")
        return "none", ()
    if not isinstance(coeffs, list) or not all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in coeffs
    ):
        problems.append(f"key 'distortion' must be a list of finite numbers, got {coeffs!r}")
        return str(model), ()
    if len(coeffs) not in _DISTORTION_LENGTHS[model]:
        problems.append(
            f"key 'distortion' has {len(coeffs)} values; model '{model}' needs {_DISTORTION_LENGTHS[model]}"
        )
    return str(model), tuple(float(c) for c in coeffs)


def _rigid(value: Any, problems: list[str]) -> np.ndarray | None:
    try:
        matrix = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        problems.append(f"key 'right_from_left' must be a 4x4 list of numbers, got {value!r}")
        return None
    if matrix.shape != (4, 4) or not np.all(np.isfinite(matrix)):
        problems.append(f"key 'right_from_left' must be a finite 4x4 matrix, got shape {matrix.shape}")
        return None
    rotation = matrix[:3, :3]
    if not np.allclose(matrix[3], [0.0, 0.0, 0.0, 1.0], atol=_RIGID_TOL) or not np.allclose(
        rotation.T @ rotation, np.eye(3), atol=_RIGID_TOL
    ):
        problems.append("key 'right_from_left' is not a rigid transform (R^T R != I or last row != 0 0 0 1)")
        return None
    return matrix


def read_calibration(path: str) -> Calibration:
    """Read and validate a `calib.yaml` sidecar.

    Args:
        path: the YAML file.

    Returns:
        The calibration.

    Raises:
        InputError: `bad_sidecar`, listing every problem found (missing, unknown or invalid keys).
    """
    raw = _read_bytes(path, "calibration", _MAX_TEXT_SIDECAR_BYTES)
    try:
        doc = yaml.load(raw.decode("utf-8"), Loader=_NoAliasLoader)  # noqa: S506 -- a SafeLoader
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise _bad(path, f"calibration cannot be read as YAML: {err}") from err
    if not isinstance(doc, dict):
        raise _bad(path, f"calibration must be a YAML mapping, got {type(doc).__name__}")
    if doc.get("distortion_model") == "none":
        doc = {"distortion": [], **doc}  # no coefficients to give: the list is implied
    problems = [f"missing key '{k}'" for k in _REQUIRED_KEYS if k not in doc]
    problems += [
        f"unknown key '{k}'" for k in sorted(map(str, doc)) if k not in _REQUIRED_KEYS + _OPTIONAL_KEYS
    ]
    fx, fy = (_number(doc, k, problems, positive=True) for k in ("fx", "fy"))
    cx, cy = (_number(doc, k, problems, positive=False) for k in ("cx", "cy"))
    width, height = (_integer(doc, k, problems) for k in ("width", "height"))
    model, coeffs = _distortion(doc, problems)
    baseline = _number(doc, "baseline_m", problems, positive=True) if "baseline_m" in doc else None
    fps = _number(doc, "fps", problems, positive=True) if "fps" in doc else None
    right_from_left = _rigid(doc["right_from_left"], problems) if "right_from_left" in doc else None
    if problems:
        raise _bad(path, "calibration: " + "; ".join(problems))
    return Calibration(fx, fy, cx, cy, width, height, model, coeffs, baseline, right_from_left, fps)  # type: ignore[arg-type]


def read_task(path: str) -> str:
    """Read a `task.txt` sidecar: UTF-8 text, stripped, not empty.

    Raises:
        InputError: `bad_sidecar` when the file is not UTF-8 or holds only whitespace.
    """
    raw = _read_bytes(path, "task text", _MAX_TEXT_SIDECAR_BYTES)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise _bad(
            path, f"task text is not UTF-8 (byte {err.start}: {raw[err.start : err.start + 1]!r})"
        ) from err
    if not text:
        raise _bad(path, "task text is empty")
    return text


class _NoAliasLoader(yaml.SafeLoader):
    """`yaml.safe_load` that refuses anchors and aliases: a sidecar never needs them, a YAML bomb does."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("anchors/aliases (&name, *name) are not allowed in a sidecar")
        return super().compose_node(parent, index)


def _read_bytes(path: str, what: str, max_bytes: int) -> bytes:
    """A sidecar's bytes; refused unread when not a regular file or larger than `max_bytes`.

    A FIFO would block the reader, a device never end.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _bad(path, f"{what} is not a regular file (a FIFO, device or folder); it was not read")
        if info.st_size > max_bytes:
            raise _bad(path, f"{what} has {info.st_size} bytes, more than the {max_bytes} a {what} may have")
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except OSError as err:
        raise _bad(path, f"{what} cannot be read: {err}") from err


def _read_lines(path: str, what: str) -> list[str]:
    raw = _read_bytes(path, what, _MAX_TABLE_SIDECAR_BYTES)
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise _bad(path, f"{what} cannot be read as UTF-8 text: {err}") from err


def _float_row(text: str, n_values: int) -> list[float] | None:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != n_values:
        return None
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    return values if all(math.isfinite(v) for v in values) else None


def _check_increasing(times: np.ndarray, line_numbers: list[int], path: str, what: str) -> None:
    steps = np.diff(times)
    if np.any(steps <= 0):
        i = int(np.argmax(steps <= 0)) + 1
        raise _bad(
            path,
            f"{what} line {line_numbers[i]}: time {float(times[i])} is not after "
            f"the previous {float(times[i - 1])}",
        )


def read_imu(path: str) -> np.ndarray:
    """Read an `imu.csv` sidecar.

    Returns:
        `(N, 7)` float64: `t_s` (seconds), `ax, ay, az` (m/s^2), `gx, gy, gz` (rad/s), camera frame.

    Raises:
        InputError: `bad_sidecar` naming the header or the first bad line (1-based).
    """
    lines = _read_lines(path, "IMU file")
    if not lines or tuple(p.strip() for p in lines[0].split(",")) != IMU_HEADER:
        got = lines[0] if lines else "<empty file>"
        raise _bad(path, f"IMU header must be '{','.join(IMU_HEADER)}', got '{got}'")
    rows: list[list[float]] = []
    line_numbers: list[int] = []
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        row = _float_row(text, len(IMU_HEADER))
        if row is None:
            raise _bad(path, f"IMU line {number}: expected {len(IMU_HEADER)} finite numbers, got '{text}'")
        rows.append(row)
        line_numbers.append(number)
    if not rows:
        raise _bad(path, "IMU file has a header but no samples")
    imu = np.asarray(rows, dtype=np.float64)
    _check_increasing(imu[:, 0], line_numbers, path, "IMU")
    return imu


def write_imu(path: str, rows: np.ndarray) -> None:
    """Write an `imu.csv` sidecar; `read_imu` reads it back to the same float64 values.

    Args:
        path: the file to write.
        rows: `(N, 7)`: `t_s, ax, ay, az, gx, gy, gz` (seconds, m/s^2, rad/s, camera frame).

    Raises:
        ShapeError: `rows` is not `(N, 7)`.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != len(IMU_HEADER):
        raise ShapeError("IMU rows", rows.shape, f"(N, {len(IMU_HEADER)})")
    # 17 significant digits print every float64 exactly.
    np.savetxt(path, rows, fmt="%.17g", delimiter=",", header=",".join(IMU_HEADER), comments="")


def read_timestamps(path: str, n_frames: int) -> np.ndarray:
    """Read a `timestamps.txt` sidecar of an image sequence.

    Args:
        path: the text file, one float (seconds) per non-blank line.
        n_frames: number of images F the file must describe.

    Returns:
        `(F,)` float64 seconds, strictly increasing.

    Raises:
        InputError: `bad_sidecar` naming the bad line, or the count mismatch.
    """
    values: list[float] = []
    line_numbers: list[int] = []
    for number, text in enumerate(_read_lines(path, "timestamps file"), start=1):
        if not text.strip():
            continue
        row = _float_row(text, 1)
        if row is None:
            raise _bad(path, f"timestamps line {number}: expected one finite number, got '{text}'")
        values.append(row[0])
        line_numbers.append(number)
    if len(values) != n_frames:
        raise _bad(path, f"timestamps file has {len(values)} values but the sequence has {n_frames} images")
    times = np.asarray(values, dtype=np.float64)
    _check_increasing(times, line_numbers, path, "timestamps")
    return times
