"""LeRobot v3.0 files written without lerobot: per-episode data/video files and the meta/ folder.

Layout (as `lerobot.datasets.utils` 0.4 reads it), one data file and one video file per episode
per video key, file index = episode index, chunked by `CHUNKS_SIZE`:

    data/chunk-000/file-000.parquet                  one episode's frames (features + index columns)
    videos/<key>/chunk-000/file-000.mp4              that episode's video, frame k at k / fps
    meta/info.json, meta/stats.json, meta/tasks.parquet, meta/episodes/chunk-000/file-000.parquet

Per-episode files never share a path, so executors write them in parallel without clashing;
only `write_meta` (the driver, once) writes meta/.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pose_core.training.features import FeatureSpec

__all__ = [
    "CHUNKS_SIZE",
    "INDEX_FEATURES",
    "data_path",
    "info_json",
    "video_path",
    "write_episode_data",
    "write_meta",
]

logger = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
#: Files per chunk folder (LeRobot's DEFAULT_CHUNK_SIZE).
CHUNKS_SIZE = 1000
_DATA_FILE_MB, _VIDEO_FILE_MB = 100, 200  # LeRobot's file size limits, recorded in info.json
#: The index columns every LeRobot frame carries, after the features.
INDEX_FEATURES: dict[str, str] = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
_DATA_PATTERN = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_VIDEO_PATTERN = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
_EPISODES_META = "meta/episodes/chunk-000/file-000.parquet"


def chunk_of(episode_index: int) -> tuple[int, int]:
    """(chunk_index, file_index) of an episode's files: one file per episode."""
    return episode_index // CHUNKS_SIZE, episode_index % CHUNKS_SIZE


def data_path(episode_index: int) -> str:
    """Relative path of an episode's data file."""
    chunk, file = chunk_of(episode_index)
    return _DATA_PATTERN.format(chunk_index=chunk, file_index=file)


def video_path(video_key: str, episode_index: int) -> str:
    """Relative path of an episode's video file for `video_key`."""
    chunk, file = chunk_of(episode_index)
    return _VIDEO_PATTERN.format(video_key=video_key, chunk_index=chunk, file_index=file)


def _hf_features(spec: FeatureSpec) -> dict[str, object]:
    """The `datasets.Features` JSON that LeRobot's parquet files carry (metadata key `huggingface`)."""
    out: dict[str, object] = {}
    for f in spec.features:
        if f.dtype == "video":
            continue
        value = {"dtype": f.dtype, "_type": "Value"}
        out[f.name] = value if f.shape == (1,) else {"feature": value, "length": f.shape[0], "_type": "List"}
    out.update({k: {"dtype": t, "_type": "Value"} for k, t in INDEX_FEATURES.items()})
    return out


def _arrow_schema(spec: FeatureSpec) -> pa.Schema:
    fields = []
    for f in spec.features:
        if f.dtype == "video":
            continue
        value = pa.from_numpy_dtype(np.dtype(f.dtype))
        fields.append(pa.field(f.name, value if f.shape == (1,) else pa.list_(value, f.shape[0])))
    fields += [pa.field(k, pa.from_numpy_dtype(np.dtype(t))) for k, t in INDEX_FEATURES.items()]
    metadata = {"huggingface": json.dumps({"info": {"features": _hf_features(spec)}})}
    return pa.schema(fields, metadata=metadata)


