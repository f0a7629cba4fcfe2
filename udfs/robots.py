"""Robot files: an embodiment profile (YAML) and the URDF it names, found and read from disk.

A profile names its URDF relative to a *robots root*, never by absolute path. The roots, searched in
order for the URDF: the ``robots_dir`` argument, else the ``EGOLAKE_ROBOTS_DIR`` environment variable
(custom robots); then the robot models of the `example-robot-data` package that set-up installs (Panda,
SO-100, SO-101, ...), so the shipped profiles need no variable. ``package://NAME/...`` URIs map to
``root / packages[NAME]``, or to the caller's ``package_map`` (absolute folders) when given. The
parsing and the checks are `pose_core.retarget` (`parse_urdf`, `embodiment_from_profile`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import yaml

from pose_core.errors import InputError
from pose_core.retarget.embodiment import Embodiment, check_profile_keys, embodiment_from_profile
from pose_core.retarget.urdf import UrdfModel, parse_urdf

__all__ = ["ROBOTS_DIR_ENV", "load_embodiment", "packaged_robots_root", "read_urdf", "resolve_package_uri"]

ROBOTS_DIR_ENV = "EGOLAKE_ROBOTS_DIR"
#: The PyPI package whose robot models are the last robots root, and where it installs them.
PACKAGED_ROBOTS = ("example-robot-data", "cmeel.prefix/share")


def resolve_package_uri(uri: str, package_map: Mapping[str, Path], base_dir: Path) -> Path:
    """Turn a URDF file reference into a path.

    Args:
        uri: ``package://NAME/rest``, ``file://...``, an absolute path or one relative to ``base_dir``.
        package_map: package name -> its root folder.
        base_dir: folder that relative paths start from (the URDF's folder).

    Returns:
        The resolved path (not checked for existence).

    Raises:
        InputError: ``package_unknown`` when the package is not in ``package_map``.
    """
    if uri.startswith("package://"):
        name, _, rest = uri[len("package://"):].partition("/")
        if name not in package_map:
            raise InputError("package_unknown",
                             f"package {name!r} is not mapped; known: {sorted(package_map)}", uri)
        return Path(package_map[name]) / rest
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    path = Path(uri)
    return path if path.is_absolute() else base_dir / path


def read_urdf(path: Path) -> UrdfModel:
    """Read a URDF file.

    Raises:
        InputError: ``urdf_missing`` if the file does not exist, ``urdf_invalid`` if it cannot be parsed.
    """
    if not path.is_file():
        raise InputError("urdf_missing", f"URDF file not found (set {ROBOTS_DIR_ENV}?)", str(path))
    return parse_urdf(path.read_text(encoding="utf-8"), source=str(path))


def packaged_robots_root() -> Path | None:
    """The folder of the installed `example-robot-data` models, or None when it is not installed."""
    name, share = PACKAGED_ROBOTS
    try:
        root = Path(str(distribution(name).locate_file(share)))
    except PackageNotFoundError:
        return None
    return root if root.is_dir() else None


def _robots_roots(robots_dir: Path | str | None, profile_path: Path) -> list[Path]:
    given = robots_dir if robots_dir is not None else os.environ.get(ROBOTS_DIR_ENV)
    packaged = packaged_robots_root()
    roots = [Path(r) for r in (given, packaged) if r]
    if not roots:
        raise InputError("robots_dir_unset",
                         f"no robots root: pass robots_dir, set {ROBOTS_DIR_ENV} to the folder that holds "
                         f"the URDFs or install {PACKAGED_ROBOTS[0]} (see conf/embodiments/README.md)",
                         str(profile_path))
    return roots


def load_embodiment(
    profile_path: Path | str,
    robots_dir: Path | str | None = None,
    package_map: Mapping[str, Path | str] | None = None,
) -> Embodiment:
    """Load a profile and its URDF.

    Args:
        profile_path: the YAML profile.
        robots_dir: robots root; default ``$EGOLAKE_ROBOTS_DIR``.
        package_map: ``package://`` name -> folder; default the profile's ``packages`` under the root.

    Raises:
        InputError: ``profile_invalid`` (every problem listed), ``robots_dir_unset``, ``urdf_missing``,
            ``urdf_invalid`` or ``package_unknown``.
    """
    path = Path(profile_path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    check_profile_keys(raw, str(path))
    tried = []
    for root in _robots_roots(robots_dir, path):
        packages = {k: Path(v) for k, v in (package_map or {}).items()} or {
            k: root / v for k, v in (raw.get("packages") or {}).items()}
        tried.append(resolve_package_uri(str(raw["urdf"]), packages, root))
        if tried[-1].is_file():
            return embodiment_from_profile(raw, read_urdf(tried[-1]), str(path))
    raise InputError("urdf_missing", f"URDF not found; looked for {', '.join(map(str, tried))} (set "
                     f"{ROBOTS_DIR_ENV}?)", str(path))
