"""The real hand estimator (MediaPipe on LiteRT) finds the rendered wearer hands, where the ground truth says.

Renders a short synthetic clip and runs the default estimator in video mode, as the hands stage does.
A hand counts as found when some detection's median keypoint distance to the ground-truth projection
is below a quarter of the hand's image size.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pose_core.synth import SynthOptions, generate_episode

pytestmark = pytest.mark.slow

logger = logging.getLogger(__name__)

FRAMES = 30


@pytest.fixture(scope="module")
def detections():
    """Ground truth of a 30-frame clip (seed 0) and the estimator's hands per frame."""
    pytest.importorskip("ai_edge_litert")
    from pose_core.hands import MediaPipeOptions  # noqa: PLC0415
    from udfs.models import hand_estimator  # noqa: PLC0415 -- only when the runtime is installed

    try:
        estimator = hand_estimator(MediaPipeOptions(mode="video"))
    except FileNotFoundError as err:
        pytest.skip(str(err))
    episode = generate_episode(SynthOptions(num_frames=FRAMES, seed=0))
    frames = np.stack([frame.rgb for frame in episode.frames()])
    return episode, estimator.estimate(frames, episode.K)


def test_fully_visible_hands_are_found_with_accurate_keypoints(detections):
    episode, found = detections
    w, h = episode.options.width, episode.options.height
    px = episode.hands_px  # (F, 2, 21, 2)
    inside = np.all((px >= 0.0) & (px <= [w - 1, h - 1]), axis=(2, 3))  # NaN (behind) is not inside
    errors, missed = [], 0
    for f, hand in zip(*np.nonzero(inside), strict=True):
        gt = px[f, hand]
        size = np.linalg.norm(gt.max(axis=0) - gt.min(axis=0))
        best = min((np.median(np.linalg.norm(o.keypoints_px - gt, axis=1)) for o in found[f]), default=np.inf)
        if best < 0.25 * size:
            errors.append(best)
        else:
            missed += 1
    rate = len(errors) / max(len(errors) + missed, 1)
    logger.info("found %d of %d fully visible hands (%.0f %%), median keypoint error %.1f px",
                len(errors), len(errors) + missed, 100 * rate, np.median(errors))  # fmt: skip
    assert inside.sum() >= FRAMES  # hands are in view most of the time
    assert rate >= 0.5, rate
    assert np.median(errors) < 20.0, np.median(errors)
