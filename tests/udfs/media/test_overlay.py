"""Hand skeleton overlay: the identity's colour lands on its bones, filled hands are drawn thinner."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.errors import ShapeError
from udfs.media.overlay import HAND_BONES, draw_hands, draw_status, identity_colour


def _hand(centre: tuple[float, float], n: int) -> np.ndarray:
    """A fan-shaped 21-keypoint hand around `centre`, the same in `n` frames, `(n, 21, 2)`."""
    angles = np.linspace(-1.0, 1.0, 5)
    kp = [np.array(centre)]
    for a in angles:
        kp += [np.array(centre) + r * np.array([np.sin(a), -np.cos(a)]) for r in (15, 30, 45, 60)]
    return np.tile(np.array(kp), (n, 1, 1))


def _pixels_of(img: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.abs(img.astype(int) - np.array(colour)).sum(axis=-1) < 30


def test_each_identity_is_drawn_in_its_colour_where_it_is():
    frames = np.zeros((2, 240, 320, 3), np.uint8)
    left, right = _hand((80, 180), 2), _hand((240, 180), 2)
    right[1] = np.nan  # not in frame 1
    out = draw_hands(frames, {"wearer_left": left, "wearer_right": right})
    assert frames.max() == 0  # input untouched
    for i in range(2):
        ys, xs = np.nonzero(_pixels_of(out[i], identity_colour("wearer_left")))
        assert len(xs) > 100 and xs.max() < 160  # on the left half only
    assert _pixels_of(out[0], identity_colour("wearer_right")).sum() > 100
    assert _pixels_of(out[1], identity_colour("wearer_right")).sum() == 0
    assert len(HAND_BONES) == 24 and identity_colour("other_0") != identity_colour("wearer_left")


def test_filled_hands_are_drawn_thinner_and_shapes_are_checked():
    frames = np.zeros((2, 240, 320, 3), np.uint8)
    hand = _hand((160, 180), 2)
    out = draw_hands(frames, {"wearer_right": hand}, {"wearer_right": np.array([False, True])})
    colour = identity_colour("wearer_right")
    assert _pixels_of(out[1], colour).sum() < 0.7 * _pixels_of(out[0], colour).sum()
    with pytest.raises(ShapeError):
        draw_hands(frames, {"wearer_right": hand[:1]})


def test_status_line_darkens_a_top_band_and_writes_text():
    frames = np.full((1, 240, 320, 3), 200, np.uint8)
    out = draw_status(frames, ["#0 0.00s tracking keyframe"])
    band = out[0, :20]
    assert band.min() < 100 and (band > 240).any()  # darkened, with white text
    assert (out[0, 100:] == 200).all()
    with pytest.raises(ShapeError):
        draw_status(frames, [])
