"""Stage export on local Spark + Delta, from `egolake demo` (the session's `demo_run`: the generated 5-s
clip through every stage): the demo's dataset loads in lerobot and its values equal the world tables it
came from; then, on a copy of the demo's output, a table-level copy of the demo episode as a second one (a
second pipeline episode would double the cost), exported by two executors; then versions, "nothing
changed", QA exclusions and rollback."""

from __future__ import annotations

import hashlib
import os
import signal

import numpy as np
import pytest

from tests.jobs.publish_driver import spawn
from tests.jobs.tables_util import copy_episode, copy_output
from tests.jobs.tables_util import table as _table
from tests.udfs.lerobot.lerobot_load import load_with_lerobot

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COPY_ID = "c0ffee0000000000"


@pytest.fixture(scope="module")
def pipeline_run(spark, demo_run, tmp_path_factory):
    """A copy of the demo's output with its episode plus a copy of it, exported again (v2, two episodes)."""
    from jobs.pipeline import run_pipeline

    src, cfg, _ = demo_run
    out = copy_output(src, tmp_path_factory.mktemp("export") / "out")
    copy_episode(spark, out, _table(spark, out, "videos")["episode_id"].iat[0], COPY_ID)
    summary = run_pipeline(spark, cfg, None, out, stages=["export"])
    return out, cfg, summary


def _dataset(out: str, version: str | None = None) -> str:
    from jobs.datasets import latest_version

    root = os.path.join(out, "datasets")
    return os.path.join(root, "hands", version or latest_version(root, "hands"))


def _file_hashes(folder: str) -> dict[str, str]:
    hashes = {}
    for base, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(base, f), "rb") as fh:
                hashes[os.path.relpath(os.path.join(base, f), folder)] = hashlib.sha256(fh.read()).hexdigest()
    return hashes


@pytest.fixture(scope="module")
def loaded(demo_run, tmp_path_factory):
    out, _, _ = demo_run
    return load_with_lerobot(_dataset(out, "v1"), tmp_path_factory.mktemp("load") / "frames.npz")


def test_the_demo_passes_qa_and_exports_with_a_metric_scale(spark, demo_run):
    from jobs.datasets import read_manifest

    out, _, summary = demo_run
    assert not summary.failed and summary.counts["export"]["ok"] == 1, summary.counts
    qa = _table(spark, out, "qa")
    assert qa["passed"].tolist() == [True], qa["reasons"].tolist()
    manifest = read_manifest(os.path.join(out, "datasets"), "hands", "v1")
    assert manifest["counts"]["episodes"] == 1 and manifest["exclusions"] == []
    assert manifest["episodes"][0]["scale_source"] == "imu"  # the 5-s clip gives the IMU enough motion


def test_the_demo_export_loads_in_lerobot_with_the_world_tables_values(spark, demo_run, loaded):
    from jobs.datasets import read_manifest

    out, cfg, _ = demo_run
    meta, arrays = loaded
    manifest = read_manifest(os.path.join(out, "datasets"), "hands", "v1")
    assert meta["num_episodes"] == 1 and meta["num_frames"] == manifest["counts"]["frames"]
    assert meta["fps"] == cfg.export.tensors.fps and len(arrays["value/index"]) == meta["num_frames"]
    np.testing.assert_array_equal(arrays["value/index"][:, 0], np.arange(meta["num_frames"]))
    hands_world = _table(spark, out, "hands_world")
    mpu = float(hands_world["metres_per_unit"].dropna().iat[0])
    assert mpu == pytest.approx(manifest["episodes"][0]["metres_per_unit"])
    hands = hands_world.set_index(["frame_idx", "identity"]).sort_index()
    poses = _table(spark, out, "camera_poses").set_index("frame_idx")
    checked = 0
    for i in range(meta["num_frames"]):  # every frame: the clip is short
        frame = int(arrays["value/source_frame_idx"][i, 0])
        state = arrays["value/observation.state"][i].reshape(2, 10)
        for slot, identity in enumerate(("wearer_left", "wearer_right")):
            present = (frame, identity) in hands.index
            assert (arrays["value/observation.present"][i, slot] > 0) == present, (frame, identity)
            if present:
                keypoints = np.asarray(hands.loc[(frame, identity), "keypoints_world_m"]).reshape(21, 3)
                np.testing.assert_allclose(state[slot, :3], keypoints[0], atol=1e-6)  # metres already
                checked += 1
        t = poses.loc[frame, "world_from_cam_t_mu"]
        assert (arrays["value/observation.present"][i, 2] > 0) == (t is not None)
        if t is not None:  # camera translation in metres: map units times the IMU's scale
            np.testing.assert_allclose(
                arrays["value/observation.camera_pose"][i, :3], mpu * np.asarray(t), atol=1e-5
            )
    assert checked > meta["num_frames"] // 2  # most frames have a hand to compare
    image = arrays["image/observation.images.ego"]
    assert image.shape[0] == meta["num_frames"] and 0.0 < image.mean() < 1.0


@pytest.mark.parametrize("embodiment", ["so100", "panda"])
def test_the_demo_ends_with_robot_datasets_that_lerobot_loads(spark, demo_run, embodiment, tmp_path):
    """`egolake demo` retargets to two robots from the installed robot models (no environment variable);
    each robot dataset loads with lerobot's default video backend, one frame per control step."""
    from jobs.datasets import read_manifest

    out, _, summary = demo_run
    name = f"hands-{embodiment}"
    assert summary.counts["retarget"]["ok"] == 1, summary.counts
    manifest = read_manifest(os.path.join(out, "datasets"), name, "v1")
    assert manifest["counts"]["episodes"] == 1, manifest["exclusions"]
    meta, arrays = load_with_lerobot(os.path.join(out, "datasets", name, "v1"), tmp_path / "frames.npz")
    assert meta["video_backend"] == "torchcodec"  # lerobot's default, not asked for
    assert meta["num_episodes"] == 1 and meta["num_frames"] == manifest["counts"]["frames"]
    rows = _table(spark, out, "robot_actions")
    rows = rows[rows["embodiment"] == embodiment]
    identities = sorted(set(rows["identity"]))
    assert meta["features"]["observation.present"]["shape"] == [len(identities)]
    assert meta["num_frames"] == len(rows) // len(identities)  # one dataset frame per control step
    present = arrays["value/observation.present"]
    assert present.sum() == rows["reachable"].sum()  # a followed hand is present where the robot reached it


