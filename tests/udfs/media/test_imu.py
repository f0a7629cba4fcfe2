"""One IMU path: a GoPro clip's embedded IMU and the same IMU as a sidecar give the same arrays and the
same fusion result; ingest attaches the embedded track, a sidecar wins, a damaged track is a warning."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.integrate import cumulative_trapezoid

from pose_core.errors import MetadataError
from pose_core.geometry.rigid3 import quat_wxyz_from_matrix, so3_exp
from pose_core.hands import EpisodeFrames, FusionOptions
from tests.udfs.media.gpmf_files import CLIPS, damaged_copy, frame_times, payload_positions
from udfs.fusion import episode_imu_scale
from udfs.ingest import probe_row
from udfs.media.gpmf_imu import imu_rows
from udfs.media.imu import attach_imu, read_embedded_imu, read_episode_imu
from udfs.media.inputs import InputItem
from udfs.media.sidecars import Sidecars, read_imu, write_imu
from udfs.options import ProbeOptions

# Ingest tests check the IMU, not the video: counting frames by demuxing is enough.
FAST_PROBE = ProbeOptions(decode_check="sampled", sample_frames=2)
METRES_PER_UNIT = 0.5


@pytest.fixture(scope="module")
def karma_rows(shared_data: Path) -> np.ndarray:
    imu = read_embedded_imu(str(CLIPS["karma"]))
    assert imu is not None
    return imu_rows(imu)


def test_sidecar_round_trip_gives_the_same_arrays(karma_rows: np.ndarray, tmp_path: Path) -> None:
    path = str(tmp_path / "karma.imu.csv")
    write_imu(path, karma_rows)
    np.testing.assert_array_equal(read_imu(path), karma_rows)
    np.testing.assert_array_equal(read_episode_imu(path, "sidecar"), karma_rows)
    np.testing.assert_array_equal(read_episode_imu(str(CLIPS["karma"]), "gpmf"), karma_rows)


def _poses_from_imu(rows: np.ndarray, ts_cam: np.ndarray) -> EpisodeFrames:
    """Camera poses (in units of 0.5 m) the IMU itself implies: gyro integrated, gravity-free force twice.

    Any pose source works for comparing two readings of one IMU; this one gives the estimator a full
    solve (a refused scale would compare little), with the answer known: 0.5 m per unit.
    """
    t, accel, gyro = rows[:, 0], rows[:, 1:4], rows[:, 4:7]
    steps = so3_exp(gyro[:-1] * np.diff(t)[:, None])
    rot = np.empty((len(t), 3, 3))
    rot[0] = np.eye(3)
    for k, step in enumerate(steps):
        rot[k + 1] = rot[k] @ step
    force = np.einsum("kij,kj->ki", rot, accel)
    gravity = -9.81 * force[: int(1.0 / np.median(np.diff(t)))].mean(axis=0)
    gravity *= 9.81 / np.linalg.norm(gravity)
    position = cumulative_trapezoid(
        cumulative_trapezoid(force + gravity, t, axis=0, initial=0), t, axis=0, initial=0
    )
    inside = ts_cam[(ts_cam >= t[0]) & (ts_cam <= t[-1])]
    nearest = np.clip(np.searchsorted(t, inside), 0, len(t) - 1)
    world_from_cam = np.tile(np.eye(4), (len(inside), 1, 1))
    world_from_cam[:, :3, :3] = rot[nearest]
    world_from_cam[:, :3, 3] = (
        np.stack([np.interp(inside, t, c) for c in position.T], axis=1) / METRES_PER_UNIT
    )
    k = np.array([[400.0, 0, 427], [0, 400.0, 240], [0, 0, 1]])
    return EpisodeFrames(np.arange(len(inside)), inside, world_from_cam, k, (854, 480))


def test_fusion_gets_the_same_imu_result_from_the_track_and_from_the_sidecar(
    karma_rows: np.ndarray, tmp_path: Path
) -> None:
    sidecar = str(tmp_path / "karma.imu.csv")
    write_imu(sidecar, karma_rows)
    posed = _poses_from_imu(karma_rows, frame_times(CLIPS["karma"]))
    frames = pd.DataFrame(
        {
            "episode_id": "karma",
            "frame_idx": posed.frame_idx,
            "ts_s": posed.ts_s,
            "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(posed.world_from_cam[:, :3, :3])),
            "world_from_cam_t_mu": list(posed.world_from_cam[:, :3, 3]),
        }
    )
    opts = FusionOptions()
    embedded = episode_imu_scale(frames.assign(imu_path=str(CLIPS["karma"]), imu_source="gpmf"), posed, opts)
    from_file = episode_imu_scale(frames.assign(imu_path=sidecar, imu_source="sidecar"), posed, opts)
    legacy = episode_imu_scale(frames.assign(imu_path=sidecar), posed, opts)  # rows without imu_source
    assert embedded is not None and from_file is not None and legacy is not None
    for other in (from_file, legacy):
        assert repr(other) == repr(embedded)  # every field, arrays included, identical
    assert embedded.metres_per_unit == pytest.approx(METRES_PER_UNIT, rel=0.01)


class TestAttach:
    def test_a_gopro_clip_ingests_with_its_imu(self, shared_data: Path, tmp_path: Path) -> None:
        video = shutil.copyfile(CLIPS["max"], tmp_path / "walk.mp4")
        row = probe_row(InputItem(str(video), "video", Sidecars()), FAST_PROBE)
        assert row["ok"] and (row["imu_path"], row["imu_source"], row["imu_warning"]) == (
            str(video),
            "gpmf",
            None,
        )

    def test_an_explicit_sidecar_wins(self, karma_rows: np.ndarray, tmp_path: Path) -> None:
        video = shutil.copyfile(CLIPS["karma"], tmp_path / "fly.mp4")
        sidecar = str(tmp_path / "fly.imu.csv")
        write_imu(sidecar, karma_rows[::2])
        row = probe_row(InputItem(str(video), "video", Sidecars(imu_path=sidecar)), FAST_PROBE)
        assert row["ok"] and (row["imu_path"], row["imu_source"], row["imu_warning"]) == (
            sidecar,
            "sidecar",
            None,
        )

    def test_the_embedded_track_can_be_ignored(self, shared_data: Path) -> None:
        assert attach_imu(str(CLIPS["karma"]), None, read_embedded=False) == attach_imu(
            "/no/such.mp4", None, False
        )

    def test_a_damaged_payload_is_a_warning_and_the_imu_stays(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        at = _accl_repeat_offset(CLIPS["karma"], 5)
        video = damaged_copy(CLIPS["karma"], tmp_path / "fly.mp4", [5], at, b"\xff\xff")
        row = probe_row(InputItem(str(video), "video", Sidecars()), FAST_PROBE)
        assert row["ok"] and row["imu_source"] == "gpmf" and row["imu_path"] == str(video)
        assert row["imu_warning"].startswith("GPMF IMU attached; 1 problem(s): payload 5 at 5.005 s left out")
        rows = read_episode_imu(str(video), "gpmf")
        assert np.all(np.diff(rows[:, 0]) > 0) and rows[-1, 0] > 12.0  # the rest of the clip is kept

    def test_a_track_with_no_usable_payload_is_a_warning_not_a_lost_episode(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        n = len(payload_positions(CLIPS["max"]))
        video = damaged_copy(CLIPS["max"], tmp_path / "walk.mp4", list(range(n)), 0, b"XXXX")
        row = probe_row(InputItem(str(video), "video", Sidecars()), FAST_PROBE)
        assert row["ok"] and row["frame_count"] == 315
        assert row["imu_path"] is None and row["imu_source"] is None
        assert row["imu_warning"] == (
            f"GPMF IMU not attached: {video}: no usable IMU in {n} GPMF payloads; first problem: "
            "payload 0 at 0.000 s left out: payload starts with b'XXXX', not a GPMF device (DEVC)"
        )
        with pytest.raises(MetadataError, match="no usable IMU"):
            read_episode_imu(str(video), "gpmf")

    def test_a_video_without_a_track_has_no_imu(self, shared_data: Path) -> None:
        other = shared_data / "ego_clips" / "egoloc_desk_pour.mp4"
        assert read_embedded_imu(str(other)) is None
        assert attach_imu(str(other), None, read_embedded=True) == attach_imu(str(other), None, False)


def _accl_repeat_offset(path: Path, payload: int) -> int:
    """Offset, inside GPMF payload `payload` of `path`, of the accelerometer entry's repeat count."""
    pos, size = payload_positions(path)[payload]
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(size).index(b"ACCL") + 6
