"""Target smoothing and the trajectory fit within joint, speed and acceleration limits."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.geometry.rigid3 import so3_exp
from pose_core.retarget.smoothing import SmoothingOptions, finite_runs, smooth_tool_poses
from pose_core.retarget.trajectory import TrajectoryOptions, fit_trajectory, project_to_limits

FPS = 30.0


def _poses(positions: np.ndarray, rotvecs: np.ndarray) -> np.ndarray:
    out = np.tile(np.eye(4), (len(positions), 1, 1))
    out[:, :3, :3] = so3_exp(rotvecs)
    out[:, :3, 3] = positions
    return out


class TestSmoothToolPoses:
    def test_quadratic_motion_is_kept_and_gaps_stay_empty(self) -> None:
        t = np.arange(90) / FPS
        positions = np.stack([0.1 + 0.2 * t, 0.3 * t**2, np.full_like(t, 0.5)], axis=1)
        poses = _poses(positions, np.zeros((90, 3)))
        poses[40:45] = np.nan
        out = smooth_tool_poses(poses, FPS, SmoothingOptions(), symmetric_closing=True)
        assert np.isnan(out[40:45]).all()
        assert [len(r) for r in finite_runs(np.isfinite(out[:, 0, 0]))] == [40, 45]
        ok = np.isfinite(out[:, 0, 0])
        np.testing.assert_allclose(out[ok, :3, 3], positions[ok], atol=1e-12)  # the ends too
        np.testing.assert_allclose(out[ok, :3, :3], np.eye(3)[None].repeat(ok.sum(), 0), atol=1e-12)

    def test_positions_are_kept_by_default(self) -> None:
        """Fusion's motion model smooths the hands; a second window would only bend real motion."""
        path = np.stack([0.1 * np.sin(np.arange(120) / FPS)] * 3, axis=1)
        out = smooth_tool_poses(_poses(path, np.zeros((120, 3))), FPS, SmoothingOptions(), True)
        np.testing.assert_array_equal(out[:, :3, 3], path)

    def test_jitter_is_reduced(self) -> None:
        rng = np.random.default_rng(0)
        truth = np.stack([0.1 * np.sin(np.arange(120) / FPS)] * 3, axis=1)
        noisy = truth + rng.normal(scale=0.01, size=truth.shape)
        opts = SmoothingOptions(position_window_s=0.67)
        out = smooth_tool_poses(_poses(noisy, np.zeros((120, 3))), FPS, opts, True)
        before, after = np.abs(noisy - truth)[10:-10].mean(), np.abs(out[:, :3, 3] - truth)[10:-10].mean()
        assert after < 0.4 * before

    def test_a_flipping_palm_normal_is_one_line(self) -> None:
        """Half turns about the approach (the closing axis's sign flipping) are noise for parallel jaws."""
        rng = np.random.default_rng(1)
        roll = 0.3 * np.sin(np.arange(60) / FPS) + rng.normal(scale=0.05, size=60)
        flips = np.where(rng.random(60) < 0.3, np.pi, 0.0)
        poses = _poses(np.zeros((60, 3)), np.stack([np.zeros(60), np.zeros(60), roll + flips], axis=1))
        out = smooth_tool_poses(poses, FPS, SmoothingOptions(), symmetric_closing=True)
        y = out[:, :3, 1]
        assert np.all(np.sum(y[1:] * y[:-1], axis=1) > 0.99)  # continuous: no half turns left
        smooth_roll = 0.3 * np.sin(np.arange(60) / FPS)
        expected = np.stack([-np.sin(smooth_roll), np.cos(smooth_roll), np.zeros(60)], axis=1)
        assert np.abs(np.sum(y * expected, axis=1)).min() > 0.99  # the line, either way round
        np.testing.assert_allclose(out[:, :3, 2], np.tile([0.0, 0.0, 1.0], (60, 1)), atol=1e-9)

    def test_bad_shape(self) -> None:
        with pytest.raises(Exception, match="base_from_tool"):
            smooth_tool_poses(np.zeros((3, 3, 3)), FPS, SmoothingOptions(), True)


