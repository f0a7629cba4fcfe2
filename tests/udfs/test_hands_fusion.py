"""The fusion udf on pandas frames built from a synthetic episode's ground-truth poses and hands."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pandas as pd
import pytest

from bench.hand_scale import map_rows
from pose_core.camera_poses.scale import ImuScaleOptions
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import quat_wxyz_from_matrix
from pose_core.hands import FusionOptions
from pose_core.synth.episode import SynthOptions, generate_episode
from pose_core.synth.observe import DetectionNoise, noisy_hand_observations, simulated_map
from schemas.tables import HANDS_WORLD
from udfs.fusion import fuse_hands
from udfs.guard import ERROR_KIND, ROW_KIND, guarded_pair
from udfs.hands import hand_rows
from udfs.multi_output import TABLE_COLUMN
from udfs.options import HandsOptions

logger = logging.getLogger(__name__)
PX_NOISE = 2.0  # 2-D keypoint noise, pixels (1 sigma)
SHAPE_NOISE_M = 0.004  # per-joint noise of the model's 3-D shape, metres (realistic level)
TRUTH = {"wearer_left": 0, "wearer_right": 1}


@pytest.fixture(scope="module")
def episode():
    return generate_episode(SynthOptions(num_frames=300, seed=0))


def posed_frames(ep, episode_id="ep0"):
    return pd.DataFrame(
        {
            "episode_id": episode_id,
            "frame_idx": np.arange(ep.num_frames),
            "ts_s": ep.ts_s,
            "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(ep.world_from_cam[:, :3, :3])),
            "world_from_cam_t_mu": list(ep.world_from_cam[:, :3, 3]),
        }
    )


def noisy_hands_cam(ep, rng, drop=0.1, flip=0.15, episode_id="ep0"):
    """`hands_cam` rows of noisy detections: 10 % dropouts, handedness flipped in 15 % of them."""
    camera = Camera(640, 480, ep.K[0, 0], ep.K[1, 1], ep.K[0, 2], ep.K[1, 2])
    found = noisy_hand_observations(ep, rng, DetectionNoise(PX_NOISE, SHAPE_NOISE_M, drop, flip))
    return hand_rows(episode_id, list(range(ep.num_frames)), found, camera, HandsOptions())


def test_fused_world_hands_match_ground_truth(episode):
    hands = noisy_hands_cam(episode, np.random.default_rng(0))
    out = fuse_hands(posed_frames(episode), hands, FusionOptions())
    assert list(out.columns) == HANDS_WORLD.columns
    assert not out.duplicated(["frame_idx", "identity"]).any()
    truth_h = out["identity"].map(TRUTH)
    assert truth_h.notna().mean() >= 0.98  # the wearer's two hands, sides from geometry, not the flips
    kp = np.stack(out["keypoints_world_m"].map(np.asarray)).reshape(-1, 21, 3)
    known = truth_h.notna().to_numpy()
    gt = episode.hands_world[out["frame_idx"].to_numpy()[known], truth_h[known].astype(int).to_numpy()]
    err = np.linalg.norm(kp[known] - gt, axis=-1).mean(axis=-1)
    observed = ~out["filled"].to_numpy()[known]
    filled = out["filled"].to_numpy()
    logger.info("fusion udf: %d rows, %d filled; world MPJPE observed %.1f mm, filled %.1f mm; switches %d",
                len(out), filled.sum(), 1e3 * err[observed].mean(), 1e3 * err[~observed].mean(),
                out["identity_switch"].sum())  # fmt: skip
    assert err[observed].mean() <= 0.020
    assert out["identity_switch"].sum() <= 6
    assert filled.sum() >= 10 and err[~observed].mean() <= 0.025
    assert out.loc[filled, "score"].isna().all() and (out.loc[filled, "depth_source"] == "gap_fill").all()
    assert (out.loc[~filled, "supporting_keypoints"] == 21).all()
    assert (out["scale_source"] == "none").all()
    # Every observed row comes from exactly one hands_cam row of that frame.
    pairs = out.loc[~filled, ["frame_idx", "hand_slot"]].astype(int)
    assert not pairs.duplicated().any()
    assert set(map(tuple, pairs.to_numpy())) <= set(map(tuple, hands[["frame_idx", "hand_slot"]].to_numpy()))


def test_scale_source_and_user_scale_are_recorded(episode):
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    frames = posed_frames(episode).assign(scale_source="stereo")
    assert (fuse_hands(frames, hands, FusionOptions())["scale_source"] == "stereo").all()
    shrunk = posed_frames(episode)
    shrunk["world_from_cam_t_mu"] = [t / 4.0 for t in shrunk["world_from_cam_t_mu"]]  # units of 25 cm
    user = fuse_hands(shrunk, hands, FusionOptions(user_metres_per_unit=4.0))
    metric = fuse_hands(posed_frames(episode), hands, FusionOptions())
    assert (user["scale_source"] == "user").all() and (user["metres_per_unit"] == 4.0).all()
    assert user["metres_per_unit_std"].isna().all()  # a user's value comes without a standard error
    np.testing.assert_allclose(
        np.stack(user["keypoints_world_m"].map(np.asarray)),
        np.stack(metric["keypoints_world_m"].map(np.asarray)),
        atol=1e-4,
    )


def _imu_csv(ep, path, rng):
    """The episode's IMU as a sidecar CSV (`udfs.media.sidecars` format), with noise and a bias."""
    accel = ep.imu.accel + rng.normal(0.0, 0.03, ep.imu.accel.shape) + np.array([0.1, -0.1, 0.05])
    gyro = ep.imu.gyro + rng.normal(0.0, 0.003, ep.imu.gyro.shape)
    rows = np.column_stack([ep.imu.ts_s, accel, gyro])
    np.savetxt(path, rows, fmt="%.9f", delimiter=",", header="t_s,ax,ay,az,gx,gy,gz", comments="")
    return str(path)


