"""The sample writer: files in the sidecar convention, decodable video, ground truth that agrees."""

from __future__ import annotations

import av
import numpy as np
import pytest
import yaml

from jobs.sample import SAMPLE_PRESETS, SampleOptions, main, write_sample
from pose_core.geometry.interop import world_from_cam_from_tum_rows
from pose_core.synth import generate_episode
from udfs.media.sidecars import read_calibration, read_imu, read_task

FRAMES = 12


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample")
    return out, write_sample(
        out, SampleOptions(frames=FRAMES, stereo=True, seed=4, width=320, height=240, focal_px=250.0)
    )


def _decode(path):
    with av.open(path) as container:
        stream = container.streams.video[0]
        start = stream.start_time or 0
        return [
            (f.to_ndarray(format="rgb24"), float((f.pts - start) * f.time_base))
            for f in container.decode(stream)
        ]


class TestWriteSample:
    def test_layout(self, sample):
        out, paths = sample
        assert paths["video"] == str(out / "videos" / "synth_004.mp4")
        assert paths["video_right"] == str(out / "videos" / "synth_004.right.mp4")
        gt = out / "ground_truth" / "synth_004"
        for name in (
            "camera_poses_tum.txt",
            "world_from_cam.npy",
            "intrinsics.yaml",
            "hands_world.npy",
            "hands_px.npy",
            "hand_visible.npy",
            "ts_s.npy",
            "README.md",
        ):
            assert (gt / name).is_file(), name
        assert "xyzw" in (gt / "README.md").read_text()

    def test_videos_decode_with_frames_size_and_times(self, sample):
        _, paths = sample
        for key in ("video", "video_right"):
            frames = _decode(paths[key])
            assert len(frames) == FRAMES
            assert frames[0][0].shape == (240, 320, 3)
            np.testing.assert_allclose([t for _, t in frames], np.load(paths["ts_s"]), atol=1e-6)

    def test_decoded_video_matches_a_fresh_render(self, sample):
        _, paths = sample
        episode = generate_episode(
            SampleOptions(
                frames=FRAMES, stereo=True, seed=4, width=320, height=240, focal_px=250.0
            ).synth_options()
        )
        rendered = next(episode.frames(5, 6)).rgb.astype(np.float64)
        decoded = _decode(paths["video"])[5][0].astype(np.float64)
        psnr = 10 * np.log10(255.0**2 / np.mean((rendered - decoded) ** 2))
        assert psnr > 28, psnr

    def test_sidecars_follow_the_convention(self, sample):
        _, paths = sample
        calib = read_calibration(paths["calib"])
        assert (calib.fx, calib.fy, calib.cx, calib.cy) == (250.0, 250.0, 159.5, 119.5)
        assert (calib.width, calib.height, calib.distortion_model, calib.distortion) == (320, 240, "none", ())
        assert calib.baseline_m == pytest.approx(0.1)
        imu = read_imu(paths["imu"])
        np.testing.assert_allclose(imu[:, 0], np.load(paths["imu_ts_s"]), atol=1e-9)
        np.testing.assert_allclose(imu[:, 1:4], np.load(paths["imu_accel"]), atol=1e-8)
        assert imu[-1, 0] >= (FRAMES - 1) / 30.0
        assert read_task(paths["task"]).strip()
        with open(paths["intrinsics"], encoding="utf-8") as f:
            assert yaml.safe_load(f)["fx"] == 250.0

    def test_tum_file_matches_world_from_cam(self, sample):
        _, paths = sample
        ts, poses = world_from_cam_from_tum_rows(np.loadtxt(paths["camera_poses_tum"]))
        np.testing.assert_allclose(ts, np.load(paths["ts_s"]), atol=1e-9)
        np.testing.assert_allclose(poses, np.load(paths["world_from_cam"]), atol=1e-8)

    def test_cli(self, tmp_path, capsys):
        assert main([str(tmp_path), "--frames", "3", "--width", "160", "--height", "120", "--seed", "2"]) == 0
        assert (tmp_path / "videos" / "synth_002.mp4").is_file()
        assert not (tmp_path / "videos" / "synth_002.right.mp4").exists()
        assert "video:" in capsys.readouterr().out

    def test_cli_preset_with_overrides(self, tmp_path):
        """`--preset hard` picks the hard scene and seed 14; options given on the command line win."""
        argv = [str(tmp_path), "--preset", "hard", "--frames", "2", "--width", "160", "--height", "120"]
        assert main(argv) == 0
        gt = tmp_path / "ground_truth" / "synth_hard_014"
        assert np.load(gt / "ts_s.npy").shape == (2,)
        readme = (gt / "README.md").read_text()
        assert "seed 14" in readme and "scene preset `hard`" in readme
        with open(gt / "intrinsics.yaml", encoding="utf-8") as f:
            calib = yaml.safe_load(f)
        assert (calib["width"], calib["height"], calib["fx"]) == (160, 120, 500.0)
        hard = SAMPLE_PRESETS["hard"]
        assert (hard.frames, hard.seed, hard.scene) == (600, 14, "hard")

    def test_rejects_unknown_scene(self):
        with pytest.raises(ValueError, match="scene must be one of"):
            SampleOptions(scene="kitchen")


def test_loops_play_one_rendered_closed_loop_over_and_over(tmp_path):
    """`loops=3`: the video is the rendered clip three times over, its frame after the last is its first
    (the motion is periodic, so no seam), and the ground truth covers every frame."""
    opts = SampleOptions(frames=8, loops=3, width=160, height=120, focal_px=125.0, seed=5, stereo=True)
    paths = write_sample(tmp_path, opts)
    frames = _decode(paths["video"])
    assert len(frames) == len(_decode(paths["video_right"])) == 24
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ground_truth", "videos"]  # no clip left behind
    for k in (1, 2):
        for (a, _), (b, _) in zip(frames[:8], frames[8 * k : 8 * (k + 1)], strict=True):
            np.testing.assert_array_equal(a, b)
    ts = np.load(paths["ts_s"])
    np.testing.assert_allclose(ts, np.arange(24) / 30.0)
    np.testing.assert_allclose([t for _, t in frames], ts, atol=1e-6)
    poses, hands = np.load(paths["world_from_cam"]), np.load(paths["hands_world"])
    assert poses.shape == (24, 4, 4) and hands.shape == (24, 2, 21, 3)
    # Across a seam the camera and hands move as between any two frames: no jump back to the start.
    for moving in (poses[:, :3, 3], hands.reshape(24, -1)):
        steps = np.linalg.norm(np.diff(moving, axis=0), axis=1)
        seams = np.isin(np.arange(23), [7, 15])
        assert 0.0 < steps[seams].max() <= 1.5 * steps[~seams].max()
    imu_ts = np.load(paths["imu_ts_s"])
    assert np.all(np.diff(imu_ts) > 0) and imu_ts[-1] >= ts[-1]
    with pytest.raises(ValueError, match="loops must be >= 1"):
        SampleOptions(loops=0)