def write_episode_data(  # noqa: PLR0913 - an episode's identity in the dataset plus its arrays
    root: str,
    spec: FeatureSpec,
    episode_index: int,
    task_index: int,
    dataset_from_index: int,
    arrays: Mapping[str, np.ndarray],
    fps: int,
) -> str:
    """Write one episode's frames to its data file; returns the relative path.

    Args:
        root: dataset folder.
        spec: the dataset's features.
        episode_index: the episode's index in the dataset.
        task_index: its task's index.
        dataset_from_index: global index of the episode's first frame.
        arrays: every non-video feature, `(T, D)` (`(T, 1)` or `(T,)` for shape-(1,) features).
        fps: dataset rate, Hz: `timestamp = frame_index / fps`.
    """
    lengths = {len(np.asarray(arrays[k])) for k in spec.vector_keys}
    if len(lengths) != 1:
        raise ValueError(f"episode {episode_index}: features have different lengths {sorted(lengths)}")
    n = lengths.pop()
    schema = _arrow_schema(spec)
    columns: list[pa.Array] = []
    for f in spec.features:
        if f.dtype == "video":
            continue
        values = np.asarray(arrays[f.name]).astype(f.dtype)
        if f.shape == (1,):
            columns.append(pa.array(values.reshape(n)))
        else:
            flat = pa.array(values.reshape(n * f.shape[0]))
            columns.append(pa.FixedSizeListArray.from_arrays(flat, f.shape[0]))
    frame_index = np.arange(n, dtype=np.int64)
    columns += [
        pa.array((frame_index / fps).astype(np.float32)),
        pa.array(frame_index),
        pa.array(np.full(n, episode_index, np.int64)),
        pa.array(dataset_from_index + frame_index),
        pa.array(np.full(n, task_index, np.int64)),
    ]
    rel = data_path(episode_index)
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), os.path.join(root, rel))
    return rel


def info_json(
    spec: FeatureSpec, fps: int, episodes: int, frames: int, tasks: int, video_info: Mapping
) -> dict:
    """meta/info.json's content.

    Args:
        spec: the features.
        fps: dataset rate, Hz.
        episodes: number of episodes.
        frames: number of frames.
        tasks: number of tasks.
        video_info: per video key, LeRobot's `info` block (`video.height`, `video.codec`, ...).
    """
    features: dict[str, dict] = {}
    for f in spec.features:
        entry = f.info()
        if f.dtype == "video":
            entry["info"] = dict(video_info[f.name])
        features[f.name] = entry
    features.update({k: {"dtype": t, "shape": [1], "names": None} for k, t in INDEX_FEATURES.items()})
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": spec.robot_type,
        "total_episodes": episodes,
        "total_frames": frames,
        "total_tasks": tasks,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": _DATA_FILE_MB,
        "video_files_size_in_mb": _VIDEO_FILE_MB,
        "fps": fps,
        "splits": {"train": f"0:{episodes}"},
        "data_path": _DATA_PATTERN,
        "video_path": _VIDEO_PATTERN if spec.video_keys else None,
        "features": features,
    }


def _jsonable(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()}


def write_meta(  # noqa: PLR0913 - meta/ is these five parts
    root: str,
    spec: FeatureSpec,
    fps: int,
    episodes: pd.DataFrame,
    tasks: Sequence[str],
    stats: Mapping[str, Mapping[str, np.ndarray]],
    video_info: Mapping[str, Mapping],
) -> None:
    """Write meta/: info.json, stats.json, tasks.parquet and the episodes table (one file).

    Args:
        root: dataset folder.
        spec: the features.
        fps: dataset rate, Hz.
        episodes: one row per episode in LeRobot's columns (`episode_index`, `tasks`, `length`,
            `data/...`, `dataset_from_index`, `dataset_to_index`, `videos/<key>/...`, `stats/<f>/<s>`),
            sorted by `episode_index`.
        tasks: task strings; task_index = position.
        stats: dataset statistics per feature.
        video_info: per video key, LeRobot's video `info` block.
    """
    meta = os.path.join(root, "meta")
    os.makedirs(os.path.join(meta, "episodes", "chunk-000"), exist_ok=True)
    info = info_json(spec, fps, len(episodes), int(episodes["length"].sum()), len(tasks), video_info)
    with open(os.path.join(meta, "info.json"), "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=4)
    with open(os.path.join(meta, "stats.json"), "w", encoding="utf-8") as fh:
        json.dump(_jsonable(stats), fh, indent=4)
    task_table = pd.DataFrame(
        {"task_index": np.arange(len(tasks), dtype=np.int64)}, index=pd.Index(list(tasks))
    )
    task_table.to_parquet(os.path.join(meta, "tasks.parquet"))
    table = episodes.reset_index(drop=True).assign(
        **{"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
    )
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), os.path.join(root, _EPISODES_META))