def test_imu_makes_map_units_metric(episode, tmp_path):
    """Poses in map units of 25 cm (noisy like tracking) + the IMU sidecar: scale_source imu, metric hands."""
    rng = np.random.default_rng(4)
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    metric = fuse_hands(posed_frames(episode), hands, FusionOptions())
    shrunk = posed_frames(episode).assign(imu_path=_imu_csv(episode, tmp_path / "ep0.imu.csv", rng))
    noisy = [t + rng.normal(0.0, 0.002, 3) for t in shrunk["world_from_cam_t_mu"]]  # 2 mm tracking noise
    shrunk["world_from_cam_t_mu"] = [t / 4.0 for t in noisy]
    out = fuse_hands(shrunk, hands, FusionOptions())
    assert (out["scale_source"] == "imu").all()
    scale = out["metres_per_unit"].iat[0]
    gravity = np.asarray(out["gravity_dir_world"].iat[0])
    logger.info("IMU scale through fusion: %.4f m/unit (truth 4, error %+.2f %%), gravity %s", scale,
                100 * (scale / 4.0 - 1.0), np.round(gravity, 4))  # fmt: skip
    assert scale == pytest.approx(4.0, rel=0.05) and (out["metres_per_unit"] == scale).all()
    rel_std = out["metres_per_unit_std"].iat[0] / scale
    assert 0.0 < rel_std <= ImuScaleOptions().max_rel_std and abs(scale / 4.0 - 1.0) < 3 * rel_std
    assert np.degrees(np.arccos(-gravity[2])) < 1.0  # the synthetic world is z up
    # Same hands as with metric poses: a 5 % scale error moves them ~6 cm (camera ~1.3 m from the origin).
    kp, kp_metric = (
        np.stack(o["keypoints_world_m"].map(np.asarray)).reshape(-1, 21, 3) for o in (out, metric)
    )
    assert len(kp) == len(kp_metric)
    assert np.median(np.linalg.norm(kp - kp_metric, axis=-1)) < 0.01
    assert metric["metres_per_unit"].isna().all() and metric["gravity_dir_world"].isna().all()
    off = fuse_hands(shrunk, hands, FusionOptions(imu_scale=ImuScaleOptions(enabled=False)))
    assert (off["scale_source"] == "none").all()


@pytest.mark.slow
def test_the_hands_on_the_table_make_a_monocular_map_metric(episode):
    """No IMU, no stereo: the map (units of 25 cm) and the wearer's hands on the table give the scale."""
    rng = np.random.default_rng(5)
    frames = map_rows(simulated_map(episode, 0.25, rng), episode.ts_s, "ep0")
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    out = fuse_hands(frames, hands, FusionOptions())
    scale, std = out["metres_per_unit"].iat[0], out["metres_per_unit_std"].iat[0]
    logger.info("hands scale through fusion: %.4f m/unit (truth 0.25, %+.2f %%), std %.4f", scale,
                100 * (scale / 0.25 - 1.0), std)  # fmt: skip
    assert (out["scale_source"] == "hands").all() and out["metres_per_unit"].nunique() == 1
    assert scale == pytest.approx(0.25, rel=0.05)
    assert std / scale == pytest.approx(0.07, abs=0.01)  # the hand-size prior's 7 % dominates
    # Camera path and hands in metres: the wrists where the metric poses put them.
    metric = fuse_hands(posed_frames(episode), hands, FusionOptions())
    kp, kp_metric = (
        np.stack(o["keypoints_world_m"].map(np.asarray)).reshape(-1, 21, 3) for o in (out, metric)
    )
    assert np.median(np.linalg.norm(kp - kp_metric, axis=-1)) < 0.03
    # A more trusted source wins; without the map's points there is no hands scale.
    imu_first = fuse_hands(frames.assign(scale_source="imu"), hands, FusionOptions())
    assert (imu_first["scale_source"] == "imu").all()
    no_map = fuse_hands(frames[frames[TABLE_COLUMN].isna()], hands, FusionOptions())
    assert (no_map["scale_source"] == "none").all() and no_map["metres_per_unit_std"].isna().all()


def test_no_poses_is_a_clear_episode_failure(episode):
    hands = noisy_hands_cam(episode, np.random.default_rng(2))
    frames = posed_frames(episode)
    frames["world_from_cam_q_wxyz"] = None
    guarded_fuse_hands = guarded_pair(partial(fuse_hands, opts=FusionOptions()), HANDS_WORLD.columns)
    out = guarded_fuse_hands(frames, hands)
    assert out["_row_kind"].tolist() == [ERROR_KIND]
    assert out["_error"].iat[0] == "EgolakeError: no camera poses for this episode's frames"
    ok = guarded_fuse_hands(posed_frames(episode), hands.iloc[:0])
    assert ok["_row_kind"].tolist() == ["done"]  # an episode without hands: no rows, no error
    assert (guarded_fuse_hands(posed_frames(episode), hands)["_row_kind"] == ROW_KIND).all()
