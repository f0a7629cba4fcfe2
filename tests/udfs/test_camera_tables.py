"""The camera of decoded frames from a `videos` row: sidecar intrinsics at the decoded size, or the prior."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pose_core.errors import InputError
from udfs.camera_tables import camera_for_frames

CALIB = {"fx": 1000.0, "fy": 1000.0, "cx": 639.5, "cy": 359.5, "width": 1280, "height": 720,
         "distortion_model": "none", "distortion": []}  # fmt: skip


def test_camera_from_sidecar_is_scaled_to_the_decoded_size():
    camera = camera_for_frames(json.dumps(CALIB), 640, 360)
    assert (camera.fx, camera.fy, camera.cx, camera.cy) == pytest.approx((500.0, 500.0, 319.5, 179.5))
    assert camera.intrinsics_source == "sidecar" and camera.model == "pinhole"


def test_camera_prior_without_sidecar():
    camera = camera_for_frames(None, 640, 360)
    assert camera.intrinsics_source == "prior"
    assert camera.fx == pytest.approx(320.0 / np.tan(np.deg2rad(35.0)))  # 70 degree horizontal field of view
    assert (camera.cx, camera.cy) == (319.5, 179.5)


def test_camera_distortion_models():
    radtan = dict(CALIB, distortion_model="radtan", distortion=[-0.28, 0.07, 0.0002, 0.00002, 0.0])
    assert camera_for_frames(json.dumps(radtan), 1280, 720).dist == (-0.28, 0.07, 0.0002, 0.00002)
    radtan["distortion"] = [-0.28, 0.07, 0.0, 0.0, 0.01]
    with pytest.raises(InputError, match="k3"):
        camera_for_frames(json.dumps(radtan), 1280, 720)
    fisheye = dict(CALIB, distortion_model="equidistant", distortion=[0.1, 0.01, 0.0, 0.0])
    assert camera_for_frames(json.dumps(fisheye), 640, 360).model == "fisheye"
