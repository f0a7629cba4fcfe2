"""Wrist frame convention and Allegro keypoint-vector retargeting against ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.hand import HandRetargetOptions, retarget_hand_keypoints
from pose_core.retarget.wrist import grip_aperture_from_keypoints, wrist_from_keypoints
from pose_core.synth.hands import HandOptions, make_hand_motion
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory
from udfs.robots import load_embodiment

PROFILES = Path(__file__).resolve().parents[3] / "conf" / "embodiments"


@pytest.fixture(scope="module")
def allegro(shared_data: Path) -> Embodiment:
    return load_embodiment(PROFILES / "allegro.yaml", shared_data / "robots")


def palm_keypoints(index_side_y: float) -> np.ndarray:
    """Palm down (-z world), fingers along +x, index MCP on the ``index_side_y`` side."""
    kp = np.zeros((21, 3))
    kp[5] = [0.09, 0.025 * index_side_y, 0.0]
    kp[17] = [0.08, -0.03 * index_side_y, 0.0]
    kp[4] = [0.10, 0.05 * index_side_y, -0.02]
    kp[8] = [0.16, 0.03 * index_side_y, -0.02]
    return kp


class TestWristFrame:
    @pytest.mark.parametrize("is_right,index_y", [(True, 1.0), (False, -1.0)])
    def test_axes(self, is_right: bool, index_y: float) -> None:
        # Right hand palm down: the thumb/index side is +y (left of +x with z up); a left hand mirrors it.
        frame = wrist_from_keypoints(palm_keypoints(index_y)[None], is_right)[0]
        np.testing.assert_allclose(np.linalg.det(frame[:3, :3]), 1.0, atol=1e-12)
        assert frame[:3, 2] @ [1, 0, 0] > 0.99  # approach along the fingers
        assert frame[:3, 0] @ [0, 0, -1] > 0.99  # palm normal out of the (downward) palm
        assert frame[:3, 1] @ [0, index_y if is_right else -index_y, 0] > 0.99

    def test_missing_keypoints_give_nan(self) -> None:
        kp = np.stack([palm_keypoints(1.0), np.full((21, 3), np.nan)])
        frames = wrist_from_keypoints(kp, True)
        assert np.all(np.isfinite(frames[0])) and np.all(np.isnan(frames[1]))
        assert grip_aperture_from_keypoints(kp)[0] == pytest.approx(np.hypot(0.06, 0.02))
        with pytest.raises(ShapeError):
            wrist_from_keypoints(np.zeros((3, 20, 3)), True)


class TestAllegroRetargeting:
    def test_recovers_robot_made_vectors(self, allegro: Embodiment) -> None:
        frames = 120
        ts = np.arange(frames) / 30.0
        rng = np.random.default_rng(0)
        mid, half = 0.5 * (allegro.lower + allegro.upper), 0.5 * (allegro.upper - allegro.lower)
        freq = rng.uniform(0.1, 0.4, 16)
        q_true = mid + 0.6 * half * np.sin(2 * np.pi * freq * ts[:, None] + rng.uniform(0, 6, 16))
        poses = allegro.model.forward(q_true)
        index = {n: i for i, n in enumerate(allegro.model.frames)}
        kp = np.zeros((frames, 21, 3))
        for v in allegro.vectors:  # human keypoints = robot points shrunk to human size
            kp[:, v.task_keypoint] = (poses[:, index[v.task_link], :3, 3]
                                      - poses[:, index["wrist"], :3, 3]) / allegro.keypoint_scale
        result = retarget_hand_keypoints(allegro, kp, ts, HandRetargetOptions())
        assert result.vector_error_m.mean() < 0.002 and result.vector_error_m.max() < 0.01
        q = result.joint_positions
        assert np.all(q >= allegro.lower) and np.all(q <= allegro.upper)
        assert np.all(np.abs(np.diff(q, axis=0)) * 30.0 <= allegro.velocity * (1 + 1e-9))

    def test_fist_flexes_more_than_open_hand(self, allegro: Embodiment) -> None:
        rng = np.random.default_rng(1)
        head = make_head_trajectory(8.0, TrajectoryOptions(), rng)
        motion = make_hand_motion(8.0, head, SceneOptions(), HandOptions(), rng)
        ts = np.arange(0.0, 8.0, 1 / 30.0)
        kp_world = motion.keypoints_world(ts)[:, 1]  # wearer's right hand
        wrist = wrist_from_keypoints(kp_world, is_right=True)
        kp_in_wrist = np.einsum("fji,fkj->fki", wrist[:, :3, :3], kp_world - wrist[:, None, :3, 3])
        result = retarget_hand_keypoints(allegro, kp_in_wrist, ts, HandRetargetOptions())
        curl = motion.grip_curl(ts)[:, 1]
        flex = result.joint_positions[:, [1, 2, 3, 5, 6, 7, 9, 10, 11]].mean(axis=1)  # finger flexion joints
        assert np.corrcoef(curl, flex)[0, 1] > 0.8
        assert np.median(result.vector_error_m) < 0.02
