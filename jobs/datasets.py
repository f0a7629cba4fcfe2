"""Dataset versions under OUTPUT/datasets/<name>: immutable v1, v2, ..., a `latest` pointer, rollback.

    OUTPUT/datasets/<name>/v<N>/        one LeRobot v3 dataset + manifest.json + README.md (read-only)
    OUTPUT/datasets/<name>/latest       a small text file holding the newest version's name ("v3")
    OUTPUT/datasets/<name>/_staging/    where an export is assembled before it is published

A version is published by renaming its staging folder (atomic on one file system) and never
changes afterwards (its files are made read-only). `latest` is a file, not a symlink: object stores
and their file-system adapters (S3, GCS, ADLS, DBFS) have no symlinks, and a file is replaced
atomically (`os.replace`). Rollback only rewrites `latest`: the versions stay byte-identical.
No Spark here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "command",
    "fingerprint",
    "latest_version",
    "list_datasets",
    "publish",
    "read_manifest",
    "rollback",
    "set_latest",
    "staging_dir",
    "versions",
]

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LATEST = "latest"
_VERSION = re.compile(r"^v(\d+)$")


def _dataset(datasets_root: str, name: str) -> str:
    return os.path.join(datasets_root, name)


def staging_dir(datasets_root: str, name: str, run_id: str) -> str:
    """Staging folder of one export run (removed when it is published or fails)."""
    return os.path.join(_dataset(datasets_root, name), "_staging", run_id)


def versions(datasets_root: str, name: str) -> list[str]:
    """Published versions of a dataset, oldest first (`v1`, `v2`, ...)."""
    folder = _dataset(datasets_root, name)
    if not os.path.isdir(folder):
        return []
    found = [(int(m.group(1)), d) for d in os.listdir(folder) if (m := _VERSION.match(d))]
    return [d for _, d in sorted(found)]


def latest_version(datasets_root: str, name: str) -> str | None:
    """The version `latest` points at, or None before the first export."""
    path = os.path.join(_dataset(datasets_root, name), LATEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip() or None


def read_manifest(datasets_root: str, name: str, version: str | None = None) -> dict[str, Any]:
    """The manifest of `version` (default: latest).

    Raises:
        FileNotFoundError: naming the dataset and version when there is none.
    """
    version = version or latest_version(datasets_root, name)
    path = os.path.join(_dataset(datasets_root, name), version or "", MANIFEST)
    if version is None or not os.path.exists(path):
        raise FileNotFoundError(f"dataset {name!r} has no version {version!r} under {datasets_root}")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def fingerprint(content: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex) of the canonical JSON of what a version is made from (sources + export config)."""
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def set_latest(datasets_root: str, name: str, version: str) -> None:
    """Point `latest` at `version` atomically (write a temp file, then `os.replace`)."""
    folder = _dataset(datasets_root, name)
    if not os.path.isdir(os.path.join(folder, version)):
        raise FileNotFoundError(f"dataset {name!r} has no version {version!r} under {datasets_root}")
    tmp = os.path.join(folder, f".{LATEST}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(version + "\n")
    os.replace(tmp, os.path.join(folder, LATEST))


def _make_read_only(root: str) -> None:
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            os.chmod(path, os.stat(path).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def publish(
    staging: str,
    datasets_root: str,
    name: str,
    manifest: dict[str, Any],
    finish: Callable[[str, dict[str, Any]], None] | None = None,
) -> str:
    """Publish a staged dataset as the next version and point `latest` at it; returns the version.

    Writes `manifest.json` (with `name` and `version` set) into the staging folder, calls
    `finish(staging, manifest)` (e.g. to write the card, which names the version), makes the
    files read-only, renames the folder to `v<N>` and updates `latest`.

    Raises:
        FileExistsError: another export published `v<N>` at the same moment (nothing is overwritten).
    """
    existing = versions(datasets_root, name)
    version = f"v{int(existing[-1][1:]) + 1 if existing else 1}"
    manifest = {**manifest, "name": name, "version": version}
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
    if finish is not None:
        finish(staging, manifest)
    _make_read_only(staging)
    target = os.path.join(_dataset(datasets_root, name), version)
    clash = f"dataset {name!r} version {version} was published by another export meanwhile ({target}); rerun"
    if os.path.exists(target):
        raise FileExistsError(clash)
    try:
        os.rename(staging, target)  # onto a folder another export just renamed there: ENOTEMPTY or EEXIST
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(clash) from exc
        raise
    if not os.listdir(os.path.dirname(staging)):  # no other export is staging
        os.rmdir(os.path.dirname(staging))
    set_latest(datasets_root, name, version)
    logger.info(
        "published dataset=%s version=%s episodes=%d", name, version, len(manifest.get("episodes", []))
    )
    return version


def rollback(datasets_root: str, name: str, to: str | None = None) -> str:
    """Point `latest` at `to`, or at the version before the current latest; returns it.

    Raises:
        ValueError: there is no earlier version, or `to` does not exist.
    """
    all_versions = versions(datasets_root, name)
    current = latest_version(datasets_root, name)
    if to is None:
        if current not in all_versions or all_versions.index(current) == 0:
            raise ValueError(f"dataset {name!r}: no version before {current!r} to roll back to")
        to = all_versions[all_versions.index(current) - 1]
    if to not in all_versions:
        raise ValueError(
            f"dataset {name!r} has no version {to!r}; versions: {', '.join(all_versions) or 'none'}"
        )
    set_latest(datasets_root, name, to)
    logger.info("rolled back dataset=%s from=%s to=%s", name, current, to)
    return to


def list_datasets(datasets_root: str) -> list[dict[str, Any]]:
    """One summary per dataset: name, versions, latest, and the latest manifest's counts."""
    if not os.path.isdir(datasets_root):
        return []
    out = []
    for name in sorted(os.listdir(datasets_root)):
        if not versions(datasets_root, name):
            continue
        latest = latest_version(datasets_root, name)
        counts = read_manifest(datasets_root, name, latest)["counts"] if latest else {}
        out.append(
            {"name": name, "versions": versions(datasets_root, name), "latest": latest, "counts": counts}
        )
    return out


def command(action: str, output: str, name: str, to: str | None = None) -> str:
    """`egolake datasets list|show|rollback OUTPUT [NAME] [--to vN]`: the text to print.

    Raises:
        ValueError, FileNotFoundError: naming the dataset or version that is missing.
    """
    root = os.path.join(output, "datasets")
    if action == "list":
        rows = list_datasets(root)
        if not rows:
            return f"no datasets under {root}"
        return "\n".join(
            f"{r['name']}: latest={r['latest']} versions={','.join(r['versions'])} "
            f"episodes={r['counts'].get('episodes')} frames={r['counts'].get('frames')}"
            for r in rows
        )
    if action == "show":
        return json.dumps(read_manifest(root, name, to), indent=2, sort_keys=True)
    if action == "rollback":
        before = latest_version(root, name)
        return f"{name}: latest {before} -> {rollback(root, name, to)}"
    raise ValueError(f"unknown datasets action {action!r}; use list, show or rollback")
