"""Quarantine reason codes: the only list, each with a one-line meaning.

An input that cannot become an episode gets exactly one of these codes in the `quarantine`
table, together with a human-readable message naming the file and the problem.
"""

from __future__ import annotations

import logging

__all__ = ["REASONS", "check_reason"]

logger = logging.getLogger(__name__)

REASONS: dict[str, str] = {
    "empty_file": "the file has zero bytes",
    "not_a_video": "the content is not a video container (text, an image, unknown bytes)",
    "unreadable": "looks like a video container but cannot be opened (truncated, missing index)",
    "no_video_stream": "the container opens but holds no video stream (audio-only, data-only)",
    "too_short": "fewer decodable frames than ProbeOptions.min_frames",
    "too_small": "frame width or height below ProbeOptions.min_width / min_height",
    "too_large": "file size above ProbeOptions.max_size_bytes",
    "too_long": "duration above ProbeOptions.max_duration_s",
    "frames_too_large": "frame width x height above ProbeOptions.max_pixels (checked before decoding)",
    "decode_error": "the decoder cannot decode the stream at all, or crashed",
    "corrupt_frames": "some frames fail to decode or are flagged corrupt (damaged middle, bad image)",
    "decode_timeout": "probing took longer than ProbeOptions.timeout_s and was killed",
    "duplicate_exact": "byte-identical (same SHA-256) to another input or an earlier episode",
    "duplicate_near": "perceptually the same clip (pHash distance) as another input or earlier episode",
    "is_directory": "a directory named like a video file (for example `clip.mp4/`)",
    "unrecognized_file": "neither a video, an image sequence nor a sidecar of one",
    "bad_sidecar": "a sidecar (calibration, IMU, task, timestamps) is malformed",
    "stereo_mismatch": "the right stereo stream differs from the left in frame count or size",
    "unsafe_path": "the input or a sidecar is a symbolic link that resolves outside the input folder",
}


def check_reason(reason_code: str) -> str:
    """Return `reason_code` unchanged if it is a known code.

    Args:
        reason_code: a candidate key of `REASONS`.

    Returns:
        The same code.

    Raises:
        ValueError: the code is not in `REASONS` (a programming error, not an input problem).
    """
    if reason_code not in REASONS:
        raise ValueError(f"unknown quarantine reason {reason_code!r}; known: {sorted(REASONS)}")
    return reason_code
