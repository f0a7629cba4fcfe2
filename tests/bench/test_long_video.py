"""bench.long_video per lap: a lap whose shape collapsed shows where the whole path's ATE hides it."""

import numpy as np
import pytest

from bench.long_video import lap_accuracy
from pose_core.camera_poses.evaluation import evaluate_trajectory


def _laps(n_laps: int, frames: int) -> np.ndarray:
    """A camera circling a 2-m ring (with a bob) ``n_laps`` times, ``(n_laps * frames, 4, 4)``."""
    a = 2 * np.pi * np.arange(n_laps * frames) / frames
    poses = np.tile(np.eye(4), (len(a), 1, 1))
    poses[:, :3, 3] = np.stack([np.cos(a), np.sin(a), 0.2 * np.sin(3 * a)], axis=1)
    return poses


def test_a_collapsed_lap_is_the_worst_and_its_scale_shows():
    gt = _laps(10, 60)
    est = gt.copy()
    est[:, :3, 3] *= 0.5  # the map's scale: half a metre per unit
    lap = est[3 * 60 : 4 * 60, :3, 3]  # lap 3 collapsed: its second half stuck where the first ended
    lap[30:] = lap[29]
    whole = evaluate_trajectory(est, gt)
    assert whole.ate_pct_of_path < 1.0  # the whole path hides it
    laps = lap_accuracy(est, gt, 60)
    assert laps["worst_lap"] == 3
    assert laps["worst_lap_ate_pct"] > 5.0  # of its own 6-m path
    assert laps["lap_scale_max"] == pytest.approx(1.0, rel=0.01)  # the other laps: the median lap's scale
    assert laps["lap_scale_min"] < 0.95  # the bunched lap's fit is off the others' scale


def test_hand_recall_matches_each_true_hand_once_and_counts_the_rest():
    """Frame 0: two hands in view, a box on each and one on nothing; frame 1: a hand half out of view,
    found by a box on its visible half (IoU 1 with its box clipped to the image, 0.25 without), and a
    box beside it; frame 2: a hand behind the camera (NaN: not counted)."""
    from bench.long_video import hand_recall

    hands = np.full((3, 2, 21, 2), np.nan)
    hands[0, 0] = np.linspace([100, 100], [200, 200], 21)
    hands[0, 1] = np.linspace([300, 100], [400, 200], 21)
    hands[1, 0] = np.linspace([-150, 300], [50, 400], 21)
    visible = np.array([[True, True], [True, False], [True, False]])
    found = {
        0: np.array([[105, 100, 200, 205], [300, 95, 400, 200], [500, 400, 520, 420]], float),
        1: np.array([[0, 300, 50, 400], [60, 300, 160, 400]], float),
    }
    counts = hand_recall(found, hands, visible, (640, 480))
    assert counts == {"visible": 3, "found": 3, "unmatched": 2}
