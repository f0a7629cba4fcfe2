"""Stage export on local Spark + Delta: a real pipeline run over a synthetic episode, plus a table-level
copy of it as a second episode (a second pipeline episode would double the module's cost), exported by
two executors, loaded by lerobot and checked against `hands_world`; then versions, "nothing changed",
QA exclusions and rollback. One pipeline run is shared by the module (module-scoped fixture)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from tests.jobs.tables_util import table as _table
from tests.udfs.lerobot_load import load_with_lerobot

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N_FRAMES = 45
SEED = 1  # its wearer_left hand is identified by fusion in ~40 % of the frames (seed 0: none)
STAGES = ["ingest", "priors", "hands", "tracking", "ba", "completion", "fusion"]
COPY_ID = "c0ffee0000000000"


def _copy_episode(spark, out: str, episode: str) -> None:
    """Second episode: the first one's upstream rows and runs under another id (same video)."""
    from pyspark.sql import functions as F

    from jobs.tables import Layout, Lineage, append, write
    from schemas.tables import CAMERA_POSES, FRAMES, HANDS_WORLD, RUNS, VIDEOS

    layout = Layout(out)
    for schema in (VIDEOS, FRAMES, CAMERA_POSES, HANDS_WORLD):
        rows = _table(spark, out, schema.name)
        rows = rows[rows["episode_id"] == episode].assign(episode_id=COPY_ID)
        write(
            spark.createDataFrame(rows[schema.columns], schema.spark),
            layout,
            schema,
            [COPY_ID],
            Lineage(rows["run_id"].iat[0], rows["stage_version"].iat[0], rows["config_hash"].iat[0]),
        )
    runs = spark.read.format("delta").load(layout.table("runs")).where(F.col("episode_id") == episode)
    append(runs.withColumn("episode_id", F.lit(COPY_ID)), layout, RUNS)


@pytest.fixture(scope="module")
def pipeline_run(spark, tmp_path_factory):
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline
    from jobs.sample import SampleOptions, write_sample

    sample = tmp_path_factory.mktemp("sample")
    write_sample(sample, SampleOptions(frames=N_FRAMES, seed=SEED))
    out = str(tmp_path_factory.mktemp("out"))
    cfg = load_config([], ["export.tensors.fps=15"])
    run_pipeline(spark, cfg, str(sample / "videos"), out, stages=STAGES)
    _copy_episode(spark, out, _table(spark, out, "videos")["episode_id"].iat[0])
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
def loaded(pipeline_run, tmp_path_factory):
    out, _, _ = pipeline_run
    return load_with_lerobot(_dataset(out, "v1"), tmp_path_factory.mktemp("load") / "frames.npz")


def test_export_of_a_pipeline_run_loads_in_lerobot_with_hands_world_values(spark, pipeline_run, loaded):
    from jobs.datasets import read_manifest

    out, _, summary = pipeline_run
    meta, arrays = loaded
    manifest = read_manifest(os.path.join(out, "datasets"), "hands", "v1")
    assert summary.counts["export"]["ok"] == manifest["counts"]["episodes"] == meta["num_episodes"] == 2
    assert meta["num_frames"] == manifest["counts"]["frames"] == len(arrays["value/index"])
    hands = _table(spark, out, "hands_world").set_index(["episode_id", "frame_idx", "identity"]).sort_index()
    poses = _table(spark, out, "camera_poses").set_index(["episode_id", "frame_idx"])
    by_index = {e["episode_index"]: e["episode_id"] for e in manifest["episodes"]}
    checked = 0
    for i in range(meta["num_frames"]):
        episode = by_index[int(arrays["value/episode_index"][i, 0])]
        frame = int(arrays["value/source_frame_idx"][i, 0])
        state = arrays["value/observation.state"][i].reshape(2, 10)
        for slot, identity in enumerate(("wearer_left", "wearer_right")):
            key = (episode, frame, identity)
            assert (arrays["value/observation.present"][i, slot] > 0) == (key in hands.index), key
            if key in hands.index:
                keypoints = np.asarray(hands.loc[key, "keypoints_world_m"]).reshape(21, 3)
                np.testing.assert_allclose(state[slot, :3], keypoints[0], atol=1e-6)
                checked += 1
        t = poses.loc[(episode, frame), "world_from_cam_t_m"]
        assert (arrays["value/observation.present"][i, 2] > 0) == (t is not None)
        if t is not None:
            np.testing.assert_allclose(
                arrays["value/observation.camera_pose"][i, :3], np.asarray(t), atol=1e-5
            )
    assert checked > meta["num_frames"] // 2  # most frames have a hand to compare


def test_two_executors_wrote_the_episodes_in_parallel_without_clashes(pipeline_run):
    from jobs.datasets import read_manifest

    out, _, _ = pipeline_run
    manifest = read_manifest(os.path.join(out, "datasets"), "hands", "v1")
    workers = {e["worker"] for e in manifest["episodes"]}
    assert len(workers) == 2  # local[2]: one Python worker per episode
    files = sorted(_file_hashes(_dataset(out, "v1")))
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
    v1 = _file_hashes(_dataset(out, "v1"))
    again = run_pipeline(spark, cfg, None, out, stages=["export"])
    assert versions(root, "hands") == ["v1"] and again.counts["export"]["skipped"] == 2

    episodes = sorted(e["episode_id"] for e in read_manifest(root, "hands", "v1")["episodes"])
    qa = pd.DataFrame(dict.fromkeys(QA.columns), index=[0, 1]).assign(
        episode_id=episodes,
        passed=[True, False],
        flags=[[], ["hand_coverage"]],
        reasons=[[], ["hands in 10% of frames"]],
    )
    write(spark.createDataFrame(qa, QA.spark), Layout(out), QA, episodes, Lineage("test", "1", "h"))
    run_pipeline(spark, cfg, None, out, stages=["export"])
    v2 = read_manifest(root, "hands")
    assert v2["version"] == "v2" and [e["episode_id"] for e in v2["episodes"]] == episodes[:1]
    assert v2["exclusions"] == [{"episode_id": episodes[1], "reason": "qa failed: hands in 10% of frames"}]

    assert cli_main(["datasets", "rollback", out, "hands"]) == 0
    assert latest_version(root, "hands") == "v1"
    assert _file_hashes(_dataset(out, "v1")) == v1  # the old version is byte-identical
    assert _file_hashes(_dataset(out)) == v1  # and `latest` serves it
