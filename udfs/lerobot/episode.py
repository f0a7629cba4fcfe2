"""One episode of a LeRobot export, written by an executor: tensors, data file, video, statistics.

Called by the `export` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two light
frames per episode (no pixels cross Arrow): its frames with camera poses and its place in the dataset
(`PLAN_COLUMNS`, the same in every row), and its `hands_world` rows. The unit decodes the source video
itself, writes `data/...parquet` and `videos/<key>/...mp4` under the staging folder and returns one
metadata row (`EPISODE_META`): length, per-episode statistics and video info, for the driver's meta/.
Callable on pandas frames without Spark.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace

import cv2
import numpy as np
import pandas as pd
import pyarrow as pa

from pose_core.errors import EgolakeError
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import matrix_from_quat_wxyz
from pose_core.privacy.faces import FaceBlurOptions, FaceBlurrer, keypoint_boxes
from pose_core.training import (
    HAND_IDENTITIES,
    EpisodeTensors,
    FeatureSpec,
    episode_tensors,
    hand_feature_spec,
    robot_feature_spec,
    robot_tensors,
)
from pose_core.training.stats import feature_stats, image_stats
from udfs.camera_tables import camera_from_row
from udfs.columns import list_column
from udfs.lerobot.writer import video_path, write_episode_data
from udfs.media.decode import iter_frames
from udfs.media.encode import EncodeOptions, VideoWriter
from udfs.media.overlay import draw_hands, project_world_points
from udfs.models import face_blurrer
from udfs.options import DecodeOptions, ExportOptions

__all__ = [
    "EGO_OVERLAY_KEY",
    "EGO_VIDEO_KEY",
    "EPISODE_META",
    "PLAN_COLUMNS",
    "RobotLayout",
    "dataset_spec",
    "encode_options",
    "export_episode",
    "robot_spec",
    "source_decode_options",
]

logger = logging.getLogger(__name__)

#: The egocentric camera's video feature.
EGO_VIDEO_KEY = "observation.images.ego"
#: The optional hand-overlay feature: the ego video with the exported hand keypoints drawn on it.
EGO_OVERLAY_KEY = "observation.images.ego_overlay"
#: Per-episode constants the driver puts on every frame row: the episode's place in the dataset.
PLAN_COLUMNS: tuple[str, ...] = (
    "episode_index",
    "task_index",
    "dataset_from_index",
    "length",
    "source_path",
    "metres_per_unit",
    "camera_json",  # the `cameras` row the hands were fitted with (JSON), to project them; null: none
    "staging_root",
)
#: What a unit returns per episode.
EPISODE_META = pa.schema(
    [
        pa.field("episode_id", pa.string()),
        pa.field("episode_index", pa.int64()),
        pa.field("length", pa.int64()),  # dataset frames written
        pa.field("stats_json", pa.string()),  # {feature: {stat: list, "weights": list}}
        pa.field("video_json", pa.string()),  # {video key: LeRobot video info block}
        pa.field("faces_blurred", pa.int64()),  # faces pixelated over all exported frames
        pa.field("worker", pa.string()),  # host:pid of the Python worker that wrote the files
        pa.field("unit_s", pa.float64()),  # wall seconds of the unit (tensors, files, statistics)
        pa.field("unit_cpu_s", pa.float64()),  # CPU seconds of the worker process meanwhile (all threads)
    ]
)
_CODECS = {"h264": ("libx264", "h264"), "av1": ("libsvtav1", "av1")}  # option -> (encoder, info.json codec)
_DECODE_CHUNK = 32
_BLURRERS: dict[FaceBlurOptions, FaceBlurrer] = {}


@dataclass(frozen=True)
class RobotLayout:
    """The state layout of one embodiment's dataset, fixed by the driver from `robot_actions`.

    Attributes:
        embodiment: robot profile name.
        identities: the wearer hands its arms follow, in state order.
        joint_names: per identity, its state dimensions (joints, then `gripper` when it has one).
        has_gripper: per identity, whether the last dimension is the gripper command.
        fps: the dataset's rate: the embodiment's control rate (`robot_actions.control_fps`), so each
            dataset frame is one control step of `robot_actions`.
    """

    embodiment: str
    identities: tuple[str, ...]
    joint_names: tuple[tuple[str, ...], ...]
    has_gripper: tuple[bool, ...]
    fps: int


def _video_keys(opts: ExportOptions) -> tuple[str, ...]:
    """The human-hands dataset's video features."""
    if not opts.video:
        return ()
    return (EGO_VIDEO_KEY, EGO_OVERLAY_KEY) if opts.overlay_video else (EGO_VIDEO_KEY,)


