"""Stages hands and fusion on local Spark + Delta, on the first 3 s of the real hand video.

The clip (a webcam, one right hand in view in every frame) is cut from the shared data into a temp
folder; one whole-pipeline run over it is shared by the tests of this module.
"""

from __future__ import annotations

import logging
import time

import cv2
import numpy as np
import pandas as pd
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLIP_FRAMES = 90
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def clip(shared_data, tmp_path_factory):
    """The first CLIP_FRAMES frames of the real video at 640x360, as INPUT/clip.mp4."""
    pytest.importorskip("ai_edge_litert")
    from conf.models import model_path
    from udfs.media.encode import VideoWriter

    try:
        model_path("hand_landmark_full.tflite")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    folder = tmp_path_factory.mktemp("clip")
    cap = cv2.VideoCapture(str(shared_data / "hands_dexretargeting" / "human_hand_video.mp4"))
    with VideoWriter(folder / "clip.mp4", 30.0) as writer:
        for _ in range(CLIP_FRAMES):
            ok, frame = cap.read()
            if not ok:
                raise RuntimeError("the real video is shorter than expected")
            writer.write(np.ascontiguousarray(cv2.resize(frame, (640, 360))[:, :, ::-1]))
    cap.release()
    return folder


@pytest.fixture(scope="module")
def pipeline_run(spark, clip, tmp_path_factory):
    """The pipeline up to hands over the clip, 3 shards of 32 frames."""
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline

    out = str(tmp_path_factory.mktemp("out"))
    cfg = load_config([], ["ingest.shard_frames=32"])
    start = time.perf_counter()
    summary = run_pipeline(spark, cfg, str(clip), out, until_stage="hands")
    logger.info("ingest..hands on %d frames: %.0f s", CLIP_FRAMES, time.perf_counter() - start)
    return out, cfg, summary


@pytest.fixture(scope="module")
def fused(spark, pipeline_run):
    """Static-webcam camera poses (small rotations, a 2 cm sway) written as camera_poses, then fusion."""
    from jobs import fusion
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage
    from pose_core.geometry.rigid3 import quat_wxyz_from_matrix, so3_exp

    out, cfg, _ = pipeline_run
    frames = _table(spark, out, "frames").sort_values("frame_idx")
    phase = 2 * np.pi * frames["frame_idx"].to_numpy() / CLIP_FRAMES
    rot = so3_exp(0.05 * np.stack([np.sin(phase), np.cos(phase), 0 * phase], axis=1))
    poses = pd.DataFrame({
        "episode_id": frames["episode_id"], "frame_idx": frames["frame_idx"],
        "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(rot)),
        "world_from_cam_t_mu": list(0.02 * np.stack([np.sin(phase), 0 * phase, np.cos(phase)], axis=1)),
    })  # fmt: skip
    spark.createDataFrame(poses).write.format("delta").save(Layout(out).table("camera_poses"))
    ctx = StageContext(spark, cfg, Layout(out), "run-fusion")
    lineage = Lineage("run-fusion", fusion.STAGE.version, "h")
    outcomes = [fusion.process(ctx, lineage, list(frames["episode_id"].unique())) for _ in range(2)]
    return out, poses, outcomes


def _table(spark, out, name) -> pd.DataFrame:
    from jobs.tables import Layout, read
    from schemas import table

    return read(spark, Layout(out), table(name)).toPandas()


def _stack(column: pd.Series) -> np.ndarray:
    return np.stack(column.map(np.asarray))


def test_hands_cam_covers_the_frames_that_show_a_hand(spark, pipeline_run):
    out, _, summary = pipeline_run
    assert summary.counts["hands"] == {"ok": 1, "failed": 0, "skipped": 0}
    frames = _table(spark, out, "frames")
    hands = _table(spark, out, "hands_cam")
    assert len(frames) == CLIP_FRAMES
    coverage = hands["frame_idx"].nunique() / len(frames)
    logger.info("hands_cam: %d rows, hand in %.1f %% of %d frames, fit valid %.1f %%", len(hands),
                100 * coverage, len(frames), 100 * hands["fit_valid"].mean())  # fmt: skip
    assert coverage >= 0.95
    assert set(hands["frame_idx"]) <= set(frames["frame_idx"])
    assert not hands.duplicated(["frame_idx", "hand_slot"]).any()
    assert (hands["run_id"] == summary.run_id).all() and hands["config_hash"].nunique() == 1
    assert hands["keypoints_px"].map(len).eq(42).all() and hands["keypoints_cam_m"].map(len).eq(63).all()
    assert hands["fit_valid"].mean() > 0.9


def test_hands_world_agrees_with_camera_poses_and_hands_cam(spark, fused):
    from pose_core.geometry.rigid3 import matrix_from_quat_wxyz

    out, poses, outcomes = fused
    # Two runs, same rows: re-running replaces them.
    assert [(o.status, o.rows) for run in outcomes for o in run] == [("ok", CLIP_FRAMES), ("ok", CLIP_FRAMES)]
    world = _table(spark, out, "hands_world")
    assert len(world) == CLIP_FRAMES
    valid = _table(spark, out, "hands_cam").query("fit_valid")
    poses = poses.set_index("frame_idx")
    logger.info("hands_world: %d rows (%d filled), identities %s", len(world), world["filled"].sum(),
                world["identity"].value_counts().to_dict())  # fmt: skip
    assert not world.duplicated(["frame_idx", "identity"]).any()
    assert (world["scale_source"] == "none").all() and (world["identity"] == "wearer_right").mean() > 0.9
    # One hand in view: each valid fit becomes one observed row of one identity.
    assert (~world["filled"]).sum() == valid["frame_idx"].nunique()
    # Back in the camera frame, world keypoints are the (size-held, smoothed) fits of hands_cam.
    merged = world[~world["filled"]].merge(valid, on=["frame_idx", "hand_slot"])
    rot = matrix_from_quat_wxyz(_stack(poses.loc[merged["frame_idx"], "world_from_cam_q_wxyz"]))
    trans = _stack(poses.loc[merged["frame_idx"], "world_from_cam_t_mu"])
    wrist_world = _stack(merged["keypoints_world_m"])[:, :3]
    wrist_in_cam = np.einsum("nji,nj->ni", rot, wrist_world - trans)
    wrist_cam = _stack(merged["keypoints_cam_m"])[:, :3]
    assert np.median(np.linalg.norm(wrist_in_cam - wrist_cam, axis=1)) < 0.03


def test_rerunning_hands_keeps_row_counts(spark, pipeline_run):
    from jobs.pipeline import run_pipeline

    out, cfg, _ = pipeline_run
    before = len(_table(spark, out, "hands_cam"))
    again = run_pipeline(spark, cfg, None, out, stages=["hands"])
    assert again.counts["hands"] == {"ok": 1, "failed": 0, "skipped": 0}
    assert len(_table(spark, out, "hands_cam")) == before


def test_fusion_without_camera_poses_fails_clearly(spark, pipeline_run, tmp_path):
    from jobs import fusion
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage

    _, cfg, _ = pipeline_run
    ctx = StageContext(spark, cfg, Layout(str(tmp_path)), "run-no-poses")
    outcomes = fusion.process(ctx, Lineage("run-no-poses", "1", "h"), ["e1"])
    assert [(o.episode_id, o.status, o.error) for o in outcomes] == [("e1", "failed", fusion.NO_POSES)]