def test_two_executors_wrote_the_episodes_in_parallel_without_clashes(pipeline_run):
    from jobs.datasets import read_manifest

    out, _, summary = pipeline_run
    manifest = read_manifest(os.path.join(out, "datasets"), "hands", "v2")
    assert summary.counts["export"]["ok"] == manifest["counts"]["episodes"] == 2
    workers = {e["worker"] for e in manifest["episodes"]}
    assert len(workers) == 2  # local[2]: one Python worker per episode
    files = sorted(_file_hashes(_dataset(out, "v2")))
    per_episode = [f for f in files if f.startswith(("data/", "videos/"))]
    assert per_episode == sorted(
        [
            "data/chunk-000/file-000.parquet",
            "data/chunk-000/file-001.parquet",
            "videos/observation.images.ego/chunk-000/file-000.mp4",
            "videos/observation.images.ego/chunk-000/file-001.mp4",
        ]
    )
    assert not os.path.exists(os.path.join(out, "datasets", "hands", "_staging"))


def test_unchanged_export_makes_no_version_then_qa_exclusion_and_rollback(spark, pipeline_run):
    import pandas as pd

    from jobs.cli import main as cli_main
    from jobs.datasets import latest_version, read_manifest, versions
    from jobs.pipeline import run_pipeline
    from jobs.tables import Layout, Lineage, write
    from schemas.tables import QA

    out, cfg, _ = pipeline_run
    root = os.path.join(out, "datasets")
    v2 = _file_hashes(_dataset(out, "v2"))
    assert spawn(root, "killed", "x", "staged").wait() == -signal.SIGKILL  # an export killed mid-publish
    assert sorted(os.listdir(os.path.join(root, "hands", "_staging"))) == ["killed", "killed.lock"]
    again = run_pipeline(spark, cfg, None, out, stages=["export"])
    assert versions(root, "hands") == ["v1", "v2"] and again.counts["export"]["skipped"] == 2
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))  # removed, though nothing changed

    episodes = sorted(e["episode_id"] for e in read_manifest(root, "hands", "v2")["episodes"])
    qa = pd.DataFrame(dict.fromkeys(QA.columns), index=[0, 1]).assign(
        episode_id=episodes,
        passed=[True, False],
        flags=[[], ["hand_coverage"]],
        reasons=[[], ["hands in 10% of frames"]],
    )
    write(spark.createDataFrame(qa, QA.spark), Layout(out), QA, episodes, Lineage("test", "1", "h"))
    run_pipeline(spark, cfg, None, out, stages=["export"])
    v3 = read_manifest(root, "hands")
    assert v3["version"] == "v3" and [e["episode_id"] for e in v3["episodes"]] == episodes[:1]
    assert v3["exclusions"] == [{"episode_id": episodes[1], "reason": "qa failed: hands in 10% of frames"}]

    assert cli_main(["datasets", "rollback", out, "hands"]) == 0
    assert latest_version(root, "hands") == "v2"
    assert _file_hashes(_dataset(out, "v2")) == v2  # the old version is byte-identical
    assert _file_hashes(_dataset(out)) == v2  # and `latest` serves it


def test_an_episode_whose_files_fail_is_left_out_with_its_reason(spark, pipeline_run, tmp_path):
    """Its unit fails after writing its data file (the video is short); the export is redone without it:
    nothing of it is published, indices stay contiguous, the manifest and `runs` say why."""
    from jobs.datasets import read_manifest
    from jobs.pipeline import run_pipeline
    from jobs.stage import latest_runs
    from jobs.tables import Layout
    from udfs.media.decode import decode_frames
    from udfs.media.encode import write_video

    out, cfg, _ = pipeline_run
    videos = _table(spark, out, "videos")
    demo = videos[videos["episode_id"] != COPY_ID].iloc[0]
    short = tmp_path / "short.mp4"
    write_video(short, decode_frames(demo["source_path"], 0, 30).frames, 30)
    broken = "bad0000000000000"
    copy_episode(spark, out, demo["episode_id"], broken, {"videos": {"source_path": str(short)}})
    summary = run_pipeline(spark, cfg, None, out, stages=["export"])

    manifest = read_manifest(os.path.join(out, "datasets"), "hands")
    assert summary.counts["export"]["failed"] == 1
    assert broken not in [e["episode_id"] for e in manifest["episodes"]]
    (why,) = [e["reason"] for e in manifest["exclusions"] if e["episode_id"] == broken]
    assert "decoded 30 of" in why
    latest = latest_runs(spark, Layout(out))
    failed = latest[(latest["episode_id"] == broken) & (latest["stage"] == "export")]
    assert list(failed["status"]) == ["failed"] and "decoded 30 of" in failed["error"].iat[0]
    n = manifest["counts"]["episodes"]
    files = sorted(f for f in _file_hashes(_dataset(out)) if f.startswith(("data/", "videos/")))
    assert files == sorted(
        [f"data/chunk-000/file-{i:03d}.parquet" for i in range(n)]
        + [f"videos/observation.images.ego/chunk-000/file-{i:03d}.mp4" for i in range(n)]
    )
