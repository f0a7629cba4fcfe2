import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import (
    Rigid3,
    interpolate_rigid,
    invert_rigid_matrices,
    matrix_from_quat_wxyz,
    nearest_rotation,
    quat_wxyz_from_matrix,
    so3_exp,
    so3_log,
)

RNG = np.random.default_rng(0)


def _random_rigid(n):
    out = np.tile(np.eye(4), (n, 1, 1))
    out[:, :3, :3] = so3_exp(RNG.normal(size=(n, 3)))
    out[:, :3, 3] = RNG.normal(size=(n, 3))
    return out


class TestQuaternion:
    def test_roundtrip(self):
        rot = so3_exp(RNG.normal(size=(500, 3)) * 2.0)
        q = quat_wxyz_from_matrix(rot)
        assert np.all(q[:, 0] >= 0)
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-12)
        np.testing.assert_allclose(matrix_from_quat_wxyz(q), rot, atol=1e-12)

    def test_known_value(self):
        # 90 degrees about z: w = cos(45 deg), z = sin(45 deg)
        rot = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        np.testing.assert_allclose(quat_wxyz_from_matrix(rot), [np.sqrt(0.5), 0, 0, np.sqrt(0.5)], atol=1e-12)

    def test_exception(self):
        with pytest.raises(ShapeError):
            quat_wxyz_from_matrix(np.eye(4))
        with pytest.raises(ShapeError):
            matrix_from_quat_wxyz(np.ones(3))


class TestSo3:
    def test_exp_log_roundtrip(self):
        omega = RNG.normal(size=(200, 3))
        omega *= (np.pi * 0.95 / np.maximum(np.linalg.norm(omega, axis=1), np.pi))[:, None]
        np.testing.assert_allclose(so3_log(so3_exp(omega)), omega, atol=1e-9)

    def test_small_angle(self):
        omega = np.array([1e-10, -2e-10, 3e-10])
        np.testing.assert_allclose(so3_log(so3_exp(omega)), omega, atol=1e-15)

    def test_nearest_rotation(self):
        rot = so3_exp(RNG.normal(size=(10, 3)))
        noisy = rot + 1e-4 * RNG.normal(size=rot.shape)
        fixed = nearest_rotation(noisy)
        np.testing.assert_allclose(
            fixed @ np.swapaxes(fixed, 1, 2), np.broadcast_to(np.eye(3), rot.shape), atol=1e-12
        )
        assert np.abs(fixed - rot).max() < 1e-3


class TestRigid3:
    def test_inverse_twice_is_identity(self):
        for m in _random_rigid(20):
            b_from_a = Rigid3.from_matrix(m)
            np.testing.assert_allclose(b_from_a.inverse().inverse().matrix(), m, atol=1e-12)
            np.testing.assert_allclose((b_from_a @ b_from_a.inverse()).matrix(), np.eye(4), atol=1e-12)

    def test_associative_and_matches_matrices(self):
        a, b, c = (Rigid3.from_matrix(m) for m in _random_rigid(3))
        np.testing.assert_allclose(((a @ b) @ c).matrix(), (a @ (b @ c)).matrix(), atol=1e-12)
        np.testing.assert_allclose((a @ b).matrix(), a.matrix() @ b.matrix(), atol=1e-12)

    def test_transform_points(self):
        m = _random_rigid(1)[0]
        x_in_a = RNG.normal(size=(7, 3))
        x_h = np.column_stack([x_in_a, np.ones(7)]) @ m.T
        np.testing.assert_allclose(Rigid3.from_matrix(m).transform(x_in_a), x_h[:, :3], atol=1e-12)

    def test_quat_constructor(self):
        m = _random_rigid(1)[0]
        r = Rigid3.from_matrix(m)
        np.testing.assert_allclose(Rigid3.from_quat_wxyz(r.quat_wxyz, r.translation).matrix(), m, atol=1e-12)

    def test_batched_inverse(self):
        ms = _random_rigid(5)
        np.testing.assert_allclose(invert_rigid_matrices(ms), np.linalg.inv(ms), atol=1e-12)

    def test_exception(self):
        with pytest.raises(ShapeError):
            Rigid3(np.eye(3), np.zeros(4))


def test_interpolate_endpoints_and_midpoint():
    a, b = _random_rigid(2)
    out = interpolate_rigid(a, b, np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(out[0], a, atol=1e-12)
    np.testing.assert_allclose(out[2], b, atol=1e-12)
    np.testing.assert_allclose(out[1, :3, 3], 0.5 * (a[:3, 3] + b[:3, 3]), atol=1e-12)
    half = so3_log(out[1, :3, :3] @ a[:3, :3].T)
    full = so3_log(b[:3, :3] @ a[:3, :3].T)
    np.testing.assert_allclose(2 * half, full, atol=1e-9)