def source_decode_options(opts: ExportOptions) -> DecodeOptions:
    """Decoder settings for the source frames: PyAV, which can skip deblocking (decord cannot)."""
    return DecodeOptions(
        backend="pyav",
        max_long_side_px=max(opts.image_width, opts.image_height),
        skip_deblocking_below=opts.skip_deblocking_below,
    )


def encode_options(opts: ExportOptions) -> EncodeOptions:
    """Encoder settings for `udfs.media.encode`."""
    threads = {"threads": str(opts.encoder_threads)} if opts.encoder_threads else {}
    return EncodeOptions(
        codec=_CODECS[opts.codec][0],
        crf=opts.crf,
        gop_size=opts.gop_size,
        codec_options=threads,
        rgb_converter="opencv",
    )


def _video_info(opts: ExportOptions, fps: int) -> dict[str, object]:
    """LeRobot's `info` block of a video feature."""
    return {
        "video.height": opts.image_height,
        "video.width": opts.image_width,
        "video.codec": _CODECS[opts.codec][1],
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }


def robot_spec(opts: ExportOptions, robot: RobotLayout) -> FeatureSpec:
    """The features of one embodiment's dataset."""
    return robot_feature_spec(
        robot.embodiment,
        robot.joint_names,
        robot.identities,
        (opts.image_height, opts.image_width),
        _video_keys(opts)[:1],  # the ego video: a robot dataset has no hand keypoints to draw
    )


def dataset_spec(opts: ExportOptions) -> FeatureSpec:
    """The features of the human-hands dataset these options describe."""
    return hand_feature_spec(
        HAND_IDENTITIES,
        (opts.image_height, opts.image_width),
        opts.tensors.include_keypoints,
        _video_keys(opts),
    )


@dataclass(frozen=True)
class _SourceFrames:
    """An episode's source frames as arrays, `F` = its frames in `frame_idx` order; NaN: absent."""

    frame_idx: np.ndarray  # (F,) int64
    ts_s: np.ndarray  # (F,) seconds
    keypoints: np.ndarray  # (F, 2, 21, 3) world frame, metres, per wearer hand (HAND_IDENTITIES order)
    filled: np.ndarray  # (F, 2) bool: the hand was gap-filled there, not seen
    world_from_cam: np.ndarray  # (F, 4, 4) camera poses, translation in map units


def _source_frames(frames: pd.DataFrame, hands: pd.DataFrame, use_filled: bool) -> _SourceFrames:
    """The episode's hands and camera poses per source frame (gap-filled hands only with `use_filled`)."""
    frames = frames.sort_values("frame_idx").reset_index(drop=True)
    frame_idx = frames["frame_idx"].to_numpy(np.int64)
    row_of = {int(f): i for i, f in enumerate(frame_idx)}
    keypoints = np.full((len(frames), len(HAND_IDENTITIES), 21, 3), np.nan)
    filled = np.zeros((len(frames), len(HAND_IDENTITIES)), bool)
    is_filled = hands["filled"].fillna(False).astype(bool)
    if not use_filled:
        hands, is_filled = hands[~is_filled], is_filled[~is_filled]
    for slot, identity in enumerate(HAND_IDENTITIES):
        mine = (hands["identity"] == identity).to_numpy()
        rows = np.array([row_of.get(int(f), -1) for f in hands["frame_idx"][mine]], np.int64)
        kp = list_column(hands["keypoints_world_m"][mine], 63).reshape(-1, 21, 3)
        keep = rows >= 0
        keypoints[rows[keep], slot] = kp[keep]
        filled[rows[keep], slot] = is_filled.to_numpy()[mine][keep]
    q = list_column(frames["world_from_cam_q_wxyz"], 4)
    world_from_cam = np.full((len(frames), 4, 4), np.nan)
    posed = np.isfinite(q).all(axis=1)
    world_from_cam[posed] = np.eye(4)
    world_from_cam[posed, :3, :3] = matrix_from_quat_wxyz(q[posed])
    world_from_cam[posed, :3, 3] = list_column(frames["world_from_cam_t_mu"], 3)[posed]
    return _SourceFrames(frame_idx, frames["ts_s"].to_numpy(np.float64), keypoints, filled, world_from_cam)


