"""Column declarations of every egolake table (see docs/ARCHITECTURE.md, "Table contract")."""

from __future__ import annotations

import pyarrow as pa

from schemas.base import TableSchema

__all__ = ["FRAMES", "QUARANTINE", "RUNS", "SHARDS", "VIDEOS"]

VIDEOS = TableSchema(
    name="videos",
    version="1",
    key=("episode_id",),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),  # first 16 hex of the content SHA-256
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),  # video | image_sequence
            pa.field("size_bytes", pa.int64()),
            pa.field("content_sha256", pa.string()),
            pa.field("container", pa.string()),
            pa.field("codec", pa.string()),
            pa.field("width", pa.int32()),  # coded size, before rotation
            pa.field("height", pa.int32()),
            pa.field("rotation_deg", pa.int32()),  # display rotation from container metadata
            pa.field("fps", pa.float64()),  # average rate; per-frame times are in `frames.ts_s`
            pa.field("frame_count", pa.int64()),  # counted by decoding, not read from the header
            pa.field("duration_s", pa.float64()),
            pa.field("variable_frame_rate", pa.bool_()),
            pa.field("has_audio", pa.bool_()),
            pa.field("decoder", pa.string()),  # backend that decodes it: decord | pyav | images
            pa.field("stereo_partner_path", pa.string()),
            pa.field("calibration_json", pa.string()),  # parsed calibration sidecar, or null
            pa.field("imu_path", pa.string()),
            pa.field("task_text", pa.string()),
            pa.field("phashes", pa.list_(pa.int64())),  # 64-bit perceptual hashes of sampled frames
        ]
    ),
)

SHARDS = TableSchema(
    name="shards",
    version="1",
    key=("episode_id", "shard_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("shard_idx", pa.int32(), nullable=False),
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("decoder", pa.string()),
            pa.field("frame_start", pa.int64(), nullable=False),  # decode range [frame_start, frame_stop)
            pa.field("frame_stop", pa.int64(), nullable=False),  # includes the overlap with neighbours
            pa.field("own_start", pa.int64(), nullable=False),  # frames this shard writes [own_start, own_stop)
            pa.field("own_stop", pa.int64(), nullable=False),
        ]
    ),
)

QUARANTINE = TableSchema(
    name="quarantine",
    version="1",
    key=("source_path",),
    partition_key="source_path",
    arrow=pa.schema(
        [
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("reason_code", pa.string(), nullable=False),  # one of udfs.media.reasons.REASONS
            pa.field("message", pa.string(), nullable=False),  # human-readable, names file and problem
            pa.field("size_bytes", pa.int64()),
            pa.field("content_sha256", pa.string()),
            pa.field("duplicate_of", pa.string()),  # source_path kept instead, for duplicates
        ]
    ),
)

RUNS = TableSchema(
    name="runs",
    version="1",
    key=("run_id", "stage", "episode_id"),
    partition_key="run_id",
    lineage=False,  # carries run_id, stage_version, config_hash itself
    arrow=pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("stage", pa.string(), nullable=False),
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("status", pa.string(), nullable=False),  # ok | failed | skipped
            pa.field("started", pa.timestamp("us", tz="UTC")),
            pa.field("finished", pa.timestamp("us", tz="UTC")),
            pa.field("rows", pa.int64()),
            pa.field("error", pa.string()),  # "ErrorClass: message" when failed
            pa.field("config_hash", pa.string(), nullable=False),
            pa.field("stage_version", pa.string(), nullable=False),
        ]
    ),
)

FRAMES = TableSchema(
    name="frames",
    version="1",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),  # 0-based, decode order
            pa.field("ts_s", pa.float64(), nullable=False),  # presentation time, seconds
            pa.field("shard_idx", pa.int32(), nullable=False),
            pa.field("width", pa.int32()),  # size as decoded for the pipeline (after resize)
            pa.field("height", pa.int32()),
            pa.field("brightness", pa.float32()),  # mean luma, 0..255
            pa.field("sharpness", pa.float32()),  # variance of the Laplacian of luma (blur < ~50)
        ]
    ),
)
