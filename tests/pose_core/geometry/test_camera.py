import cv2
import numpy as np
import pytest

from pose_core.errors import InputError, ShapeError
from pose_core.geometry.camera import Camera

RNG = np.random.default_rng(0)
EUROC = Camera(
    752,
    480,
    458.654,
    457.296,
    367.215,
    248.375,
    "radtan",
    (-0.28340811, 0.07395907, 0.00019359, 1.76187114e-05),
)
FISHEYE = Camera(640, 480, 300.0, 301.0, 320.0, 240.0, "fisheye", (-0.013, 0.02, -0.006, 0.001))


def _points(n=200):
    return np.column_stack([RNG.uniform(-0.6, 0.6, (n, 2)), np.ones(n)]) * RNG.uniform(0.5, 5, (n, 1))


@pytest.mark.parametrize("cam", [EUROC, FISHEYE])
def test_projection_matches_opencv(cam):
    x_in_cam = _points()
    dist = np.array(cam.dist)
    if cam.model == "fisheye":
        ref = cv2.fisheye.projectPoints(
            x_in_cam.reshape(-1, 1, 3), np.zeros(3), np.zeros(3), cam.k_matrix, dist
        )[0]
    else:
        ref = cv2.projectPoints(x_in_cam, np.zeros(3), np.zeros(3), cam.k_matrix, dist)[0]
    np.testing.assert_allclose(cam.img_from_cam(x_in_cam), ref.reshape(-1, 2), atol=1e-9)


@pytest.mark.parametrize("cam", [EUROC, FISHEYE, Camera.from_prior(640, 480)])
def test_ray_roundtrip(cam):
    x_in_cam = _points()
    xy = cam.cam_ray_from_img(cam.img_from_cam(x_in_cam))
    np.testing.assert_allclose(xy, x_in_cam[:, :2] / x_in_cam[:, 2:], atol=1e-9)


def test_behind_camera_is_nan():
    uv = EUROC.img_from_cam(np.array([[0.1, 0.2, -1.0], [0.1, 0.2, 1.0]]))
    assert np.isnan(uv[0]).all() and np.isfinite(uv[1]).all()


def test_scaled_maps_pixels():
    x_in_cam = _points(20)
    small = EUROC.scaled(376, 240)
    uv = EUROC.img_from_cam(x_in_cam)
    np.testing.assert_allclose(small.img_from_cam(x_in_cam), (uv + 0.5) * 0.5 - 0.5, atol=1e-9)


def test_prior_and_metadata():
    prior = Camera.from_prior(640, 480)
    assert prior.intrinsics_source == "prior"
    assert prior.fx == pytest.approx(320 / np.tan(np.deg2rad(35)))
    meta = Camera.from_prior(1920, 1080, focal_35mm=26.0)
    assert meta.intrinsics_source == "metadata" and meta.fx == pytest.approx(26 / 36 * 1920)


def test_exception():
    with pytest.raises(InputError):
        Camera(640, 480, 300, 300, 320, 240, "radtan", (0.1,))
    with pytest.raises(InputError):
        Camera(640, 480, -1, 300, 320, 240)
    with pytest.raises(ShapeError):
        EUROC.img_from_cam(np.zeros((3, 2)))
