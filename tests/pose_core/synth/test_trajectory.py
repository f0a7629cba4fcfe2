"""Head trajectory: analytic derivatives, smoothness, and the motion envelope the brief asks for."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pose_core.synth.presets import SYNTH_PRESETS
from pose_core.synth.smooth import SmoothSignal
from pose_core.synth.trajectory import TrajectoryOptions, after_windows, make_head_trajectory

DURATION_S = 20.0


@pytest.fixture(scope="module")
def trajectory():
    return make_head_trajectory(DURATION_S, TrajectoryOptions(), np.random.default_rng(7))


@pytest.fixture(scope="module", params=sorted(SYNTH_PRESETS))
def any_trajectory(request):
    """The trajectory of each preset (`hard`: faster turns, a walk away from the table and back)."""
    opts = SYNTH_PRESETS[request.param].trajectory
    return make_head_trajectory(DURATION_S, opts, np.random.default_rng(7))


class TestSmoothSignal:
    def test_derivatives_match_finite_differences(self):
        sig = SmoothSignal(0.3, ((0.2, 0.7, 0.1),), ((0.5, 0.4, 1.2), (1.1, 0.3, -0.5)))
        ts = np.linspace(0.0, 2.0, 401)
        h = 1e-5
        v, d1, d2 = sig.evaluate(ts)
        vp, vm = sig.evaluate(ts + h)[0], sig.evaluate(ts - h)[0]
        np.testing.assert_allclose(d1, (vp - vm) / (2 * h), atol=1e-6)
        # d2 has kinks at step ends (C2, not C3): the central difference is off by O(h) there.
        h2 = 1e-6
        np.testing.assert_allclose(
            d2, (sig.evaluate(ts + h2)[1] - sig.evaluate(ts - h2)[1]) / (2 * h2), atol=1e-3
        )
        # A quintic step adds exactly its delta once finished.
        assert sig.evaluate(np.array([10.0]))[0][0] - sig.evaluate(np.array([-10.0]))[0][0] == pytest.approx(
            1.2 - 0.5 + 0.2 * (np.sin(2 * np.pi * 0.7 * 10 + 0.1) - np.sin(-2 * np.pi * 0.7 * 10 + 0.1))
        )


class TestHeadTrajectory:
    def test_gyro_matches_rotation_finite_difference(self, any_trajectory):
        ts = np.linspace(0.0, DURATION_S, 2001)
        h = 1e-5
        r_plus = any_trajectory.sample(ts + h).world_from_cam[:, :3, :3]
        r_minus = any_trajectory.sample(ts - h).world_from_cam[:, :3, :3]
        omega_fd = Rotation.from_matrix(np.swapaxes(r_minus, 1, 2) @ r_plus).as_rotvec() / (2 * h)
        np.testing.assert_allclose(any_trajectory.sample(ts).gyro_cam, omega_fd, atol=1e-6)

    def test_velocity_and_acceleration_match_positions(self, any_trajectory):
        ts = np.linspace(0.0, DURATION_S, 2001)
        h = 1e-4
        p = [any_trajectory.sample(ts + k * h).world_from_cam[:, :3, 3] for k in (-1, 0, 1)]
        s = any_trajectory.sample(ts)
        np.testing.assert_allclose(s.velocity_world, (p[2] - p[0]) / (2 * h), atol=1e-6)
        np.testing.assert_allclose(s.accel_world, (p[2] - 2 * p[1] + p[0]) / h**2, atol=1e-3)

    def test_acceleration_is_continuous(self, any_trajectory):
        """C2: at 1 kHz, neither acceleration nor angular velocity jumps."""
        s = any_trajectory.sample(np.arange(0.0, DURATION_S, 1e-3))
        assert np.abs(np.diff(s.accel_world, axis=0)).max() < 0.05  # m/s^2 per ms
        assert np.abs(np.diff(s.gyro_cam, axis=0)).max() < 0.05  # rad/s per ms

    def test_rotations_are_proper(self, any_trajectory):
        r = any_trajectory.sample(np.linspace(0, DURATION_S, 301)).world_from_cam[:, :3, :3]
        np.testing.assert_allclose(np.swapaxes(r, 1, 2) @ r, np.broadcast_to(np.eye(3), r.shape), atol=1e-12)
        np.testing.assert_allclose(np.linalg.det(r), 1.0, atol=1e-12)

    def test_motion_envelope(self, trajectory):
        ts = np.arange(0.0, DURATION_S, 1.0 / 30.0)
        pose = trajectory.sample(ts).world_from_cam
        fwd = pose[:, :3, 2]
        pitch_down = np.degrees(np.arcsin(-fwd[:, 2]))
        heading = np.unwrap(np.arctan2(fwd[:, 1], fwd[:, 0]))
        yaw_rate = np.degrees(np.abs(np.diff(heading))) * 30.0
        height = pose[:, 2, 3]
        walk = np.ptp(pose[:, 0, 3])
        mean_pitch = np.degrees(TrajectoryOptions().pitch_down_rad)
        assert pitch_down.min() >= mean_pitch - 10.0 and pitch_down.max() <= mean_pitch + 12.0, (
            pitch_down.min(),
            pitch_down.max(),
        )
        assert yaw_rate.max() >= 150.0, yaw_rate.max()  # fast head turns, seen at the video rate
        assert yaw_rate.max() <= 230.0
        assert np.mean(yaw_rate > 100.0) < 0.2  # ... in short bursts only
        mean_height = TrajectoryOptions().head_position_m[2]
        assert abs(height.mean() - mean_height) < 0.02 and 0.01 < np.ptp(height) < 0.06  # head bob
        assert 0.3 <= walk <= 1.0, walk

    def test_shoulders_below_and_behind_head(self, trajectory):
        ts = np.linspace(0, DURATION_S, 50)
        head = trajectory.sample(ts).world_from_cam[:, :3, 3]
        shoulders = trajectory.shoulders_world(ts)
        drop = head[:, None, 2] - shoulders[..., 2]
        assert np.all((drop > 0.2) & (drop < 0.3))
        width = np.linalg.norm(shoulders[:, 1] - shoulders[:, 0], axis=1)
        np.testing.assert_allclose(width, 0.36, atol=1e-9)
        # Wearer-right shoulder is on the right of the torso (+x at yaw 0, the torso only sways).
        assert np.all(shoulders[:, 1, 0] > shoulders[:, 0, 0])

    def test_excursion_turns_round_walks_away_and_comes_back(self):
        opts = SYNTH_PRESETS["hard"].trajectory
        traj = make_head_trajectory(DURATION_S, opts, np.random.default_rng(7))
        assert len(traj.excursions) == 1
        start, end = traj.excursions[0]
        ts = np.linspace(start, end, 2001)
        s = traj.sample(ts)
        centre = s.world_from_cam[:, :3, 3]
        away = np.linalg.norm(centre[:, :2] - centre[0, :2], axis=1)
        far = int(np.argmax(away))
        assert away[far] == pytest.approx(opts.excursion_distance_m, abs=0.08)  # lean and bob on top
        # Back where it left, up to the lean (+-3 cm) and sway: walks along the table wait until the end.
        assert away[-1] < 2 * (opts.lean_amplitude_m + 0.3 * opts.bob_amplitude_m), away[-1]
        speed = np.linalg.norm(s.velocity_world[:, :2], axis=1)
        assert speed.max() == pytest.approx(opts.excursion_peak_speed_m_s, abs=0.1)
        # At the far point the torso faces where it walked (roughly away from the table) and looks ahead.
        torso = traj.torso_yaw.evaluate(ts[far : far + 1])[0][0]
        walked = centre[far, :2] - centre[0, :2]
        assert np.cos(torso) * walked[1] - np.sin(torso) * walked[0] > 0.9 * away[far]  # (-sin, cos) . walked
        pitch = traj.pitch_down.evaluate(ts[far : far + 1])[0][0]
        assert abs(pitch - opts.excursion_pitch_down_rad) <= opts.pitch_sway_rad + 1e-9
        # The torso turns with the body (twice), and fast head turns never overlap those turns.
        body_turns = tuple((t0, t0 + dt) for t0, dt, _ in traj.torso_yaw.steps)
        assert len(body_turns) == 2 and body_turns[0][0] == start
        head_turns = [(t0, dt) for t0, dt, _ in traj.yaw.steps if (t0, t0 + dt) not in body_turns]
        assert len(head_turns) == len(traj.yaw.steps) - 2
        assert all(after_windows(t0, dt, body_turns) == t0 for t0, dt in head_turns)

    def test_after_windows(self):
        windows = ((1.0, 2.0), (2.5, 4.0))
        assert after_windows(0.0, 0.5, windows) == 0.0
        assert after_windows(0.8, 0.5, windows) == 2.0  # overlaps the first, then fits before the second
        assert after_windows(1.8, 1.0, windows) == 4.0  # pushed past the first, then past the second
        assert after_windows(5.0, 9.0, windows) == 5.0

    def test_rejects_bad_duration(self):
        with pytest.raises(ValueError, match="duration_s"):
            make_head_trajectory(0.0, TrajectoryOptions(), np.random.default_rng(0))


@pytest.mark.parametrize("preset", sorted(SYNTH_PRESETS))
def test_a_periodic_trajectory_is_a_closed_loop(preset):
    """Periodic: the pose, velocity, acceleration and rotation rate at the period's end are those at 0 (so
    a clip of the loop repeats without a seam), and the motion is still there (walks, turns, sways)."""
    period = 30.0
    opts = SYNTH_PRESETS[preset].trajectory
    traj = make_head_trajectory(period, opts, np.random.default_rng(7), periodic=True)
    ends = traj.sample(np.array([0.0, period]))
    for field in ("world_from_cam", "velocity_world", "accel_world", "gyro_cam"):
        at_end, at_start = getattr(ends, field)
        np.testing.assert_allclose(at_end, at_start, atol=1e-12, err_msg=field)
    assert all(t0 + dt <= period for sig in (*traj.position, traj.yaw) for t0, dt, _ in sig.steps)
    assert sum(delta for _, _, delta in traj.position[0].steps) == pytest.approx(0.0, abs=1e-12)
    assert len(traj.yaw.steps) >= 8 and len(traj.position[0].steps) >= 3
    s = traj.sample(np.arange(0.0, period, 1.0 / 30.0))
    assert np.ptp(s.world_from_cam[:, 0, 3]) > 0.2  # it still walks along the table
