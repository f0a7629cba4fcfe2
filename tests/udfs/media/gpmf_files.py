"""The real GoPro clips of ../shared/data/gpmf_samples and damaged copies of them for the GPMF tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import av
import numpy as np

from tests.data_paths import SHARED_DATA

SAMPLES = SHARED_DATA / "gpmf_samples"
#: HERO5 Black on a Karma drone (no STMP, no ORIN) and GoPro MAX in HERO mode (STMP, ORIN, MTRX).
CLIPS = {"karma": SAMPLES / "karma.mp4", "max": SAMPLES / "max-heromode.mp4"}


def payload_positions(path: Path) -> list[tuple[int, int]]:
    """(byte offset, size) in the file of each payload of the GPMF track."""
    with av.open(str(path)) as container:
        track = next(s for s in container.streams if "GoPro MET" in s.metadata.get("handler_name", ""))
        for other in container.streams:
            if other.index != track.index:
                other.discard = av.stream.Discard.all
        return [(int(p.pos), int(p.size)) for p in container.demux(track) if p.size]


def damaged_copy(src: Path, dst: Path, payloads: list[int], at: int, data: bytes) -> Path:
    """A copy of `src` with `data` written `at` bytes into each of the GPMF `payloads` (indices)."""
    shutil.copyfile(src, dst)
    positions = payload_positions(src)
    with open(dst, "r+b") as f:
        for k in payloads:
            f.seek(positions[k][0] + at)
            f.write(data)
    return dst


def frame_times(path: Path) -> np.ndarray:
    """Presentation times of the video's frames, seconds from the first (demuxed, not decoded)."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        pts = sorted(p.pts for p in container.demux(video) if p.size and p.pts is not None)
        return (np.asarray(pts, np.float64) - (video.start_time or 0)) * float(video.time_base)
