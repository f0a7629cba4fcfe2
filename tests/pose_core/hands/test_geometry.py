"""Hand geometry without models: detection windows, square crops, the canonical skeleton, the
articulated refinement."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.hands import FitOptions, HandObservation, fit_hand
from pose_core.hands.articulated import ArticulatedOptions, refine_articulated_hands
from pose_core.hands.metric_fit import fit_hands, fit_keypoints
from pose_core.hands.rois import detection_windows, edge_regions, square_crop
from pose_core.hands.skeleton import BONES, bone_lengths, canonical_palm_size, retarget

K = np.array([[500.0, 0.0, 320.0], [0.0, 500.0, 240.0], [0.0, 0.0, 1.0]])


class TestDetectionWindows:
    @pytest.mark.parametrize(
        ("height", "width"), [(480, 640), (288, 384), (448, 448), (300, 640), (720, 1280)]
    )
    def test_cover_the_frame_and_reach_past_its_edges(self, height, width):
        windows = detection_windows(height, width, 0.6, 0.15, 0.25)
        x0, y0, side = np.array(windows).T
        assert np.allclose(side, 0.6 * max(height, width))
        ys, xs = np.mgrid[0:height:7, 0:width:7]
        inside = [(xs >= a) & (xs < a + s) & (ys >= b) & (ys < b + s) for a, b, s in windows]
        assert np.logical_or.reduce(inside).all()  # every pixel is in some window
        if side[0] < width:  # windows reach past the left and right edges by the padding
            assert x0.min() == pytest.approx(-0.15 * side[0]) and (x0 + side).max() == pytest.approx(
                width + 0.15 * side[0]
            )

    def test_one_row_when_the_window_is_taller_than_the_frame(self):
        windows = detection_windows(300, 640, 0.6, 0.15, 0.25)
        assert len({y for _, y, _ in windows}) == 1 and windows[0][1] == pytest.approx((300 - 384) / 2)

    def test_none_when_disabled(self):
        assert detection_windows(480, 640, 0.0, 0.15, 0.25) == []


class TestEdgeProbes:
    @pytest.mark.parametrize(("height", "width"), [(480, 640), (298, 640), (720, 1280), (448, 448)])
    def test_side_by_side_along_the_bottom_edge_reaching_below_it(self, height, width):
        probes = edge_regions(height, width, 5, 1.0, 0.25)
        side = min(height, width)
        assert len(probes) == 5 and all(p.w == p.h == side and p.angle == 0.0 for p in probes)
        np.testing.assert_allclose([p.cx for p in probes], (np.arange(5) + 0.5) * width / 5)
        bottom = np.array([p.cy + p.h / 2 for p in probes])
        np.testing.assert_allclose(bottom, height + 0.25 * side)  # a hand cut by the edge is off the border

    def test_none_when_disabled(self):
        assert edge_regions(480, 640, 0, 1.0, 0.25) == []


class TestSquareCrop:
    @pytest.mark.parametrize(
        ("x0", "y0", "side"), [(-50.0, -30.0, 200.0), (100.4, 60.7, 150.0), (500.0, 400.0, 300.0)]
    )
    def test_maps_image_pixels_as_documented(self, x0, y0, side):
        image = np.zeros((480, 640, 3), np.uint8)
        image[300:310, 550:560] = 255  # a bright block at (555, 305)
        square, scale, offset = square_crop(image, x0, y0, side, 96)
        assert square.shape == (96, 96, 3) and square.dtype == np.float32
        expected = np.array([555.0, 305.0]) * scale + offset
        if (expected >= 0).all() and (expected < 96).all():
            ys, xs = np.nonzero(square[..., 0] > 0.5)
            np.testing.assert_allclose([xs.mean() + 0.5, ys.mean() + 0.5], expected, atol=1.0)
        # Beyond the image the square is black.
        outside = np.array([-1.0, -1.0]) * scale + offset
        if (outside >= 1).all():
            assert square[: int(outside[1]), : int(outside[0])].max() == 0.0

    def test_a_window_off_the_image_is_black(self):
        square, _, _ = square_crop(np.full((10, 10, 3), 200, np.uint8), 50.0, 50.0, 20.0, 16)
        assert square.max() == 0.0


class TestSkeleton:
    def test_bone_lengths(self):
        assert len(BONES) == 20 and all(parent < child for parent, child in BONES)
        lengths = bone_lengths()
        assert lengths.shape == (20,) and (lengths > 0.015).all()
        # Wrist to the middle fingertip: 0.19 m; mean wrist -> finger base: the fit's prior.
        assert lengths[8:12].sum() == pytest.approx(0.19, abs=0.001)
        assert canonical_palm_size() == pytest.approx(0.090, abs=0.001)

    def test_retarget_keeps_directions_and_sets_lengths(self):
        shape = np.random.default_rng(0).normal(size=(21, 3))
        lengths = bone_lengths() * 2.0
        out = retarget(shape, lengths)
        np.testing.assert_allclose(out[0], shape[0])
        for (parent, child), length in zip(BONES, lengths, strict=True):
            step, original = out[child] - out[parent], shape[child] - shape[parent]
            assert np.linalg.norm(step) == pytest.approx(length)
            np.testing.assert_allclose(step / length, original / np.linalg.norm(original), atol=1e-12)
        with pytest.raises(ShapeError):
            retarget(shape[:20], lengths)


def _hand_in_camera(curl: float) -> np.ndarray:
    """A canonical right hand, fingers curled by `curl` radians per joint, 0.45 m in front of the camera."""
    lengths = bone_lengths()
    points = np.zeros((21, 3))
    bases = {1: np.array([0.022, 0.025, -0.012]), 5: np.array([0.024, 0.090, 0.0]),
             9: np.array([0.004, 0.093, 0.0]), 13: np.array([-0.015, 0.088, 0.0]),
             17: np.array([-0.032, 0.080, 0.0])}  # fmt: skip
    for i, (parent, child) in enumerate(BONES):
        if parent == 0:
            points[child] = bases[child] * lengths[i] / np.linalg.norm(bases[child])
            continue
        j = (child - 1) % 4  # 1, 2, 3: joints along the finger
        angle = curl * j
        points[child] = points[parent] + lengths[i] * np.array([0.0, np.cos(angle), -np.sin(angle)])
    tilt = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(2.8), -np.sin(2.8)], [0.0, np.sin(2.8), np.cos(2.8)]])
    return points @ tilt.T + np.array([0.02, 0.05, 0.45])


def refine_articulated(keypoints_px, shape_m, camera_k, cam_from_hand, opts):
    """One hand through `refine_articulated_hands`."""
    one = (keypoints_px[None], shape_m[None], camera_k[None], cam_from_hand[None])
    return refine_articulated_hands(*one, opts)[0]


class TestArticulatedRefinement:
    def test_fingers_bent_differently_from_the_model_follow_the_keypoints(self):
        """The model sees the fingers straighter than they are: the rigid fit tilts and comes 11 % near."""
        truth = _hand_in_camera(curl=0.5)
        projected = truth @ K.T
        keypoints_px = projected[:, :2] / projected[:, 2:]
        model = _hand_in_camera(curl=0.35)
        shape = model - model[0]
        rigid = fit_keypoints(keypoints_px, shape, K, np.ones(21, bool), FitOptions())
        err_rigid = np.linalg.norm(rigid.keypoints_cam - truth, axis=1).mean()
        # Exact keypoints and a loose direction prior: the true pose back, bones rigid.
        loose = refine_articulated(
            keypoints_px, shape, K, rigid.cam_from_hand, ArticulatedOptions(direction_sigma_rad=3.0)
        )
        assert np.linalg.norm(loose - truth, axis=1).mean() < 0.25 * err_rigid
        for parent, child in BONES:
            assert np.linalg.norm(loose[child] - loose[parent]) == pytest.approx(
                np.linalg.norm(shape[child] - shape[parent]), rel=1e-9
            )
        # The default prior trusts the model's directions more (real keypoints are noisy): closer to
        # the keypoints than the rigid fit, its shape about the wrist no worse (its depth is still off).
        default = refine_articulated(keypoints_px, shape, K, rigid.cam_from_hand, ArticulatedOptions())
        reprojected = default @ K.T
        residual = np.sqrt(
            np.mean(np.sum((reprojected[:, :2] / reprojected[:, 2:] - keypoints_px) ** 2, axis=1))
        )
        assert residual < 0.6 * rigid.residual_px

        def root_relative(points):
            return np.linalg.norm((points - points[0]) - (truth - truth[0]), axis=1).mean()

        assert root_relative(default) <= root_relative(rigid.keypoints_cam)

    def test_exact_keypoints_stay_put(self):
        truth = _hand_in_camera(curl=0.3)
        projected = truth @ K.T
        hand = HandObservation(projected[:, :2] / projected[:, 2:], 1.0, "right", 1.0, truth - truth[0])
        fit = fit_hand(hand, K)
        assert fit.shape_source == "canonical" and fit.residual_px < 0.05
        np.testing.assert_allclose(fit.keypoints_cam, truth * 0.090 / canonical_palm_size(), atol=1e-4)

    def test_hands_fitted_together_are_fitted_as_one_by_one(self):
        """`fit_hands` refines a chunk's hands in one batch: each comes out as `fit_hand` gives it alone
        (hands that converge at different iterations, a template fit and one too far to refine among them)."""
        rng = np.random.default_rng(5)
        hands = []
        for curl in (0.1, 0.3, 0.5, 0.7):
            truth = _hand_in_camera(curl=curl)
            projected = truth @ K.T
            keypoints_px = projected[:, :2] / projected[:, 2:] + rng.normal(0, 1.5, (21, 2))
            model = _hand_in_camera(curl=curl * 0.7)
            hands.append(HandObservation(keypoints_px, 1.0, "right", 1.0, model - model[0]))
        hands.append(HandObservation(hands[0].keypoints_px, 1.0, "left", 1.0, None))  # template: rigid only
        together = fit_hands(hands, K)
        for hand, fit in zip(hands, together, strict=True):
            alone = fit_hand(hand, K)
            assert (fit.shape_source, fit.valid) == (alone.shape_source, alone.valid)
            np.testing.assert_allclose(fit.keypoints_cam, alone.keypoints_cam, atol=1e-9)
            assert fit.residual_px == pytest.approx(alone.residual_px, abs=1e-6)
        assert fit_hands([], K) == []

    def test_shapes_are_checked(self):
        with pytest.raises(ShapeError):
            refine_articulated(np.zeros((20, 2)), np.zeros((21, 3)), K, np.eye(4), ArticulatedOptions())
