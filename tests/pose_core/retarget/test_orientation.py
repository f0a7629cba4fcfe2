"""What of the hand's orientation each tool keeps: the hand frame on the tool frame, kept targets, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pose_core.geometry.rigid3 import so3_exp
from pose_core.retarget.arm import RetargetOptions, orientation_task
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.ik import solve_pose_ik
from pose_core.retarget.kinematics import KinematicModel
from pose_core.retarget.orientation import OrientationSpec, axis_errors, kept_targets, task_weights
from pose_core.retarget.placement import base_from_tcp_targets
from pose_core.retarget.wrist import wrist_from_keypoints
from pose_core.synth.robot_hands import joint_trajectory, keypoints_at_wrists, tcp_poses
from udfs.robots import load_embodiment

PROFILES = Path(__file__).resolve().parents[3] / "conf" / "embodiments"


def _load(name: str, shared_data: Path) -> Embodiment:
    return load_embodiment(PROFILES / f"{name}.yaml", shared_data / "robots")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


class TestHandFrameOnToolFrame:
    """The mapping each profile states: tool z (approach) along the fingers, y (jaw travel) across the hand.

    A right hand's knuckle line points from the little finger to the index (the thumb side); its approach
    from the wrist to the knuckles. The robot's own jaw geometry is there: the Panda's finger joint slides
    along tool y; an SO arm's moving jaw hinges about tool x, so its tip travels along y.
    """

    @pytest.mark.parametrize("name", ["so100", "so101", "panda", "xarm7"])
    def test_approach_and_closing_axes_of_a_hand(self, name: str, shared_data: Path) -> None:
        emb = _load(name, shared_data)
        _, q = joint_trajectory(emb, 1, 0)
        target = tcp_poses(emb, q)  # a pose the arm reaches; put a right hand there
        world_from_wrist = emb.world_from_base @ target @ emb.tcp_from_wrist
        kp = keypoints_at_wrists(world_from_wrist, True, np.array([0.05]))[0]
        wrist = wrist_from_keypoints(kp, True)
        tool = base_from_tcp_targets(emb, wrist[None], emb.world_from_base)[0]
        in_base = (np.linalg.inv(emb.world_from_base) @ np.c_[kp, np.ones(21)].T).T[:, :3]
        knuckles = 0.5 * (in_base[5] + in_base[17])
        np.testing.assert_allclose(tool[:3, 2], _unit(knuckles - in_base[0]), atol=1e-9)  # approach
        across = in_base[5] - in_base[17]  # little finger -> index: the thumb side of a right hand
        across -= (across @ tool[:3, 2]) * tool[:3, 2]
        np.testing.assert_allclose(tool[:3, 1], _unit(across), atol=1e-9)  # closing axis

    def test_panda_fingers_slide_along_the_closing_axis(self, shared_data: Path) -> None:
        panda = _load("panda", shared_data)
        _, q = joint_trajectory(panda, 5, 1)
        fingers = KinematicModel(panda.urdf, ["panda_hand", "panda_leftfinger"], base_link="panda_link0",
                                 active_joints=panda.model.joint_names)
        poses = fingers.forward(q)
        tool = tcp_poses(panda, q)
        axis = panda.urdf.joint("panda_finger_joint1").axis
        slide = np.einsum("bij,j->bi", poses[:, 1, :3, :3], axis)
        np.testing.assert_allclose(np.abs(np.sum(slide * tool[:, :3, 1], axis=1)), 1.0, atol=1e-9)
        down_the_fingers = _unit(tool[0, :3, 3] - poses[0, 0, :3, 3])
        np.testing.assert_allclose(down_the_fingers, tool[0, :3, 2], atol=1e-9)

    @pytest.mark.parametrize("name", ["so100", "so101"])
    def test_so_arm_jaw_closes_along_the_closing_axis(self, name: str, shared_data: Path) -> None:
        arm = _load(name, shared_data)
        _, q = joint_trajectory(arm, 5, 2)
        hinge_joint = arm.urdf.joint("gripper")
        jaw = KinematicModel(arm.urdf, [hinge_joint.child], base_link=arm.model.base_link,
                             active_joints=arm.model.joint_names)
        hinge = np.einsum("bij,j->bi", jaw.forward(q)[:, 0, :3, :3], hinge_joint.axis)
        tool = tcp_poses(arm, q)
        travel = np.cross(hinge, tool[:, :3, 2])  # a jaw tip on the approach moves across it, about the hinge
        np.testing.assert_allclose(np.abs(np.sum(travel * tool[:, :3, 1], axis=1)), 1.0, atol=1e-6)


class TestKeptTargets:
    def test_parallel_jaws_grip_alike_either_way_round(self) -> None:
        spec = OrientationSpec(closing="symmetric")
        tool = np.eye(4)[None].repeat(2, 0)
        target = tool.copy()
        target[1, :3, :3] = so3_exp(np.array([0.0, 0.0, np.pi]))  # half a turn about the approach
        kept = kept_targets(spec, tool, target)
        np.testing.assert_allclose(kept, tool, atol=1e-12)
        approach, closing = axis_errors(spec, tool, kept)
        np.testing.assert_allclose(approach, 0.0, atol=1e-9)
        np.testing.assert_allclose(closing, 0.0, atol=1e-9)
        directed = OrientationSpec(closing="directed")
        assert axis_errors(directed, tool, kept_targets(directed, tool, target))[1][1] == pytest.approx(np.pi)

    def test_errors_split_into_approach_and_closing(self) -> None:
        spec = OrientationSpec(closing="directed")
        tool = np.eye(4)[None].repeat(2, 0)
        target = tool.copy()
        target[0, :3, :3] = so3_exp(np.array([0.0, 0.0, 0.3]))  # a roll about the approach
        target[1, :3, :3] = so3_exp(np.array([0.2, 0.0, 0.0]))  # a tilt of the approach
        approach, closing = axis_errors(spec, tool, kept_targets(spec, tool, target))
        np.testing.assert_allclose(approach, [0.0, 0.2], atol=1e-9)
        np.testing.assert_allclose(closing, [0.3, 0.0], atol=1e-9)
        weights = task_weights(OrientationSpec(closing_weight=0.5), tool)
        np.testing.assert_allclose(weights[0] @ [0.0, 0.0, 1.0], [0.0, 0.0, 0.5])  # roll rows halved
        np.testing.assert_allclose(weights[0] @ [1.0, 0.0, 0.0], [1.0, 0.0, 0.0])

    @pytest.mark.parametrize("name", ["so100", "so101"])
    def test_five_dof_keeps_elevation_and_roll_and_reaches_the_kept_target(self, name: str,
                                                                            shared_data: Path) -> None:
        """A 5-DoF arm's approach stays normal to its pitch axes; the kept target is one it reaches."""
        emb = _load(name, shared_data)
        rng = np.random.default_rng(0)
        q = rng.uniform(np.maximum(emb.lower, -2.0), np.minimum(emb.upper, 2.0), (200, emb.model.num_joints))
        poses = emb.model.forward(q)
        normal = np.einsum("bij,j->bi", poses[:, 1, :3, :3], emb.plane_axis)
        tool = poses[:, 0] @ emb.ee_from_tcp
        np.testing.assert_allclose(np.sum(normal * tool[:, :3, 2], axis=1), 0.0, atol=1e-5)
        np.testing.assert_allclose(normal[:, 2], 0.0, atol=1e-5)  # pitch axes horizontal: z is the vertical
        # Targets: reached poses turned about the vertical through the tool point (a heading off the plane).
        ts, q_smooth = joint_trajectory(emb, 30, 3)
        start = tcp_poses(emb, q_smooth)
        turned = start.copy()
        turned[:, :3, :3] = so3_exp(np.array([0.0, 0.0, 0.5])) @ start[:, :3, :3]
        kept = orientation_task(emb)(emb.model.forward(q_smooth), start, turned)[0]
        np.testing.assert_allclose(kept[:, 2, 2], turned[:, 2, 2], atol=1e-9)  # elevation kept
        np.testing.assert_allclose(kept[:, :3, 2], start[:, :3, 2], atol=1e-4)  # heading back in the plane
        opts = RetargetOptions()
        bounds = (np.broadcast_to(emb.lower, q_smooth.shape), np.broadcast_to(emb.upper, q_smooth.shape))
        sol = solve_pose_ik(emb.model, 0, turned, q_smooth, bounds, opts.ik, None, emb.ee_from_tcp,
                            orientation=orientation_task(emb))
        assert sol.position_error_m.max() < 1e-3 and sol.orientation_error_rad.max() < 1e-2

    def test_bad_specs_are_refused(self) -> None:
        with pytest.raises(ValueError, match="plane_joint"):
            OrientationSpec(approach="in_plane")
        with pytest.raises(ValueError, match="closing must be one of"):
            OrientationSpec(closing="sideways")
