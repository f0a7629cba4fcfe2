"""URDF parsing, forward kinematics and Jacobians on the shared robot URDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pose_core.errors import InputError, ShapeError
from pose_core.retarget.ik import IKOptions, pose_errors, solve_pose_ik
from pose_core.retarget.kinematics import KinematicModel
from pose_core.retarget.urdf import matrix_from_xyz_rpy, parse_urdf
from udfs.robots import read_urdf

PANDA = "example-robot-data/robots/panda_description/urdf/panda.urdf"
XARM7 = "dex-urdf/arms/xarm7/xarm7.urdf"
SO101 = "SO-ARM100/SO101/so101_new_calib.urdf"


@pytest.fixture(scope="module")
def robots(shared_data: Path) -> Path:
    return shared_data / "robots"


class TestUrdf:
    def test_panda_tree(self, robots: Path) -> None:
        urdf = read_urdf(robots / PANDA)
        assert urdf.root_link == "panda_link0"
        j4 = urdf.joint("panda_joint4")
        assert (j4.lower, j4.upper, j4.velocity) == (-3.0718, -0.0698, 2.175)
        assert urdf.joint("panda_finger_joint2").mimic == ("panda_finger_joint1", 1.0, 0.0)

    def test_rpy_matches_rz_ry_rx(self) -> None:
        m = matrix_from_xyz_rpy((0, 0, 0), (0.3, -0.2, 1.1))
        rx = matrix_from_xyz_rpy((0, 0, 0), (0.3, 0, 0))
        ry = matrix_from_xyz_rpy((0, 0, 0), (0, -0.2, 0))
        rz = matrix_from_xyz_rpy((0, 0, 0), (0, 0, 1.1))
        np.testing.assert_allclose(m, rz @ ry @ rx, atol=1e-12)

    def test_not_one_tree(self) -> None:
        with pytest.raises(InputError, match="one root"):
            parse_urdf('<robot name="r"><link name="a"/><link name="b"/></robot>')


class TestKinematicModel:
    def test_panda_zero_pose(self, robots: Path) -> None:
        # At q = 0 the Panda is straight up with the hand pointing down: TCP at x = 0.088,
        # z = 0.333 + 0.316 + 0.384 - 0.107 - 0.1034 (Franka's DH table).
        km = KinematicModel(read_urdf(robots / PANDA), ["panda_hand_tcp"])
        tcp = km.forward(np.zeros((1, 7)))[0, 0]
        np.testing.assert_allclose(tcp[:3, 3], [0.088, 0.0, 0.8226], atol=1e-9)
        np.testing.assert_allclose(tcp[:3, 2], [0.0, 0.0, -1.0], atol=1e-9)

    @pytest.mark.parametrize("path,link", [(PANDA, "panda_hand_tcp"), (XARM7, "link_eef"),
                                           (SO101, "gripper_frame_link")])
    def test_jacobian_matches_finite_differences(self, robots: Path, path: str, link: str) -> None:
        km = KinematicModel(read_urdf(robots / path), [link])
        rng = np.random.default_rng(3)
        q = rng.uniform(np.maximum(km.lower, -2), np.minimum(km.upper, 2), (4, km.num_joints))
        poses, jac = km.forward_with_jacobians(q)
        eps = 1e-6
        for j in range(km.num_joints):
            dq = np.zeros_like(q)
            dq[:, j] = eps
            e_p, e_r = pose_errors(poses[:, 0], km.forward(q + dq)[:, 0])
            np.testing.assert_allclose(jac[:, 0, :3, j], e_p / eps, atol=1e-5)
            np.testing.assert_allclose(jac[:, 0, 3:, j], e_r / eps, atol=1e-5)

    @pytest.mark.parametrize("batch", [1, 7])
    def test_shapes(self, robots: Path, batch: int) -> None:
        km = KinematicModel(read_urdf(robots / SO101), ["gripper_frame_link", "wrist_link"])
        poses, jac = km.forward_with_jacobians(np.zeros((batch, 5)))
        assert poses.shape == (batch, 2, 4, 4) and jac.shape == (batch, 2, 6, 5)
        with pytest.raises(ShapeError):
            km.forward(np.zeros((batch, 6)))

    def test_mimic_joint_follows_source(self, robots: Path) -> None:
        km = KinematicModel(read_urdf(robots / PANDA), ["panda_leftfinger", "panda_rightfinger"],
                            base_link="panda_hand", active_joints=["panda_finger_joint1"])
        poses = km.forward(np.array([[0.03]]))[0]
        gap = np.linalg.norm(poses[0, :3, 3] - poses[1, :3, 3])
        assert gap == pytest.approx(0.06, abs=1e-12)


class TestSolvePoseIK:
    def test_damped_pseudo_inverse_is_lapacks_also_near_a_singularity(self) -> None:
        """The position task's 3x3 Gram matrices are inverted in closed form: the same damped pseudo-inverse
        as LAPACK's solve, also where two rows are nearly parallel (an arm stretched out)."""
        from pose_core.retarget.ik import _damped_pinv

        rng = np.random.default_rng(3)
        jac = rng.normal(size=(64, 3, 6))
        jac[:32, 2] = jac[:32, 1] * (1.0 + 1e-5)
        damping = 1e-3
        gram = jac @ np.swapaxes(jac, 1, 2) + damping**2 * np.eye(3)
        expected = np.swapaxes(np.linalg.solve(gram, jac), 1, 2)
        scale = np.abs(expected).max(axis=(1, 2), keepdims=True)
        np.testing.assert_allclose(_damped_pinv(jac, damping) / scale, expected / scale, rtol=0, atol=1e-6)

    def test_recovers_reachable_poses_and_respects_bounds(self, robots: Path) -> None:
        km = KinematicModel(read_urdf(robots / PANDA), ["panda_hand_tcp"])
        rng = np.random.default_rng(0)
        q_true = rng.uniform(km.lower, km.upper, (64, 7))
        seed = np.clip(q_true + rng.normal(0.0, 0.2, q_true.shape), km.lower, km.upper)
        bounds = (np.broadcast_to(km.lower, seed.shape), np.broadcast_to(km.upper, seed.shape))
        sol = solve_pose_ik(km, 0, km.forward(q_true)[:, 0], seed, bounds, IKOptions(max_iters=60))
        assert np.mean(sol.converged) >= 0.95
        assert np.median(sol.position_error_m) < 1e-6
        assert np.all(sol.joint_positions >= km.lower) and np.all(sol.joint_positions <= km.upper)

    def test_tight_box_is_never_left(self, robots: Path) -> None:
        km = KinematicModel(read_urdf(robots / XARM7), ["link_eef"])
        q0 = np.zeros((8, 7)) + 0.5
        target = km.forward(q0 + 0.8)[:, 0]
        bounds = (q0 - 0.05, q0 + 0.05)
        sol = solve_pose_ik(km, 0, target, q0, bounds, IKOptions(max_iters=20))
        assert np.all(sol.joint_positions >= bounds[0] - 1e-12)
        assert np.all(sol.joint_positions <= bounds[1] + 1e-12)
        assert not np.any(sol.converged)

    def test_a_settled_5dof_solve_stops_early_with_the_errors_of_a_full_solve(self, robots: Path) -> None:
        """Reachable positions with orientations turned 60 deg about x: out of reach for 5 joints. The tasks
        settle within a few iterations and the solve stops there (`stall_fraction`), not at max_iters with
        the posture pull drifting in the null space, and its errors are those of the full solve."""
        from pose_core.geometry.rigid3 import so3_exp

        km = KinematicModel(read_urdf(robots / SO101), ["gripper_link"])
        rng = np.random.default_rng(2)
        q_true = rng.uniform(0.5 * km.lower, 0.5 * km.upper, (16, 5))
        target = km.forward(q_true)[:, 0]
        target[:, :3, :3] = target[:, :3, :3] @ so3_exp(np.array([np.pi / 3, 0.0, 0.0]))
        seed = np.clip(q_true + rng.normal(0.0, 0.1, q_true.shape), km.lower, km.upper)
        bounds = (np.broadcast_to(km.lower, seed.shape), np.broadcast_to(km.upper, seed.shape))
        home = np.zeros(5)
        settled = solve_pose_ik(km, 0, target, seed, bounds, IKOptions(max_iters=100), home)
        full = solve_pose_ik(km, 0, target, seed, bounds, IKOptions(max_iters=100, stall_fraction=0.0), home)
        assert full.iterations == 100 and settled.iterations < 50  # 29 here
        assert not np.any(settled.converged) and np.all(settled.position_error_m < 1e-3)
        np.testing.assert_allclose(settled.orientation_error_rad, full.orientation_error_rad,
                                   atol=np.radians(1.0))

    def test_tool_on_the_xarm7_flange_matches_a_solve_for_the_flange(self, robots: Path) -> None:
        """A 172 mm tool: solving for the tool pose lands the flange where the tool's target puts it."""
        km = KinematicModel(read_urdf(robots / XARM7), ["link_eef"])
        tool = matrix_from_xyz_rpy((0.0, 0.02, 0.172), (0.3, 0.0, 0.0))
        rng = np.random.default_rng(1)
        q_true = rng.uniform(-1.0, 1.0, (32, 7))
        seed = q_true + rng.normal(0.0, 0.2, q_true.shape)
        bounds = (np.broadcast_to(km.lower, seed.shape), np.broadcast_to(km.upper, seed.shape))
        target = km.forward(q_true)[:, 0] @ tool
        with_tool = solve_pose_ik(km, 0, target, seed, bounds, IKOptions(max_iters=60), tool=tool)
        flange = solve_pose_ik(km, 0, km.forward(q_true)[:, 0], seed, bounds, IKOptions(max_iters=60))
        assert np.mean(with_tool.converged) >= np.mean(flange.converged) - 0.1
        ok = with_tool.converged
        e_p, _ = pose_errors(km.forward(with_tool.joint_positions[ok])[:, 0], km.forward(q_true[ok])[:, 0])
        assert np.max(np.linalg.norm(e_p, axis=1)) < 2e-4  # a full pose fixes the flange too
