"""Robot files: an embodiment profile (YAML) and the URDF it names, found and read from disk.

A profile names its URDF relative to a *robots root*, never by absolute path; the root is the
``robots_dir`` argument, else the ``EGOLAKE_ROBOTS_DIR`` environment variable. ``package://NAME/...``
URIs map to ``robots_dir / packages[NAME]``, or to the caller's ``package_map`` (absolute folders) when
given. The parsing and the checks are `pose_core.retarget` (`parse_urdf`, `embodiment_from_profile`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from pose_core.errors import InputError
from pose_core.retarget.embodiment import Embodiment, check_profile_keys, embodiment_from_profile
from pose_core.retarget.urdf import UrdfModel, parse_urdf

__all__ = ["ROBOTS_DIR_ENV", "load_embodiment", "read_urdf", "resolve_package_uri"]

ROBOTS_DIR_ENV = "EGOLAKE_ROBOTS_DIR"


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


def _robots_root(robots_dir: Path | str | None, profile_path: Path) -> Path:
    root = robots_dir if robots_dir is not None else os.environ.get(ROBOTS_DIR_ENV)
    if root is None:
        raise InputError("robots_dir_unset",
                         f"no robots root: pass robots_dir or set {ROBOTS_DIR_ENV} to the folder "
                         "that holds the URDFs (see conf/embodiments/README.md)", str(profile_path))
    return Path(root)


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
    root = _robots_root(robots_dir, path)
    packages = {k: Path(v) for k, v in (package_map or {}).items()} or {
        k: root / v for k, v in (raw.get("packages") or {}).items()}
    urdf = read_urdf(resolve_package_uri(str(raw["urdf"]), packages, root))
    return embodiment_from_profile(raw, urdf, str(path))
