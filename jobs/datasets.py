"""Dataset versions under OUTPUT/datasets/<name>: immutable v1, v2, ..., a `latest` pointer, rollback.

    OUTPUT/datasets/<name>/v<N>/        one LeRobot v3 dataset + manifest.json + README.md (read-only)
    OUTPUT/datasets/<name>/latest       a small text file holding the newest version's name ("v3")
    OUTPUT/datasets/<name>/_staging/    where an export is assembled before it is published:
                                        <run_id>/ and <run_id>.lock per export in progress

A version is published by renaming its staging folder (atomic on one file system) and never
changes afterwards (its files are made read-only). `latest` is a file, not a symlink: object stores
and their file-system adapters (S3, GCS, ADLS, DBFS) have no symlinks, and a file is replaced
atomically (`os.replace`). Rollback only rewrites `latest`: the versions stay byte-identical.

The rename is the commit: a `v<N>` folder holds the whole version, manifest included, or does not
exist; a driver killed after it but before `latest` moved leaves a complete version that `latest`
does not point at (as after a rollback). A folder `v<N>` without a manifest (copied by hand, a
partial copy) is not a version: `versions` and `datasets list` leave it out.

An export holds an exclusive lock (`fcntl.flock`) on `_staging/<run_id>.lock` while its staging folder
exists (`locked_staging`). The kernel drops the lock when the process dies, however it dies, so a staging
folder whose lock can be taken belongs to no running export: the next export removes it
(`clean_stale_staging`); one whose lock is held is left alone. Locks must be shared by every host that
exports into one OUTPUT (a local disk, NFSv4); where the file system has no locks nothing is removed.
No Spark here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jobs.disk import worded_no_space

__all__ = [
    "clean_stale_staging",
    "command",
    "fingerprint",
    "latest_version",
    "list_datasets",
    "locked_staging",
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
STAGING = "_staging"
_LOCK = ".lock"
_LOCK_ATTEMPTS = 5
_VERSION = re.compile(r"^v(\d+)$")


def _dataset(datasets_root: str, name: str) -> str:
    return os.path.join(datasets_root, name)


def staging_dir(datasets_root: str, name: str, run_id: str) -> str:
    """Staging folder of one export run (removed when it is published or fails)."""
    return os.path.join(_dataset(datasets_root, name), STAGING, run_id)


@contextlib.contextmanager
def locked_staging(datasets_root: str, name: str, run_id: str) -> Iterator[str]:
    """The staging folder's path of export `run_id`, locked as live while the context lasts.

    The lock file is created and locked before the folder is made and removed after it is gone, so
    a staging folder without a lock file is never a live export's. On leaving, the folder (what
    `publish` did not rename away), the lock and an empty `_staging/` are removed.
    """
    folder = staging_dir(datasets_root, name, run_id)
    lock = _hold_lock(folder + _LOCK)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder + _LOCK)
        os.close(lock)
        _remove_if_empty(os.path.dirname(folder))


def _hold_lock(path: str) -> int:
    """Create `path` and lock it exclusively; returns the descriptor that holds the lock.

    A clean-up may take the new file's lock before this does and unlink it (it then holds a file no
    longer under `path`), so the lock counts only when `path` still names the locked file.
    """
    for _ in range(_LOCK_ATTEMPTS):
        os.makedirs(os.path.dirname(path), exist_ok=True)  # another export may remove an empty `_staging/`
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a clean-up holds it a moment at most
        except OSError as exc:  # no locks on this file system: nothing will ever be judged stale
            logger.warning("staging lock %s not taken (%s): stale staging is not recognised here", path, exc)
        if _names(path, fd):
            os.write(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode())
            return fd
        os.close(fd)
    raise FileExistsError(f"cannot hold the staging lock {path}: it keeps being removed")


def _names(path: str, fd: int) -> bool:
    """Whether `path` is the file open as `fd` (not unlinked or replaced meanwhile)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False


def _remove_if_empty(folder: str) -> None:
    with contextlib.suppress(OSError):  # not empty (another export staging) or already gone
        os.rmdir(folder)


def clean_stale_staging(datasets_root: str, name: str) -> list[str]:
    """Remove the staging folders (and lock files) of export runs that are not running; returns their ids.

    A run is not running when its lock file can be locked (its process died and the kernel released
    the lock) or when its folder has no lock file (left by an egolake from before the locks). A run
    whose lock is held, or whose lock cannot be tried on this file system, is left alone.
    """
    root = os.path.join(_dataset(datasets_root, name), STAGING)
    if not os.path.isdir(root):
        return []
    runs = sorted({e.removesuffix(_LOCK) for e in os.listdir(root)})
    removed = [run for run in runs if _remove_if_stale(os.path.join(root, run))]
    _remove_if_empty(root)
    return removed


def _remove_if_stale(folder: str) -> bool:
    try:
        fd = os.open(folder + _LOCK, os.O_RDWR)
    except FileNotFoundError:
        if not os.path.isdir(folder):
            return False  # removed meanwhile by another export's clean-up
        owner = "no lock file"
        fd = -1
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                logger.warning("staging %s kept: its lock cannot be tried here (%s)", folder, exc)
            return False  # a running export holds it
        if not _names(folder + _LOCK, fd):  # removed by another clean-up meanwhile, maybe re-made by its run
            os.close(fd)
            return False
        owner = os.read(fd, 200).decode(errors="replace").strip() or "lock free"
    try:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder + _LOCK)
    finally:
        if fd >= 0:
            os.close(fd)
    logger.warning(
        "removed the staging of export run %s: it is not running (%s)", os.path.basename(folder), owner
    )
    return True


def _version_folders(datasets_root: str, name: str) -> list[str]:
    """Every `v<N>` folder, complete or not, oldest first: the next version number must pass them all."""
    folder = _dataset(datasets_root, name)
    if not os.path.isdir(folder):
        return []
    found = [(int(m.group(1)), d) for d in os.listdir(folder) if (m := _VERSION.match(d))]
    return [d for _, d in sorted(found)]


def versions(datasets_root: str, name: str) -> list[str]:
    """Published versions of a dataset, oldest first (`v1`, `v2`, ...): `v<N>` folders with a manifest."""
    folder = _dataset(datasets_root, name)
    return [
        v for v in _version_folders(datasets_root, name) if os.path.isfile(os.path.join(folder, v, MANIFEST))
    ]


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
        OSError: ENOSPC when the file system is full (`jobs.disk.no_space`): no version was renamed into
            place, or `latest` still names the version before.
    """
    existing = _version_folders(datasets_root, name)
    version = f"v{int(existing[-1][1:]) + 1 if existing else 1}"
    with worded_no_space(f"publishing dataset {name} {version}", staging):  # manifest, card or `latest`
        _publish_as(staging, datasets_root, name, {**manifest, "name": name, "version": version}, finish)
    logger.info(
        "published dataset=%s version=%s episodes=%d", name, version, len(manifest.get("episodes", []))
    )
    return version


def _publish_as(
    staging: str,
    datasets_root: str,
    name: str,
    manifest: dict[str, Any],
    finish: Callable[[str, dict[str, Any]], None] | None,
) -> None:
    version = manifest["version"]
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
    set_latest(datasets_root, name, version)
    _remove_if_empty(os.path.dirname(staging))


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
        # `latest` before the versions: a publish in between adds a version, never a `latest` not listed
        latest = latest_version(datasets_root, name)
        published = versions(datasets_root, name)
        if not published:
            continue
        counts = read_manifest(datasets_root, name, latest)["counts"] if latest else {}
        out.append({"name": name, "versions": published, "latest": latest, "counts": counts})
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
