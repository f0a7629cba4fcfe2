"""List the inputs of an ingest run: videos and image-sequence folders, with their sidecars.

Every file under the spec ends up either in an `InputItem` (as the input or as one of its
sidecars) or in a `Rejected` row: nothing is dropped silently. Rules, per directory:

- A file with a video extension (case-insensitive) is an input, unless it is `<stem>.right.<ext>`
  and a video with stem `<stem>` exists beside it: then it is that video's stereo partner.
- A directory whose files include images and no videos is an image sequence; its `timestamps.txt`,
  `calib.yaml`, `imu.csv`, `task.txt` and `right/` are its sidecars; any other file in it, and any
  other subfolder, is listed by the same rules.
- A directory named like a video (`clip.mp4/`) is rejected `is_directory` and not entered.
- Every other file is rejected `unrecognized_file` (orphan sidecars included).

Output order is sorted by path, so two listings of the same tree are identical.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from typing import Literal

from udfs.media.sidecars import (
    CALIB_SUFFIX,
    IMU_SUFFIX,
    RIGHT_INFIX,
    SEQUENCE_CALIB,
    SEQUENCE_IMU,
    SEQUENCE_RIGHT_DIR,
    SEQUENCE_TASK,
    SEQUENCE_TIMESTAMPS,
    TASK_SUFFIX,
    Sidecars,
    is_image_name,
)

__all__ = ["DEFAULT_VIDEO_EXTENSIONS", "InputItem", "Rejected", "list_inputs"]

logger = logging.getLogger(__name__)

DEFAULT_VIDEO_EXTENSIONS = ("mp4", "mov", "mkv", "avi", "webm")
_VIDEO_SIDECAR_SUFFIXES = (CALIB_SUFFIX, IMU_SUFFIX, TASK_SUFFIX)
_GLOB_CHARS = ("*", "?", "[")


@dataclass(frozen=True)
class InputItem:
    """One input that may become an episode.

    Attributes:
        path: absolute path of the video file or of the image-sequence folder.
        kind: `video` or `image_sequence`.
        sidecars: the sidecars attached to it.
    """

    path: str
    kind: Literal["video", "image_sequence"]
    sidecars: Sidecars


@dataclass(frozen=True)
class Rejected:
    """A path that is not an input, with the quarantine reason.

    Attributes:
        path: absolute path.
        reason_code: key of `udfs.media.reasons.REASONS`.
        message: what is wrong, naming the file.
    """

    path: str
    reason_code: str
    message: str


@dataclass
class _Listing:
    items: list[InputItem]
    rejected: list[Rejected]


def _split_video_name(name: str, extensions: tuple[str, ...]) -> tuple[str, str] | None:
    """Return `(stem, ext)` when `name` has a video extension, else None."""
    stem, dot_ext = os.path.splitext(name)
    if dot_ext[1:].lower() in extensions and stem:
        return stem, dot_ext
    return None


def _video_items(
    folder: str, names: list[str], candidates: set[str], extensions: tuple[str, ...], out: _Listing
) -> set[str]:
    """Make items of the video files among `candidates`; return every name they claim."""
    videos = {n: sv for n in names if (sv := _split_video_name(n, extensions))}
    stems = {stem for stem, _ in videos.values()}
    claimed: set[str] = set()
    for name, (stem, ext) in sorted(videos.items()):
        if stem.endswith(RIGHT_INFIX) and stem[: -len(RIGHT_INFIX)] in stems:
            continue
        partners = sorted(
            (n for n, (s, e) in videos.items() if s == stem + RIGHT_INFIX),
            key=lambda n: (videos[n][1] != ext, n),
        )
        present = {suffix: stem + suffix in names for suffix in _VIDEO_SIDECAR_SUFFIXES}
        sidecars = Sidecars(
            calibration_path=os.path.join(folder, stem + CALIB_SUFFIX) if present[CALIB_SUFFIX] else None,
            stereo_partner_path=os.path.join(folder, partners[0]) if partners else None,
            imu_path=os.path.join(folder, stem + IMU_SUFFIX) if present[IMU_SUFFIX] else None,
            task_path=os.path.join(folder, stem + TASK_SUFFIX) if present[TASK_SUFFIX] else None,
        )
        if name in candidates:
            out.items.append(InputItem(os.path.join(folder, name), "video", sidecars))
            claimed |= {name, *partners[:1], *(stem + s for s, ok in present.items() if ok)}
    return claimed


def _sequence_item(folder: str, names: list[str], subdirs: list[str], out: _Listing) -> set[str]:
    """Make the image-sequence item of `folder`; return the file names it claims."""
    present = set(names)

    def opt(name: str) -> str | None:
        return os.path.join(folder, name) if name in present else None

    right_dir = SEQUENCE_RIGHT_DIR if SEQUENCE_RIGHT_DIR in subdirs else None
    sidecars = Sidecars(
        calibration_path=opt(SEQUENCE_CALIB),
        stereo_partner_path=os.path.join(folder, right_dir) if right_dir else None,
        imu_path=opt(SEQUENCE_IMU),
        task_path=opt(SEQUENCE_TASK),
        timestamps_path=opt(SEQUENCE_TIMESTAMPS),
    )
    out.items.append(InputItem(folder, "image_sequence", sidecars))
    sidecar_names = {SEQUENCE_CALIB, SEQUENCE_IMU, SEQUENCE_TASK, SEQUENCE_TIMESTAMPS}
    return {n for n in names if is_image_name(n) or n in sidecar_names}


def _reject_unclaimed(folder: str, candidates: set[str], claimed: set[str], out: _Listing) -> None:
    for name in sorted(candidates - claimed):
        if name.endswith(_VIDEO_SIDECAR_SUFFIXES) or RIGHT_INFIX + "." in name:
            why = "looks like a sidecar but no video with its stem is beside it"
        else:
            why = "is neither a video, an image in an image-sequence folder, nor a known sidecar"
        out.rejected.append(Rejected(os.path.join(folder, name), "unrecognized_file", f"'{name}' {why}"))


def _is_sequence(names: list[str], extensions: tuple[str, ...]) -> bool:
    return any(map(is_image_name, names)) and not any(_split_video_name(n, extensions) for n in names)


def _walk(root: str, extensions: tuple[str, ...], out: _Listing) -> None:
    """List every file under `root` (a directory) into `out`."""
    for folder, subdirs, names in os.walk(root):
        subdirs.sort()
        names.sort()
        candidates = set(names)
        claimed: set[str] = set()
        if _is_sequence(names, extensions):
            claimed = _sequence_item(folder, names, subdirs, out)
            if SEQUENCE_RIGHT_DIR in subdirs:
                subdirs.remove(SEQUENCE_RIGHT_DIR)
                _claim_right_dir(os.path.join(folder, SEQUENCE_RIGHT_DIR), out)
        claimed |= _video_items(folder, names, candidates, extensions, out)
        _reject_unclaimed(folder, candidates, claimed, out)
        for sub in list(subdirs):
            if _split_video_name(sub, extensions):
                subdirs.remove(sub)
                out.rejected.append(
                    Rejected(
                        os.path.join(folder, sub),
                        "is_directory",
                        f"'{sub}' is a directory named like a video file; its contents were not read",
                    )
                )


def _claim_right_dir(right_dir: str, out: _Listing) -> None:
    """The images of a `right/` folder belong to the sequence; anything else there is rejected."""
    for folder, subdirs, names in os.walk(right_dir):
        subdirs.sort()
        inside = folder == right_dir
        claimed = {n for n in names if is_image_name(n)} if inside else set()
        _reject_unclaimed(folder, set(names), claimed, out)


def _list_files(paths: list[str], extensions: tuple[str, ...], out: _Listing) -> None:
    """List glob-matched files: sidecars beside them attach even when the glob missed them."""
    by_folder: dict[str, set[str]] = {}
    for path in paths:
        by_folder.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
    for folder, candidates in sorted(by_folder.items()):
        names = sorted(os.listdir(folder))
        claimed = _video_items(folder, names, candidates, extensions, out)
        _reject_unclaimed(folder, candidates, claimed, out)


def _outside(item: InputItem, root: str) -> str | None:
    """Why `item` reaches outside its input folder `root` through a symbolic link, or None.

    A link that resolves outside the folder the user named could read any file the job can (a task
    text from /etc, a video from another tenant's bucket mount); such inputs are refused.
    """
    real_root = os.path.realpath(root)
    for path in (item.path, *(p for p in vars(item.sidecars).values() if p is not None)):
        real = os.path.realpath(path)
        if os.path.commonpath([real, real_root]) != real_root:
            return f"'{path}' resolves to '{real}', outside the input folder '{root}'; it was not read"
    return None


def list_inputs(
    spec: str, video_extensions: tuple[str, ...] = DEFAULT_VIDEO_EXTENSIONS
) -> tuple[list[InputItem], list[Rejected]]:
    """List the inputs named by `spec`.

    Args:
        spec: a directory (walked recursively), a file, or a glob (`**` allowed). Matched
            directories are walked; matched files are classified with the rules of this module.
        video_extensions: extensions (without dot, any case) that mark a video file.

    Returns:
        `(items, rejected)`, each sorted by path; paths are absolute.
    """
    extensions = tuple(e.lower().lstrip(".") for e in video_extensions)
    out = _Listing([], [])
    is_glob = any(c in spec for c in _GLOB_CHARS) and not os.path.exists(spec)
    matches = sorted(glob.glob(spec, recursive=True)) if is_glob else [spec]
    if not is_glob and not os.path.exists(spec):
        logger.warning("input spec %s does not exist", spec)
        matches = []
    files: list[str] = []
    roots: list[str] = []  # per item of `out.items`, the input folder it was found in
    for match in (os.path.abspath(m) for m in matches):
        name = os.path.basename(match)
        if os.path.isdir(match) and _split_video_name(name, extensions):
            msg = f"'{name}' is a directory named like a video file; its contents were not read"
            out.rejected.append(Rejected(match, "is_directory", msg))
        elif os.path.isdir(match):
            _walk(match, extensions, out)
            roots += [match] * (len(out.items) - len(roots))
        else:
            files.append(match)
    _list_files(files, extensions, out)
    roots += [os.path.dirname(item.path) for item in out.items[len(roots):]]
    safe = []
    for item, root in zip(out.items, roots, strict=True):
        escape = _outside(item, root)
        if escape is None:
            safe.append(item)
        else:
            out.rejected.append(Rejected(item.path, "unsafe_path", escape))
    items = sorted({i.path: i for i in safe}.values(), key=lambda i: i.path)
    rejected = sorted({r.path: r for r in out.rejected}.values(), key=lambda r: r.path)
    logger.info("listed %s: %d inputs, %d rejected", spec, len(items), len(rejected))
    return items, rejected