def _limits_hold(q: np.ndarray, bounds: tuple, velocity: np.ndarray, acceleration: np.ndarray) -> None:
    dt = 1.0 / FPS
    assert np.all(q >= bounds[0]) and np.all(q <= bounds[1])
    assert np.all(np.abs(np.diff(q, axis=0)) <= velocity * dt * (1 + 1e-9))
    assert np.all(np.abs(np.diff(q, n=2, axis=0)) <= acceleration * dt * dt * (1 + 1e-6))


class TestTrajectoryFit:
    """The fit on a toy 'arm' whose tool is its joints: residuals ``(target - q) / tol``."""

    bounds = (np.full(2, -1.0), np.full(2, 1.0))
    velocity = np.array([1.0, 2.0])
    acceleration = np.array([5.0, 20.0])

    def _fit(self, target: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        valid = np.ones(len(target), bool) if valid is None else valid

        def residuals(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            r = np.where(valid[:, None], (target - q) / 0.01, 0.0)
            jac = np.broadcast_to(np.eye(2) / 0.01, (len(q), 2, 2)) * valid[:, None, None]
            return r, jac

        q_ik = np.clip(np.where(valid[:, None], target, 0.0), *self.bounds)
        return fit_trajectory(residuals, q_ik, 1.0 / FPS, self.bounds, self.velocity, self.acceleration,
                              TrajectoryOptions())

    def test_jittery_target_within_every_limit(self) -> None:
        rng = np.random.default_rng(2)
        t = np.arange(150) / FPS
        clean = np.stack([0.5 * np.sin(t), 0.8 * np.cos(2 * t)], axis=1)  # within the speed limits
        q = self._fit(clean + rng.normal(scale=0.05, size=(150, 2)))
        _limits_hold(q, self.bounds, self.velocity, self.acceleration)
        assert np.abs(q - clean).mean() < 0.05  # it follows the motion, not the jitter

    def test_a_feasible_target_is_followed_and_gaps_are_crossed_smoothly(self) -> None:
        t = np.arange(120) / FPS
        target = np.stack([0.3 * np.sin(t), 0.5 * np.sin(2 * t)], axis=1)
        valid = np.ones(120, bool)
        valid[50:70] = False
        q = self._fit(target, valid)
        _limits_hold(q, self.bounds, self.velocity, self.acceleration)
        np.testing.assert_allclose(q[valid], target[valid], atol=2e-3)

    def test_projection_repairs_a_jump(self) -> None:
        q = np.zeros((60, 2))
        q[30:] = 0.8  # a step no arm can take
        out = project_to_limits(q, 1.0 / FPS, self.bounds, self.velocity, self.acceleration,
                                TrajectoryOptions())
        _limits_hold(out, self.bounds, self.velocity, self.acceleration)
        assert abs(out[0, 0]) < 0.05 and abs(out[-1, 0] - 0.8) < 0.05

    def test_accelerations_hold_exactly_where_the_projection_stops_short(self) -> None:
        """Without the margin ADMM's residual broke 3 accelerations of this path; the last pass holds them."""
        rng = np.random.default_rng(0)
        for _ in range(3):
            path = np.clip(0.2 * rng.normal(scale=0.5, size=(200, 2)).cumsum(0), -0.95, 0.95)
        out = project_to_limits(path, 1.0 / FPS, self.bounds, self.velocity, self.acceleration,
                                TrajectoryOptions(margin=0.0))
        _limits_hold(out, self.bounds, self.velocity, self.acceleration)

    def test_a_joint_heading_into_its_limit_at_full_speed_brakes_in_time(self) -> None:
        """The elbow of the pipeline's synth_table_3 Panda arrived at its limit 0.2 % too fast to stop."""
        t = np.arange(90) / FPS
        path = np.stack([np.minimum(-0.5 + 2.0 * t, 1.0), np.zeros_like(t)], axis=1)  # into +1 at 2 rad/s
        out = project_to_limits(path, 1.0 / FPS, self.bounds, self.velocity, self.acceleration,
                                TrajectoryOptions(margin=0.0))
        _limits_hold(out, self.bounds, self.velocity, self.acceleration)
