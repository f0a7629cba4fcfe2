"""A hand whose action phases are known by construction: reach, grasp, manipulate, release, retract.

Shared by the timeline tests and the actions UDF tests.
"""

from __future__ import annotations

import numpy as np

from pose_core.synth.smooth import quintic_step

__all__ = ["CLOSED_M", "FPS", "OPEN_M", "PHASES", "phased_hand"]

FPS = 30.0
OPEN_M, CLOSED_M = 0.09, 0.02
# (label, seconds, wrist displacement over the phase (m), aperture at the end (m)); the wrist and
# the aperture follow quintic steps (zero speed at both ends), as human point-to-point motion does.
PHASES = (
    ("idle", 1.0, (0.0, 0.0, 0.0), OPEN_M),
    ("reach", 1.0, (0.25, 0.15, -0.05), OPEN_M),
    ("grasp", 0.4, (0.0, 0.0, 0.0), CLOSED_M),
    ("manipulate", 1.5, (-0.2, 0.1, 0.1), CLOSED_M),
    ("release", 0.4, (0.0, 0.0, 0.0), OPEN_M),
    ("retract", 1.0, (-0.05, -0.25, -0.05), OPEN_M),
    ("idle", 1.0, (0.0, 0.0, 0.0), OPEN_M),
)


def _keypoints(wrist: np.ndarray, aperture: np.ndarray) -> np.ndarray:
    """A rigid open palm at `wrist (F, 3)` whose thumb and index tips are `aperture (F,)` apart."""
    kp = np.repeat(wrist[:, None, :], 21, axis=1) + np.array([0.05, 0.0, 0.0])
    kp[:, 0] = wrist
    kp[:, 5] = wrist + [0.09, 0.02, 0.0]
    kp[:, 17] = wrist + [0.08, -0.04, 0.0]
    kp[:, 4] = wrist + [0.1, 0.05, 0.0]
    kp[:, 8] = kp[:, 4] + aperture[:, None] * np.array([0.0, 0.6, 0.8])
    return kp


def phased_hand(phases=PHASES) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]]]:
    """Keypoints `(F, 21, 3)`, times `(F,)` and the true (label, start, stop) of each phase."""
    wrist, aperture, truth = [np.array([0.3, 0.2, 0.9])], [OPEN_M], []
    for label, seconds, shift, end_aperture in phases:
        n = round(seconds * FPS)
        s = quintic_step(np.arange(1, n + 1) / n)[0]
        wrist.extend(wrist[-1] + s[:, None] * np.array(shift))
        aperture.extend(aperture[-1] + s * (end_aperture - aperture[-1]))
        start = truth[-1][2] if truth else 0
        truth.append((label, start, start + n))
    # wrist[0] / aperture[0] is the state before frame 0: drop it.
    wrist_a, aperture_a = np.array(wrist[1:]), np.array(aperture[1:])
    return _keypoints(wrist_a, aperture_a), np.arange(len(wrist_a)) / FPS, truth
