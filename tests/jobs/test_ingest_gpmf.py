"""Ingest on local Spark: a GoPro clip gets its embedded IMU in `videos`; one whose GPMF track is
destroyed is still an episode, with the reason in `imu_warning`."""

from __future__ import annotations

import shutil

import pytest

from tests.jobs.tables_util import table
from tests.udfs.media.gpmf_files import CLIPS, damaged_copy, payload_positions

pytestmark = pytest.mark.spark


def test_gopro_clips_ingest_with_their_imu_or_a_warning(spark, shared_data, tmp_path):
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline

    inputs = tmp_path / "in"
    inputs.mkdir()
    karma = shutil.copyfile(CLIPS["karma"], inputs / "karma.mp4")
    n = len(payload_positions(CLIPS["max"]))
    walk = damaged_copy(CLIPS["max"], inputs / "walk.mp4", list(range(n)), 0, b"XXXX")
    out = str(tmp_path / "out")
    summary = run_pipeline(spark, load_config([], ["ingest.probe.decode_check=sampled"]), str(inputs), out,
                           until_stage="ingest")  # fmt: skip
    assert summary.counts["ingest"]["ok"] == 2
    assert table(spark, out, "quarantine").empty
    videos = table(spark, out, "videos").set_index("source_path")
    fly = videos.loc[str(karma)]
    assert (fly["imu_path"], fly["imu_source"], fly["imu_warning"]) == (str(karma), "gpmf", None)
    lost = videos.loc[str(walk)]
    assert lost["imu_path"] is None and lost["imu_source"] is None
    assert lost["imu_warning"].startswith(
        f"GPMF IMU not attached: {walk}: no usable IMU in {n} GPMF payloads"
    )
