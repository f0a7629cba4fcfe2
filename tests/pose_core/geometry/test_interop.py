import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.geometry.interop import (
    colmap_params_from_world_from_cam,
    kitti_rows_from_world_from_cam,
    quat_wxyz_from_xyzw,
    quat_xyzw_from_wxyz,
    tum_rows_from_world_from_cam,
    world_from_cam_from_colmap_params,
    world_from_cam_from_kitti_rows,
    world_from_cam_from_tum_rows,
)
from pose_core.geometry.rigid3 import so3_exp
from tests.data_paths import SHARED_DATA

RNG = np.random.default_rng(1)


def _poses(n=10):
    out = np.tile(np.eye(4), (n, 1, 1))
    out[:, :3, :3] = so3_exp(RNG.normal(size=(n, 3)))
    out[:, :3, 3] = RNG.normal(size=(n, 3))
    return out


def test_quaternion_order_roundtrip():
    q = RNG.normal(size=(5, 4))
    np.testing.assert_array_equal(quat_wxyz_from_xyzw(quat_xyzw_from_wxyz(q)), q)
    np.testing.assert_array_equal(quat_xyzw_from_wxyz(np.array([1.0, 2, 3, 4])), [2, 3, 4, 1])


def test_tum_roundtrip_and_layout():
    w = _poses()
    ts = np.arange(10) * 0.05
    rows = tum_rows_from_world_from_cam(ts, w)
    np.testing.assert_allclose(rows[:, 1:4], w[:, :3, 3])
    ts2, w2 = world_from_cam_from_tum_rows(rows)
    np.testing.assert_allclose(ts2, ts)
    np.testing.assert_allclose(w2, w, atol=1e-12)


def test_kitti_roundtrip_reads_shared_file():
    rows = np.loadtxt(SHARED_DATA / "kitti_vo_seq1" / "poses.txt")
    w = world_from_cam_from_kitti_rows(rows)
    np.testing.assert_allclose(w[0], np.eye(4), atol=1e-9)
    np.testing.assert_allclose(kitti_rows_from_world_from_cam(w), rows)


def test_colmap_params_against_pycolmap():
    pycolmap = pytest.importorskip("pycolmap")
    w = _poses(3)
    params = colmap_params_from_world_from_cam(w)
    for p, m in zip(params, w, strict=True):
        cam_from_world = pycolmap.Rigid3d(pycolmap.Rotation3d(p[:4]), p[4:])
        np.testing.assert_allclose(cam_from_world.matrix(), np.linalg.inv(m)[:3], atol=1e-9)
    np.testing.assert_allclose(world_from_cam_from_colmap_params(params), w, atol=1e-12)


def test_exception():
    with pytest.raises(ShapeError):
        world_from_cam_from_tum_rows(np.zeros((3, 7)))
