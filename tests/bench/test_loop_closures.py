"""bench/loop_closures.py: the hands' boxes it masks tracking with."""

from __future__ import annotations

import numpy as np

from bench.loop_closures import hand_boxes


def test_boxes_of_the_hands_in_view_only():
    hands = np.full((2, 2, 21, 2), np.nan)
    hands[0, 1] = np.column_stack([np.linspace(100, 200, 21), np.linspace(50, 90, 21)])  # right hand in view
    boxes = hand_boxes(hands)
    assert [b.shape for b in boxes] == [(1, 4), (0, 4)]  # frame 1: no hand, no box
    np.testing.assert_allclose(boxes[0][0], [85.0, 35.0, 215.0, 105.0])  # grown by 15 % of the 100 px side
