"""Camera-pose stages on local Spark: a synthetic clip in 3 shards -> a pose for every frame.

One pipeline run (ingest .. completion) is shared by the tests of this module. The clip is a stereo
pair (the camera stages use the left stream only): fusion's metric scale is tested from the IMU
(stereo off) and from the stereo pair.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.jobs.tables_util import table as _table

pytestmark = [pytest.mark.spark]
logger = logging.getLogger(__name__)

FRAMES, SHARD_FRAMES = 240, 96
CAMERA_TABLES = (
    "features",
    "tracks",
    "cameras",
    "keyframes",
    "map_points",
    "keyframe_poses",
    "ba_points",
    "ba_cameras",
    "camera_poses",
)


@pytest.fixture(scope="module")
def camera_run(spark, tmp_path_factory):
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline
    from jobs.sample import SampleOptions, write_sample

    root = tmp_path_factory.mktemp("camera_sample")
    paths = write_sample(root, SampleOptions(frames=FRAMES, stereo=True))
    out = str(tmp_path_factory.mktemp("camera_out"))
    cfg = load_config([], [f"ingest.shard_frames={SHARD_FRAMES}"])
    t0 = time.monotonic()
    summary = run_pipeline(spark, cfg, str(root / "videos"), out, until_stage="completion")
    return out, cfg, summary, paths, time.monotonic() - t0


def test_every_frame_has_a_camera_pose_close_to_ground_truth(spark, camera_run):
    from pose_core.camera_poses.evaluation import evaluate_trajectory
    from udfs.camera_tables import world_from_cam_from_columns

    out, _, summary, paths, _ = camera_run
    for stage in ("tracking", "ba", "completion"):
        assert summary.counts[stage] == {"ok": 1, "failed": 0, "skipped": 0}, summary.counts
    shards = _table(spark, out, "shards")
    assert len(shards) >= 3
    poses = _table(spark, out, "camera_poses").sort_values("frame_idx")
    assert poses["frame_idx"].tolist() == list(range(FRAMES))
    est = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    assert np.isfinite(est).all()
    gt = np.load(paths["world_from_cam"])
    err = evaluate_trajectory(est, gt)
    # measured: see the report (3 shards of 96 frames, ids linked across 2 boundaries)
    assert err.ate_pct_of_path <= 1.0, err
    assert (poses["pose_quality"].isin(["keyframe", "motion_only"])).mean() >= 0.9
    cams = _table(spark, out, "cameras")
    assert cams[["fx", "cx", "intrinsics_source"]].values.tolist() == [[500.0, 319.5, "sidecar"]]
    ba_cams = _table(spark, out, "ba_cameras")[["fx", "intrinsics_source", "focal_status"]]
    assert ba_cams.values.tolist() == [[500.0, "sidecar", "fixed"]]  # calibrated: BA leaves the focal alone
    feats = _table(spark, out, "features")
    frames = _table(spark, out, "frames")
    assert len(frames) == FRAMES and feats["owned"].sum() == FRAMES
    assert len(feats) > FRAMES  # overlap frames stored for linking


def test_rerunning_camera_stages_leaves_row_counts_unchanged(spark, camera_run):
    from jobs.pipeline import run_pipeline

    out, cfg, _, paths, _ = camera_run
    before = {name: len(_table(spark, out, name)) for name in CAMERA_TABLES}
    assert all(before.values()), before
    summary = run_pipeline(spark, cfg, None, out, stages=["tracking", "ba", "completion"])
    assert summary.counts["completion"]["ok"] == 1
    assert {name: len(_table(spark, out, name)) for name in CAMERA_TABLES} == before


def _fuse_tracked_poses(spark, camera_run, cfg, run_id):
    """Fusion over the tracked poses with noisy ground-truth `hands_cam` (the scale, not the estimator,
    is under test). Returns (hands_world rows, Sim(3) truth in metres per map unit, estimated and true
    poses `(F, 4, 4)`, measured frames `(F,)`)."""
    from jobs import fusion
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage, write
    from pose_core.camera_poses.evaluation import evaluate_trajectory
    from schemas.tables import HANDS_CAM
    from tests.udfs.test_hands_fusion import noisy_hands_cam
    from udfs.camera_tables import world_from_cam_from_columns
    from udfs.fusion import MEASURED_QUALITIES

    out, _, _, paths, _ = camera_run
    poses = _table(spark, out, "camera_poses").sort_values("frame_idx")
    episode_id = poses["episode_id"].iat[0]
    measured = poses["pose_quality"].isin(MEASURED_QUALITIES).to_numpy()
    est = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    gt = np.load(paths["world_from_cam"])
    truth = evaluate_trajectory(est[measured], gt[measured]).scale  # metres per map unit, Sim(3) fit
    # The sample's ground truth as the fields `noisy_hands_cam` reads (regenerating it would cost more).
    truth_files = {
        k: np.load(paths[k]) for k in ("world_from_cam", "hands_world", "hands_px", "hand_visible")
    }
    k_px = np.array([[500.0, 0.0, 319.5], [0.0, 500.0, 239.5], [0.0, 0.0, 1.0]])
    episode = SimpleNamespace(num_frames=FRAMES, K=k_px, **truth_files)
    hands = noisy_hands_cam(episode, np.random.default_rng(0), episode_id=episode_id)
    layout, lineage = Layout(out), Lineage(run_id, fusion.STAGE.version, "h")
    write(spark.createDataFrame(hands), layout, HANDS_CAM, [episode_id], lineage)
    [outcome] = fusion.process(StageContext(spark, cfg, layout, run_id), lineage, [episode_id])
    assert outcome.status == "ok", outcome
    return _table(spark, out, "hands_world"), truth, est, gt, measured


def test_fusion_makes_the_tracked_trajectory_metric_with_the_imu(spark, camera_run):
    """Fusion over the tracked poses + the sample's IMU sidecar (stereo off): scale_source imu, within 5 %.

    Runs after the re-run test, whose tracking masks features with hands_cam's boxes.
    """
    from dataclasses import replace

    from pose_core.camera_poses.stereo import StereoScaleOptions
    from pose_core.geometry.rigid3 import nearest_rotation

    cfg = camera_run[1]
    mono = replace(cfg, fusion=replace(cfg.fusion, stereo_scale=StereoScaleOptions(enabled=False)))
    world, truth, est, gt, measured = _fuse_tracked_poses(spark, camera_run, mono, "run-imu")
    assert (world["scale_source"] == "imu").all() and world["metres_per_unit"].nunique() == 1
    scale = world["metres_per_unit"].iat[0]
    # Gravity in the tracked world, compared in the ground-truth world (z up) through the best rotation.
    gt_from_est = nearest_rotation(np.einsum("fij,fkj->ik", gt[measured, :3, :3], est[measured, :3, :3]))
    gravity = gt_from_est @ np.asarray(world["gravity_dir_world"].iat[0])
    gravity_err_deg = np.degrees(np.arccos(np.clip(-gravity[2], -1.0, 1.0)))
    logger.info("IMU scale of the tracked poses: %.5f m/unit, truth %.5f (%+.2f %%); gravity off %.2f deg; "
                "%d of %d frames measured", scale, truth, 100 * (scale / truth - 1), gravity_err_deg,
                measured.sum(), FRAMES)  # fmt: skip
    assert scale == pytest.approx(truth, rel=0.05)
    assert gravity_err_deg < 2.0


def test_fusion_makes_the_tracked_trajectory_metric_with_the_hands(spark, camera_run):
    """Stereo and IMU off: the hands resting on the tracked map give the scale (issue 21), within 5 %.

    The stage stacks the episode's keyframe_poses and ba_points under its posed frames; the map and
    poses are the tracker's, the hands the sample's truth seen by a noisy estimator.
    """
    from dataclasses import replace

    from pose_core.camera_poses.scale import ImuScaleOptions
    from pose_core.camera_poses.stereo import StereoScaleOptions

    cfg = camera_run[1]
    off = replace(
        cfg.fusion, stereo_scale=StereoScaleOptions(enabled=False), imu_scale=ImuScaleOptions(enabled=False)
    )
    world, truth, _, _, _ = _fuse_tracked_poses(spark, camera_run, replace(cfg, fusion=off), "run-hands")
    assert (world["scale_source"] == "hands").all() and world["metres_per_unit"].nunique() == 1
    scale, std = world["metres_per_unit"].iat[0], world["metres_per_unit_std"].iat[0]
    logger.info("hands scale of the tracked poses: %.5f m/unit +- %.5f, truth %.5f (%+.2f %%)", scale, std,
                truth, 100 * (scale / truth - 1))  # fmt: skip
    assert scale == pytest.approx(truth, rel=0.05) and abs(scale - truth) <= 1.96 * std


def test_fusion_prefers_the_stereo_scale(spark, camera_run):
    """Fusion over the tracked poses of the stereo sample (IMU sidecar too): scale_source stereo, within 3 %.

    The executor decodes both streams at up to 12 keyframes and compares the stereo depth of their
    BA points with the map depth.
    """
    world, truth, _, _, measured = _fuse_tracked_poses(spark, camera_run, camera_run[1], "run-stereo")
    assert (world["scale_source"] == "stereo").all() and world["metres_per_unit"].nunique() == 1
    scale = world["metres_per_unit"].iat[0]
    logger.info("stereo scale of the tracked poses: %.5f m/unit, truth %.5f (%+.2f %%); %d of %d frames "
                "measured", scale, truth, 100 * (scale / truth - 1), measured.sum(), FRAMES)  # fmt: skip
    assert scale == pytest.approx(truth, rel=0.03)