def _letterbox(w: int, h: int, width: int, height: int) -> tuple[int, int, int, int]:
    """Where a `w x h` image goes in a `width x height` frame, aspect kept, centred: (w', h', x0, y0)."""
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    return new_w, new_h, (width - new_w) // 2, (height - new_h) // 2


def fit_to_size(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize an RGB frame `(h, w, 3)` into `(height, width, 3)`, aspect kept, centred on black."""
    h, w = frame.shape[:2]
    if (w, h) == (width, height):
        return frame
    new_w, new_h, x0, y0 = _letterbox(w, h, width, height)
    out = np.zeros((height, width, 3), np.uint8)
    out[y0 : y0 + new_h, x0 : x0 + new_w] = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA)
    return out


@dataclass(frozen=True)
class _ExportedHands:
    """Where the exported hands are in the dataset frames: keypoints projected with the fitting camera.

    The face blur leaves detections on them sharp; the overlay key draws them.
    """

    source: _SourceFrames
    metres_per_unit: float
    camera: Camera  # the intrinsics the hands were fitted with, at their own image size

    def pixels(
        self, frame_idx: np.ndarray, decoded_wh: tuple[int, int], size_wh: tuple[int, int]
    ) -> np.ndarray:
        """The hands' pixels in dataset frames of size `size_wh`.

        Returns:
            `(n, 2, 21, 2)` pixels of source frames `frame_idx` decoded at `decoded_wh` and letterboxed;
            NaN where the hand or the pose is missing.
        """
        new_w, new_h, x0, y0 = _letterbox(*decoded_wh, *size_wh)
        fitted = self.camera.scaled(*decoded_wh).scaled(new_w, new_h)
        camera = replace(fitted, width=size_wh[0], height=size_wh[1], cx=fitted.cx + x0, cy=fitted.cy + y0)
        rows = np.searchsorted(self.source.frame_idx, frame_idx)
        n, hands = len(rows), len(HAND_IDENTITIES)
        return project_world_points(
            self.source.keypoints[rows].reshape(n, hands * 21, 3),
            self.source.world_from_cam[rows],
            camera,
            self.metres_per_unit,
        ).reshape(n, hands, 21, 2)

    def draw(self, frames: np.ndarray, frame_idx: np.ndarray, px: np.ndarray) -> np.ndarray:
        """`frames` `(n, H, W, 3)` with the hands at `px` (`pixels`) drawn, gap-filled ones thin."""
        rows = np.searchsorted(self.source.frame_idx, frame_idx)
        return draw_hands(
            frames,
            {identity: px[:, slot] for slot, identity in enumerate(HAND_IDENTITIES)},
            {identity: self.source.filled[rows, slot] for slot, identity in enumerate(HAND_IDENTITIES)},
        )


def _blurrer(opts: FaceBlurOptions) -> FaceBlurrer:
    """One face blurrer per options value in this worker, built on first use."""
    if opts not in _BLURRERS:
        _BLURRERS[opts] = face_blurrer(opts)
    return _BLURRERS[opts]


def _write_videos(
    plan: pd.Series,
    keys: tuple[str, ...],
    source_frames: np.ndarray,
    opts: ExportOptions,
    hands: _ExportedHands | None,
) -> tuple[dict[str, tuple[dict, tuple[dict, np.ndarray]]], int]:
    """Encode every video key of the episode from one decode of its source.

    Dataset frame k is source frame `source_frames[k]` (nondecreasing) at k / fps: the ego video with
    faces blurred (detections on `hands` left sharp) and, for the overlay key, the same frame with
    `hands` drawn on it.

    Args:
        plan: the episode's `PLAN_COLUMNS`.
        keys: the dataset's video features.
        source_frames: `(K,)` source frame of each dataset frame.
        opts: export settings.
        hands: the exported hands, to draw and to keep sharp; None: no camera to project them with.

    Returns:
        ({key: (LeRobot video info, image statistics of the written frames)}, faces blurred).
    """
    if EGO_OVERLAY_KEY in keys and hands is None:
        raise EgolakeError("the overlay video needs the episode's camera (no cameras row)")
    root, episode_index, fps = str(plan["staging_root"]), int(plan["episode_index"]), opts.tensors.fps
    source = str(plan["source_path"])
    blurrer = _blurrer(opts.privacy)
    start, stop = int(source_frames[0]), int(source_frames[-1]) + 1
    sample_every = max(1, len(source_frames) // 100)  # statistics from ~100 frames, as LeRobot samples
    sampled: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    faces, k = 0, 0
    with ExitStack() as stack:
        writers = {}
        for key in keys:
            path = os.path.join(root, video_path(key, episode_index))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writers[key] = stack.enter_context(VideoWriter(path, fps, encode_options(opts)))
        decode = source_decode_options(opts)
        for chunk in iter_frames(source, start, stop, decode, chunk_frames=_DECODE_CHUNK):
            wanted = np.isin(chunk.frame_idx, source_frames)
            if not wanted.any():
                continue
            frames = chunk.frames if wanted.all() else chunk.frames[wanted]
            fitted = (
                frames
                if frames.shape[1:3] == (opts.image_height, opts.image_width)
                else np.stack([fit_to_size(f, opts.image_width, opts.image_height) for f in frames])
            )
            at = chunk.frame_idx[wanted]
            px = None
            if hands is not None:
                decoded_wh = (chunk.frames.shape[2], chunk.frames.shape[1])
                px = hands.pixels(at, decoded_wh, (opts.image_width, opts.image_height))
            blurred, counts = blurrer.blur(fitted, None if px is None else keypoint_boxes(px))
            faces += int(counts.sum())
            views = {EGO_VIDEO_KEY: blurred}
            if EGO_OVERLAY_KEY in keys and hands is not None and px is not None:
                views[EGO_OVERLAY_KEY] = hands.draw(blurred, at, px)
            for j, idx in enumerate(at):
                while k < len(source_frames) and source_frames[k] == idx:
                    for key in keys:
                        writers[key].write(views[key][j])
                        if k % sample_every == 0:  # a copy: a view would keep the whole chunk alive
                            sampled[key].append(views[key][j].copy())
                    k += 1
    if k != len(source_frames):
        raise EgolakeError(
            f"{source}: decoded {k} of {len(source_frames)} frames for episode {episode_index}"
        )
    return {key: (_video_info(opts, fps), image_stats(np.stack(sampled[key]))) for key in keys}, faces


def _stats_json(stats: dict[str, tuple[dict, np.ndarray]]) -> str:
    return json.dumps(
        {
            name: {**{k: np.asarray(v).tolist() for k, v in st.items()}, "weights": np.asarray(w).tolist()}
            for name, (st, w) in stats.items()
        }
    )


def _robot_arrays(rows: pd.DataFrame, robot: RobotLayout) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The episode's control steps from its `robot_actions` rows.

    Returns:
        (source frame per step `(S,)`, step time `(S,)`, per followed hand `(S, J_i)` joint positions
        (+ gripper), NaN where undefined or unreachable).
    """
    steps = rows.drop_duplicates("step_idx").sort_values("step_idx")
    step_of = {int(k): i for i, k in enumerate(steps["step_idx"])}
    arms = []
    for identity, names, gripper in zip(robot.identities, robot.joint_names, robot.has_gripper, strict=True):
        arm = np.full((len(steps), len(names)), np.nan)
        mine = rows[(rows["identity"] == identity) & rows["reachable"].fillna(False).astype(bool)]
        n_joints = len(names) - int(gripper)
        for r in mine.itertuples():
            if r.joint_positions is not None and len(r.joint_positions) == n_joints:
                values = [*r.joint_positions, r.gripper] if gripper else list(r.joint_positions)
                arm[step_of[int(r.step_idx)]] = np.asarray(values, np.float64)
        arms.append(arm)
    return steps["frame_idx"].to_numpy(np.int64), steps["ts_s"].to_numpy(np.float64), arms


def _tensors(
    frames: pd.DataFrame, rows: pd.DataFrame, opts: ExportOptions, robot: RobotLayout | None
) -> tuple[EpisodeTensors, FeatureSpec, _ExportedHands | None]:
    """The episode's dataset frames, the dataset's features, and where its hands are in the video.

    The features are the human-hands dataset's, or one robot's (`robot`). The hands are None for a
    robot, without a camera to project with, or when neither the overlay nor the face blur needs them.
    A robot dataset's frames are `robot_actions`' control steps one to one (`opts.tensors.fps` is the
    embodiment's control rate, so resampling the steps at it takes each step once).
    """
    if robot is None:
        src = _source_frames(frames, rows, opts.tensors.use_filled)
        plan = frames.iloc[0]
        mpu = float(plan["metres_per_unit"])
        tensors = episode_tensors(
            src.frame_idx, src.ts_s, src.keypoints, src.world_from_cam, mpu, opts.tensors
        )
        camera = plan.get("camera_json")
        hands = None
        if isinstance(camera, str) and opts.video and (opts.overlay_video or opts.privacy.enabled):
            hands = _ExportedHands(src, mpu, camera_from_row(pd.DataFrame([json.loads(camera)])))
        return tensors, dataset_spec(opts), hands
    frame_idx, ts_s, arms = _robot_arrays(rows, robot)
    return robot_tensors(frame_idx, ts_s, arms, opts.tensors), robot_spec(opts, robot), None


def export_episode(
    frames: pd.DataFrame, rows: pd.DataFrame, opts: ExportOptions, robot: RobotLayout | None = None
) -> pd.DataFrame:
    """Write one episode's files under its staging root; return its `EPISODE_META` row.

    Args:
        frames: the episode's frames (`episode_id`, `frame_idx`, `ts_s`, `world_from_cam_q_wxyz`,
            `world_from_cam_t_mu`; poses null where missing) plus `PLAN_COLUMNS`.
        rows: its `hands_world` rows (`identity`, `frame_idx`, `keypoints_world_m`, `filled`), or for
            a robot dataset its `robot_actions` rows of that embodiment.
        opts: export settings.
        robot: the robot dataset's layout; None for the human-hands dataset.

    Raises:
        EgolakeError: the planned length disagrees with the resampled one, or the video is short.
    """
    started, started_cpu = time.perf_counter(), time.process_time()
    plan = frames.iloc[0]
    episode_index, fps = int(plan["episode_index"]), opts.tensors.fps
    tensors, spec, hands = _tensors(frames, rows, opts, robot)
    length = len(tensors.timestamp)
    if length != int(plan["length"]):
        raise EgolakeError(
            f"episode {plan['episode_id']}: {length} dataset frames, the plan said {plan['length']}"
        )
    root = str(plan["staging_root"])
    arrays = tensors.arrays
    write_episode_data(
        root, spec, episode_index, int(plan["task_index"]), int(plan["dataset_from_index"]), arrays, fps
    )
    stats = {}
    for f in spec.features:
        if f.dtype != "video":
            valid = None
            if f.mask is not None:
                valid = arrays[f.mask][:, list(f.mask_index)] > 0.5
            stats[f.name] = feature_stats(np.asarray(arrays[f.name]).reshape(length, -1), valid)
    frame_index = np.arange(length)
    index_values = {
        "timestamp": frame_index / fps,
        "frame_index": frame_index,
        "episode_index": np.full(length, episode_index),
        "index": int(plan["dataset_from_index"]) + frame_index,
        "task_index": np.full(length, int(plan["task_index"])),
    }
    stats.update({k: feature_stats(np.asarray(v, np.float64)[:, None]) for k, v in index_values.items()})
    video_info, faces = {}, 0
    if spec.video_keys:
        videos, faces = _write_videos(
            plan, tuple(spec.video_keys), arrays["source_frame_idx"][:, 0], opts, hands
        )
        video_info = {key: info for key, (info, _) in videos.items()}
        stats.update({key: image for key, (_, image) in videos.items()})
    logger.info(
        "exported episode=%s index=%d frames=%d faces=%d", plan["episode_id"], episode_index, length, faces
    )
    return pd.DataFrame(
        [
            {
                "episode_id": plan["episode_id"],
                "episode_index": episode_index,
                "length": length,
                "stats_json": _stats_json(stats),
                "video_json": json.dumps(video_info),
                "faces_blurred": faces,
                "worker": f"{socket.gethostname()}:{os.getpid()}",
                "unit_s": time.perf_counter() - started,
                "unit_cpu_s": time.process_time() - started_cpu,
            }
        ]
    )
