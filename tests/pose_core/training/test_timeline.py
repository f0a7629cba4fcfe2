"""Action timeline on hand trajectories whose phases are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.training.timeline import LABELS, TimelineOptions, segment_hand
from tests.pose_core.training.phased_hand import CLOSED_M, OPEN_M, phased_hand


def _segments(kp, ts, present=None, opts=None):
    present = np.ones(len(ts), bool) if present is None else present
    timeline = segment_hand(kp, ts, present, True, opts or TimelineOptions())
    return [(s.label, s.start, s.stop) for s in timeline.segments], timeline


def _assert_close_to(found, truth, tolerance_frames: int) -> None:
    assert [f[0] for f in found] == [t[0] for t in truth], found
    for (_, a, b), (_, ta, tb) in zip(found, truth, strict=True):
        assert abs(a - ta) <= tolerance_frames and abs(b - tb) <= tolerance_frames, (found, truth)


def test_phases_found_within_a_few_frames():
    kp, ts, truth = phased_hand()
    found, timeline = _segments(kp, ts)
    _assert_close_to(found, truth, tolerance_frames=3)
    assert found[0][1] == 0 and found[-1][2] == len(ts)
    assert all(a[2] == b[1] for a, b in zip(found[:-1], found[1:], strict=True))  # consecutive, no gaps
    manip = next(s for s in timeline.segments if s.label == "manipulate")
    held = timeline.grip_aperture_m[manip.start : manip.stop]
    assert np.nanmean(held) == pytest.approx(CLOSED_M, abs=0.005)


@pytest.mark.parametrize(("noise_m", "seed"), [(0.003, 0), (0.003, 1), (0.005, 2)])
def test_noise_robust(noise_m, seed):
    """Independent noise per keypoint and frame (fusion's smoothed output has less)."""
    kp, ts, truth = phased_hand()
    noisy = kp + np.random.default_rng(seed).normal(0.0, noise_m, kp.shape)
    found, _ = _segments(noisy, ts)
    _assert_close_to(found, truth, tolerance_frames=4)


def test_missing_frames_are_their_own_segment():
    kp, ts, _ = phased_hand()
    present = np.ones(len(ts), bool)
    present[5:15] = False
    kp[40] = np.nan  # a non-finite frame counts as absent too
    found, timeline = _segments(kp, ts, present)
    assert found[:3] == [("idle", 0, 5), ("missing", 5, 15), ("idle", 15, found[2][2])]
    assert ("missing", 40, 41) in found
    assert np.isnan(timeline.wrist_speed[5:15]).all() and np.isnan(timeline.grip_aperture_m[40])


def test_closing_while_moving_fast_is_not_a_grasp():
    """Contact proxy: a grip that closes while the wrist moves fast is no grasp."""
    phases = (
        ("idle", 0.5, (0.0, 0.0, 0.0), OPEN_M),
        ("move", 0.8, (0.4, 0.0, 0.0), CLOSED_M),  # closes mid-flight at ~0.7 m/s
        ("idle", 1.0, (0.0, 0.0, 0.0), CLOSED_M),
    )
    kp, ts, truth = phased_hand(phases)
    found, _ = _segments(kp, ts)
    assert not {"grasp", "manipulate", "release"} & {f[0] for f in found}
    _assert_close_to(found, truth, tolerance_frames=4)


def test_regrasp_right_after_a_release():
    """A release that reopens only part way and closes again at once: two holds, no gap between them."""
    phases = (
        ("idle", 0.5, (0.0, 0.0, 0.0), OPEN_M),
        ("reach", 0.8, (0.2, 0.1, 0.0), OPEN_M),
        ("grasp", 0.4, (0.0, 0.0, 0.0), CLOSED_M),
        ("manipulate", 0.6, (0.0, 0.1, 0.0), CLOSED_M),
        ("release", 0.3, (0.0, 0.0, 0.0), 0.075),
        ("grasp", 0.3, (0.0, 0.0, 0.0), CLOSED_M),
        ("manipulate", 0.6, (0.1, 0.0, 0.0), CLOSED_M),
        ("release", 0.4, (0.0, 0.0, 0.0), OPEN_M),
        ("idle", 0.8, (0.0, 0.0, 0.0), OPEN_M),
    )
    kp, ts, truth = phased_hand(phases)
    noisy = kp + np.random.default_rng(3).normal(0.0, 0.003, kp.shape)
    for keypoints in (kp, noisy):
        found, _ = _segments(keypoints, ts)
        _assert_close_to(found, truth, tolerance_frames=3)


def test_labels_and_options_are_checked():
    kp, ts, _ = phased_hand()
    found, _ = _segments(kp, ts)
    assert {f[0] for f in found} <= set(LABELS)
    with pytest.raises(ShapeError):
        segment_hand(kp[:-1], ts, np.ones(len(ts), bool), True, TimelineOptions())
    with pytest.raises(ValueError, match="move_stop_mps"):
        TimelineOptions(move_start_mps=0.01, move_stop_mps=0.05)


def test_no_frames():
    timeline = segment_hand(np.zeros((0, 21, 3)), np.zeros(0), np.zeros(0, bool), False, TimelineOptions())
    assert timeline.segments == () and timeline.wrist_speed.shape == (0,)
