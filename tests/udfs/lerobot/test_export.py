"""The LeRobot writer without Spark: two synthetic episodes exported, loaded by lerobot itself, checked
frame by frame against the ground truth they came from (hands, camera poses, video frames, times)."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.udfs.lerobot.lerobot_load import load_with_lerobot

pytestmark = pytest.mark.slow

SOURCE_FRAMES = 30
FPS = 15  # half the source rate: resampling picks source frames by time
SUBSET = np.array(
    [0, 1, 2, 4, 5, 7, 8, 9, 12, 13, 14, 15, 18, 20, 21, 22, 25, 26, 29]
)  # episode b: frames dropped


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from jobs.sample import SampleOptions, write_sample

    folder = tmp_path_factory.mktemp("sample")
    write_sample(folder, SampleOptions(frames=SOURCE_FRAMES, seed=0))
    gt = folder / "ground_truth" / "synth_000"
    names = ("ts_s", "world_from_cam", "hands_world", "hands_px", "hand_visible")
    arrays = {n: np.load(gt / f"{n}.npy") for n in names}
    intrinsics = yaml.safe_load((gt / "intrinsics.yaml").read_text(encoding="utf-8"))
    camera = {k: intrinsics[k] for k in ("width", "height", "fx", "fy", "cx", "cy")}
    arrays["camera_json"] = json.dumps(
        {**camera, "model": "pinhole", "dist": [], "intrinsics_source": "sidecar"}
    )
    return folder / "videos" / "synth_000.mp4", arrays


def _tables(episode_id: str, frames: np.ndarray, gt: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    from pose_core.geometry.rigid3 import quat_wxyz_from_matrix

    poses = gt["world_from_cam"][frames]
    posed = pd.DataFrame(
        {
            "episode_id": episode_id,
            "frame_idx": frames,
            "ts_s": gt["ts_s"][frames],
            "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(poses[:, :3, :3])),
            "world_from_cam_t_mu": list(poses[:, :3, 3]),
        }
    )
    hands = pd.DataFrame(
        [
            {
                "episode_id": episode_id,
                "frame_idx": f,
                "identity": identity,
                "filled": False,
                "keypoints_world_m": gt["hands_world"][f, slot].ravel().tolist(),
            }
            for f in frames
            for slot, identity in enumerate(("wearer_left", "wearer_right"))
            if gt["hand_visible"][f, slot]
        ]
    )
    return posed, hands


@pytest.fixture(scope="module")
def exported(sample, tmp_path_factory):
    from pose_core.privacy.faces import FaceBlurOptions
    from pose_core.training import TensorOptions
    from udfs.lerobot import dataset_spec, export_episode
    from udfs.lerobot.dataset import finish_dataset, plan_episodes
    from udfs.options import ExportOptions

    video, gt = sample
    opts = ExportOptions(
        tensors=TensorOptions(fps=FPS), privacy=FaceBlurOptions(enabled=False), overlay_video=True
    )
    episodes = {"a": np.arange(SOURCE_FRAMES), "b": SUBSET}
    tables = {e: _tables(e, f, gt) for e, f in episodes.items()}
    plan, tasks = plan_episodes(
        pd.DataFrame(
            {
                "episode_id": list(episodes),
                "ts_first": [gt["ts_s"][f[0]] for f in episodes.values()],
                "ts_last": [gt["ts_s"][f[-1]] for f in episodes.values()],
                "task_text": ["pour", None],
            }
        ),
        FPS,
        "default task",
    )
    root = tmp_path_factory.mktemp("dataset")
    metas = []
    for p in plan.itertuples():
        posed, hands = tables[p.episode_id]
        posed = posed.assign(
            episode_index=p.episode_index,
            task_index=p.task_index,
            length=p.length,
            dataset_from_index=p.dataset_from_index,
            source_path=str(video),
            metres_per_unit=1.0,
            camera_json=gt["camera_json"],
            staging_root=str(root),
        )
        metas.append(export_episode(posed, hands, opts))
    finish_dataset(str(root), dataset_spec(opts), FPS, plan, pd.concat(metas), tasks)
    meta, arrays = load_with_lerobot(root, tmp_path_factory.mktemp("load") / "frames.npz")
    return plan, episodes, meta, arrays, root


def _expected_source(ts: np.ndarray, frames: np.ndarray, n: int) -> np.ndarray:
    """Brute force: the source frame nearest to k / FPS (the earliest of those within 1 us of the nearest)."""
    rel = ts[frames] - ts[frames[0]]
    dist = [np.abs(rel - k / FPS) for k in range(n)]
    return np.array([frames[np.flatnonzero(d <= d.min() + 1e-6)[0]] for d in dist])


def test_lerobot_loads_every_frame_with_indices_times_and_tasks(exported):
    plan, _, meta, arrays, _ = exported
    n = int(plan["length"].sum())
    assert meta["num_frames"] == n and meta["num_episodes"] == 2 and meta["fps"] == FPS
    assert meta["video_backend"] == "torchcodec"  # lerobot's default backend decodes it (make setup's FFmpeg)
    np.testing.assert_array_equal(arrays["value/index"][:, 0], np.arange(n))
    for p in plan.itertuples():
        rows = arrays["value/episode_index"][:, 0] == p.episode_index
        assert rows.sum() == p.length
        np.testing.assert_array_equal(arrays["value/frame_index"][rows, 0], np.arange(p.length))
        np.testing.assert_allclose(arrays["value/timestamp"][rows, 0], np.arange(p.length) / FPS, atol=1e-6)
        assert {meta["tasks"][i] for i in np.flatnonzero(rows)} == {
            "pour" if p.episode_id == "a" else "default task"
        }
    assert meta["features"]["observation.state"]["shape"] == [20]
    assert arrays["image/observation.images.ego"].shape == (n, 3, 240, 320)


def test_values_equal_the_ground_truth_they_came_from(exported, sample):
    video, gt = sample
    plan, episodes, _, arrays, _ = exported
    for p in plan.itertuples():
        rows = arrays["value/episode_index"][:, 0] == p.episode_index
        src = _expected_source(gt["ts_s"], episodes[p.episode_id], p.length)
        np.testing.assert_array_equal(arrays["value/source_frame_idx"][rows, 0], src)
        present = arrays["value/observation.present"][rows]
        np.testing.assert_array_equal(present[:, :2], gt["hand_visible"][src].astype(np.float32))
        state = arrays["value/observation.state"][rows].reshape(-1, 2, 10)
        kp = gt["hands_world"][src]
        for slot in range(2):
            on = present[:, slot] > 0
            np.testing.assert_allclose(state[on, slot, :3], kp[on, slot, 0], atol=1e-6)  # wrist = keypoint 0
            grip = np.linalg.norm(kp[on, slot, 4] - kp[on, slot, 8], axis=-1)
            np.testing.assert_allclose(state[on, slot, 9], grip, atol=1e-6)
            x, y = state[on, slot, 3:6], state[on, slot, 6:9]
            knuckles = 0.5 * (kp[on, slot, 5] + kp[on, slot, 17]) - kp[on, slot, 0]
            np.testing.assert_allclose(
                np.cross(x, y), knuckles / np.linalg.norm(knuckles, axis=1, keepdims=True), atol=1e-5
            )
            assert not state[~on, slot].any()  # absent: zero-filled AND masked
        cam = arrays["value/observation.camera_pose"][rows]
        np.testing.assert_allclose(cam[:, :3], gt["world_from_cam"][src, :3, 3], atol=1e-5)
        np.testing.assert_allclose(cam[:, 3:6], gt["world_from_cam"][src, :3, 0], atol=1e-5)
        action, valid = arrays["value/action"][rows], arrays["value/action_valid"][rows]
        both = valid[:-1, 1] > 0
        np.testing.assert_array_equal(
            action[:-1][both, 10:], arrays["value/observation.state"][rows][1:][both, 10:]
        )


def test_video_frames_show_the_source_frames(exported, sample):
    import cv2

    from udfs.media.decode import decode_frames

    video, _ = sample
    plan, episodes, _, arrays, _ = exported
    source = decode_frames(str(video)).frames
    rows = arrays["value/episode_index"][:, 0] == 1
    images = arrays["image/observation.images.ego"][rows]
    for k, f in enumerate(arrays["value/source_frame_idx"][rows, 0]):
        expected = cv2.resize(source[f], (320, 240), interpolation=cv2.INTER_AREA).astype(np.float32) / 255
        assert np.abs(images[k].transpose(1, 2, 0) - expected).mean() < 0.03, f"dataset frame {k}"
    # a neighbour frame is further away than the right one: the comparison can fail
    assert (
        np.abs(images[1].transpose(1, 2, 0) - cv2.resize(source[0], (320, 240)) / 255).mean()
        > np.abs(
            images[1].transpose(1, 2, 0)
            - cv2.resize(source[arrays["value/source_frame_idx"][rows, 0][1]], (320, 240)) / 255
        ).mean()
    )


def test_overlay_draws_the_exported_hands_where_the_camera_sees_them(exported, sample):
    """Overlay minus ego video: changed pixels lie on the true hand skeletons, and each seen hand is drawn."""
    import cv2

    from udfs.media.overlay import HAND_BONES

    _, gt = sample
    _, _, meta, arrays, _ = exported
    assert "observation.images.ego_overlay" in meta["features"]
    ego, overlay = arrays["image/observation.images.ego"], arrays["image/observation.images.ego_overlay"]
    assert overlay.shape == ego.shape
    changed = np.abs(overlay - ego).max(axis=1) > 0.25  # (n, 240, 320): drawn, not codec noise
    px = (gt["hands_px"] + 0.5) * 0.5 - 0.5  # 640x480 ground truth -> 320x240 dataset frames
    on_skeleton = drawn_hands = 0
    for k, f in enumerate(arrays["value/source_frame_idx"][:, 0]):
        near = np.zeros((240, 320), np.uint8)
        for slot in np.flatnonzero(gt["hand_visible"][f]):
            pts = np.round(px[f, slot]).astype(int)
            for a, b in HAND_BONES:
                cv2.line(near, tuple(pts[a]), tuple(pts[b]), 1, 9)
            wrist = np.round(px[f, slot, 0]).astype(int)
            if 0 <= wrist[0] < 320 and 0 <= wrist[1] < 240:
                drawn_hands += 1
                assert changed[
                    k, max(0, wrist[1] - 3) : wrist[1] + 4, max(0, wrist[0] - 3) : wrist[0] + 4
                ].any()
        on_skeleton += int((changed[k] & (near > 0)).sum())
        if not gt["hand_visible"][f].any():
            assert not changed[k].any(), f"dataset frame {k}: drawn without a hand"
    assert drawn_hands > 20
    assert on_skeleton >= 0.97 * changed.sum()


def test_stats_match_the_loaded_data(exported):
    _, _, meta, arrays, root = exported
    stats = meta["stats"]
    n = len(arrays["value/index"])
    for key in ("timestamp", "index", "observation.camera_pose"):
        values = arrays[f"value/{key}"].astype(np.float64)
        np.testing.assert_allclose(stats[key]["mean"], values.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats[key]["std"], values.std(axis=0), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(stats[key]["min"], values.min(axis=0), atol=1e-6)
        assert stats[key]["count"] == [n]
    state = arrays["value/observation.state"].astype(np.float64).reshape(n, 2, 10)
    for slot in range(2):
        on = arrays["value/observation.present"][:, slot] > 0
        mean = np.asarray(stats["observation.state"]["mean"]).reshape(2, 10)[slot]
        np.testing.assert_allclose(mean, state[on, slot].mean(axis=0), atol=1e-6)  # absent frames not counted
    image = np.asarray(stats["observation.images.ego"]["mean"])
    assert image.shape == (3, 1, 1) and 0 < image.min() < image.max() < 1
    with open(os.path.join(root, "meta", "info.json"), encoding="utf-8") as fh:
        info = json.load(fh)
    assert info["features"]["observation.state"]["names"][:3] == [
        "wearer_left.wrist_x_m",
        "wearer_left.wrist_y_m",
        "wearer_left.wrist_z_m",
    ]


def test_robot_dataset_without_video_loads_with_joint_positions(sample, tmp_path):
    """A per-robot dataset (issue #7) through the same writer: state = joints + gripper per followed hand."""
    from pose_core.privacy.faces import FaceBlurOptions
    from pose_core.training import TensorOptions
    from udfs.lerobot import export_episode
    from udfs.lerobot.dataset import finish_dataset, plan_episodes
    from udfs.lerobot.episode import RobotLayout, robot_spec
    from udfs.options import ExportOptions

    _, gt = sample
    rng = np.random.default_rng(0)
    frames = np.arange(SOURCE_FRAMES)
    joints = rng.normal(size=(SOURCE_FRAMES, 2, 3))
    reachable = rng.random((SOURCE_FRAMES, 2)) > 0.2
    rows = pd.DataFrame(
        [
            {
                "episode_id": "r",
                "step_idx": f,  # robot_actions' control steps at 30 Hz: one per source frame here
                "frame_idx": f,
                "ts_s": gt["ts_s"][f],
                "identity": ident,
                "joint_positions": joints[f, i].tolist(),
                "gripper": 0.01 * f if i == 1 else None,
                "reachable": bool(reachable[f, i]),
            }
            for f in frames
            for i, ident in enumerate(("wearer_left", "wearer_right"))
        ]
    )
    robot = RobotLayout(
        "toy",
        ("wearer_left", "wearer_right"),
        (("j0", "j1", "j2"), ("j0", "j1", "j2", "gripper")),
        (False, True),
        30,
    )
    opts = ExportOptions(tensors=TensorOptions(fps=30), video=False, privacy=FaceBlurOptions(enabled=False))
    plan, tasks = plan_episodes(
        pd.DataFrame(
            {
                "episode_id": ["r"],
                "ts_first": [gt["ts_s"][0]],
                "ts_last": [gt["ts_s"][-1]],
                "task_text": ["x"],
            }
        ),
        30,
        "x",
    )
    posed, _ = _tables("r", frames, gt)
    p = plan.iloc[0]
    posed = posed.assign(
        episode_index=0,
        task_index=0,
        length=p.length,
        dataset_from_index=0,
        source_path="",
        metres_per_unit=1.0,
        staging_root=str(tmp_path / "ds"),
    )
    meta_row = export_episode(posed, rows, opts, robot)
    finish_dataset(str(tmp_path / "ds"), robot_spec(opts, robot), 30, plan, meta_row, tasks)
    meta, arrays = load_with_lerobot(tmp_path / "ds", tmp_path / "frames.npz")
    assert meta["num_frames"] == SOURCE_FRAMES and "observation.images.ego" not in meta["features"]
    state, present = arrays["value/observation.state"], arrays["value/observation.present"]
    np.testing.assert_array_equal(present, reachable.astype(np.float32))
    left, right = present[:, 0] > 0, present[:, 1] > 0
    np.testing.assert_allclose(state[left, :3], joints[left, 0], atol=1e-6)
    np.testing.assert_allclose(state[right, 3:6], joints[right, 1], atol=1e-6)
    np.testing.assert_allclose(state[right, 6], 0.01 * frames[right], atol=1e-6)
    assert not state[~left, :3].any() and not state[~right, 3:].any()


def _face_photos_video(path: str) -> int:
    """A 640x480 video of real photos with faces (scikit-image's astronaut and cameraman, the shared
    photos of people holding things), 2 frames each, letterboxed; returns its frame count."""
    skimage_data = pytest.importorskip("skimage.data")
    import cv2

    from tests.data_paths import SHARED_DATA
    from udfs.lerobot.episode import fit_to_size
    from udfs.media.encode import EncodeOptions, write_video

    photos = [skimage_data.astronaut(), np.repeat(skimage_data.camera()[..., None], 3, axis=2)]
    for name in ("test1.jpg", "test3.jpg", "test5.jpg"):
        if (SHARED_DATA / "hands_hamer_images" / name).is_file():
            photos.append(cv2.imread(str(SHARED_DATA / "hands_hamer_images" / name))[:, :, ::-1])
    frames = [fit_to_size(np.ascontiguousarray(p), 640, 480) for p in photos for _ in range(2)]
    write_video(path, np.stack(frames), 30, EncodeOptions(crf=16))
    return len(frames)


def test_faces_in_real_photos_are_blurred_in_the_exported_video(tmp_path):
    """The exported video run through the face detector again: no face where the unblurred export had one."""
    from pose_core.privacy.faces import FaceBlurOptions
    from pose_core.training import TensorOptions
    from udfs.lerobot import export_episode
    from udfs.lerobot.writer import video_path
    from udfs.media.decode import decode_frames
    from udfs.models import face_blurrer
    from udfs.options import ExportOptions

    try:
        detector = face_blurrer(FaceBlurOptions())
    except FileNotFoundError as err:
        pytest.skip(str(err))
    video = str(tmp_path / "faces.mp4")
    n = _face_photos_video(video)
    posed = pd.DataFrame(
        {
            "episode_id": "f",
            "frame_idx": np.arange(n),
            "ts_s": np.arange(n) / 30,
            "world_from_cam_q_wxyz": [[1.0, 0.0, 0.0, 0.0]] * n,
            "world_from_cam_t_mu": [[0.0, 0.0, 0.0]] * n,
            "episode_index": 0,
            "task_index": 0,
            "length": n,
            "dataset_from_index": 0,
            "source_path": video,
            "metres_per_unit": 1.0,
            "camera_json": None,
        }
    )
    hands = pd.DataFrame(columns=["episode_id", "frame_idx", "identity", "filled", "keypoints_world_m"])
    exported = {}
    for blur in (False, True):
        opts = ExportOptions(
            image_width=640,
            image_height=480,
            tensors=TensorOptions(fps=30),
            privacy=FaceBlurOptions(enabled=blur),
        )
        root = tmp_path / f"blur_{blur}"
        meta = export_episode(posed.assign(staging_root=str(root)), hands, opts)
        exported[blur] = (meta, decode_frames(str(root / video_path("observation.images.ego", 0))).frames)
    assert len(exported[True][1]) == n
    assert exported[True][0]["faces_blurred"].iat[0] >= n  # at least one face per frame
    found = 0
    for sharp, blurred in zip(exported[False][1], exported[True][1], strict=True):
        faces, _ = detector.detect(sharp)
        after, _ = detector.detect(blurred)
        found += len(faces)
        centres = (after[:, None, :2] + after[:, None, 2:]) / 2
        inside = ((centres >= faces[None, :, :2]) & (centres <= faces[None, :, 2:])).all(axis=2)
        assert not inside.any(), "a face of the unblurred export is still found in the exported video"
    assert found >= n


def test_overlay_without_a_camera_row_fails_before_decoding(sample, tmp_path):
    from pose_core.errors import EgolakeError
    from pose_core.privacy.faces import FaceBlurOptions
    from pose_core.training import TensorOptions
    from udfs.lerobot import export_episode
    from udfs.options import ExportOptions

    video, gt = sample
    posed, hands = _tables("x", np.arange(SOURCE_FRAMES), gt)
    posed = posed.assign(
        episode_index=0, task_index=0, length=SOURCE_FRAMES, dataset_from_index=0, source_path=str(video),
        metres_per_unit=1.0, camera_json=None, staging_root=str(tmp_path),
    )  # fmt: skip
    opts = ExportOptions(
        tensors=TensorOptions(fps=30), privacy=FaceBlurOptions(enabled=False), overlay_video=True
    )
    with pytest.raises(EgolakeError, match="needs the episode's camera"):
        export_episode(posed, hands, opts)
    assert not list(tmp_path.rglob("*.mp4"))
