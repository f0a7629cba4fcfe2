"""The fusion udf's stereo scale on pandas frames: a written stereo sample (videos + calibration),
keyframes and points of a ground-truth map in map units of `MPU` metres stacked under the posed frames."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pandas as pd
import pytest

from jobs.sample import SampleOptions, write_sample
from pose_core.geometry.rigid3 import quat_wxyz_from_matrix
from pose_core.hands import FusionOptions
from pose_core.synth import generate_episode
from schemas.tables import BA_POINTS, HANDS_WORLD, KEYFRAME_POSES
from tests.pose_core.camera_poses.test_stereo import keyframe_map
from tests.udfs.test_hands_fusion import noisy_hands_cam
from udfs.fusion import fuse_hands
from udfs.guard import ERROR_KIND, guarded_pair
from udfs.ingest import calibration_to_json
from udfs.media.sidecars import read_calibration
from udfs.multi_output import TABLE_COLUMN

logger = logging.getLogger(__name__)

MPU = 0.37  # true metres per map unit
SAMPLE = SampleOptions(frames=30, stereo=True, seed=0)
KEYFRAMES = range(0, 30, 5)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """(paths of the written sample, its episode, posed frames in map units, stacked stereo rows)."""
    paths = write_sample(tmp_path_factory.mktemp("stereo_sample"), SAMPLE)
    episode = generate_episode(SAMPLE.synth_options())
    world_from_cam = episode.world_from_cam.copy()
    world_from_cam[:, :3, 3] /= MPU
    posed = pd.DataFrame(
        {
            "episode_id": "ep0",
            "frame_idx": np.arange(episode.num_frames),
            "ts_s": episode.ts_s,
            "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(world_from_cam[:, :3, :3])),
            "world_from_cam_t_mu": list(world_from_cam[:, :3, 3]),
        }
    )
    keyframes, points = [], []
    for i, (_, pose, xy, x_world) in zip(
        KEYFRAMES, keyframe_map(episode, KEYFRAMES, np.random.default_rng(0), MPU), strict=True
    ):
        first = sum(len(p) for p in points)
        points.append(x_world)
        keyframes.append(
            {
                "episode_id": "ep0",
                "frame_idx": i,
                "world_from_cam_q_wxyz": quat_wxyz_from_matrix(pose[:3, :3]).tolist(),
                "world_from_cam_t_mu": pose[:3, 3].tolist(),
                "obs_point_idx": list(range(first, first + len(xy))),
                "obs_xy": xy.ravel().tolist(),
                "source_path": paths["video"],
                "stereo_partner_path": paths["video_right"],
                "calibration_json": calibration_to_json(read_calibration(paths["calib"])),
                TABLE_COLUMN: KEYFRAME_POSES.name,
            }
        )
    x_world = np.concatenate(points)
    ba_points = pd.DataFrame(
        {
            "episode_id": "ep0",
            "point_idx": np.arange(len(x_world)),
            "x_in_world_mu": list(x_world),
            TABLE_COLUMN: BA_POINTS.name,
        }
    )
    stereo = pd.concat([pd.DataFrame(keyframes), ba_points], ignore_index=True)
    return paths, episode, posed, stereo


def test_stereo_scale_is_chosen_and_close_to_the_truth(sample):
    paths, episode, posed, stereo = sample
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    frames = pd.concat([posed.assign(imu_path=paths["imu"]), stereo], ignore_index=True)
    out = fuse_hands(frames, hands, FusionOptions())
    assert (out["scale_source"] == "stereo").all() and out["metres_per_unit"].nunique() == 1
    scale = out["metres_per_unit"].iat[0]
    logger.info("stereo scale through the fusion udf (H.264 video): %.5f m/unit, truth %.5f (%+.2f %%)",
                scale, MPU, 100 * (scale / MPU - 1))  # fmt: skip
    assert scale == pytest.approx(MPU, rel=0.02)
    assert out["frame_idx"].max() < episode.num_frames  # stacked rows are not frames


def test_without_a_baseline_the_next_source_is_used(sample):
    paths, episode, posed, stereo = sample
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    no_baseline = stereo.copy()
    rows = no_baseline[TABLE_COLUMN] == KEYFRAME_POSES.name
    no_baseline.loc[rows, "calibration_json"] = None
    frames = pd.concat([posed.assign(scale_source="user"), no_baseline], ignore_index=True)
    out = fuse_hands(frames, hands, FusionOptions())
    assert (out["scale_source"] == "user").all()


def test_a_missing_right_stream_fails_the_episode_naming_the_file(sample, tmp_path):
    _, episode, posed, stereo = sample
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    missing = str(tmp_path / "gone.right.mp4")
    broken = stereo.assign(stereo_partner_path=missing)
    fuse = guarded_pair(partial(fuse_hands, opts=FusionOptions()), HANDS_WORLD.columns)
    out = fuse(pd.concat([posed, broken], ignore_index=True), hands)
    assert out["_row_kind"].tolist() == [ERROR_KIND]
    assert out["_error"].iat[0].startswith("InputError") and missing in out["_error"].iat[0]
