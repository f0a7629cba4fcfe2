"""Ingest adapters: input items <-> rows, probing as a pandas UDF, shard planning."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from schemas.tables import VIDEOS
from udfs.guard import cpu_seconds
from udfs.media.inputs import InputItem
from udfs.media.probe import probe_with_timeout
from udfs.media.sidecars import Calibration, Sidecars, read_calibration, read_task
from udfs.options import ProbeOptions

__all__ = [
    "PROBE_SCHEMA",
    "calibration_to_json",
    "item_from_json",
    "item_to_json",
    "plan_shards",
    "probe_items",
    "to_int64",
    "to_uint64",
]

#: One row per probed input: the `videos` columns (no episode id yet) plus the verdict.
PROBE_SCHEMA = pa.schema(
    [f.with_nullable(True) for f in VIDEOS.arrow if f.name != "episode_id"]
    + [
        pa.field("ok", pa.bool_()),
        pa.field("reason_code", pa.string()),
        pa.field("message", pa.string()),
        pa.field("unit_s", pa.float64()),  # wall seconds of the probe (and sidecar reads)
        pa.field("unit_cpu_s", pa.float64()),  # CPU seconds meanwhile, the probe's child process included
    ]
)


def item_to_json(item: InputItem) -> str:
    """Serialise an input item for a Spark row."""
    return json.dumps(dataclasses.asdict(item))


def item_from_json(text: str) -> InputItem:
    """Inverse of `item_to_json`."""
    data = json.loads(text)
    data["sidecars"] = Sidecars(**data["sidecars"])
    return InputItem(**data)


def probe_row(item: InputItem, opts: ProbeOptions) -> dict[str, Any]:
    """Probe one input (in a child process with a time limit) into a `PROBE_SCHEMA` row.

    Sidecar contents that later stages need (calibration, task text) are read here, once; the
    probe has already validated them.
    """
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    result = probe_with_timeout(item, opts)
    values = dataclasses.asdict(result)
    row = {name: values.get(name) for name in PROBE_SCHEMA.names}
    row["source_path"] = result.path
    row["phashes"] = [to_int64(h) for h in result.phashes]
    if result.ok and result.calibration_path:
        row["calibration_json"] = calibration_to_json(read_calibration(result.calibration_path))
    if result.ok and result.task_path:
        row["task_text"] = read_task(result.task_path)
    row["unit_s"], row["unit_cpu_s"] = time.perf_counter() - wall0, cpu_seconds() - cpu0
    return row


def calibration_to_json(calibration: Calibration) -> str:
    """The calibration as JSON for the `videos.calibration_json` column (matrices as nested lists)."""
    data = dataclasses.asdict(calibration)
    for key, value in data.items():
        if isinstance(value, np.ndarray):
            data[key] = value.tolist()
    return json.dumps(data, sort_keys=True)


def to_int64(value: int) -> int:
    """An unsigned 64-bit hash as the signed int64 that Arrow/Spark store (same bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def to_uint64(value: int) -> int:
    """Inverse of `to_int64`."""
    return int(value) & 0xFFFFFFFFFFFFFFFF


def probe_items(batches: Iterator[pd.DataFrame], opts: ProbeOptions) -> Iterator[pd.DataFrame]:
    """`mapInPandas` body: column `item_json` in, `PROBE_SCHEMA` rows out."""
    for batch in batches:
        rows = [probe_row(item_from_json(text), opts) for text in batch["item_json"]]
        yield pd.DataFrame(rows, columns=PROBE_SCHEMA.names)


def plan_shards(frame_count: int, shard_frames: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """Split [0, frame_count) into shards.

    Returns:
        (frame_start, frame_stop, own_start, own_stop) per shard: each frame is owned by exactly one
        shard; the decode range adds `overlap` frames of context on each side, clipped to the video.
    """
    shards = []
    for own_start in range(0, frame_count, shard_frames):
        own_stop = min(own_start + shard_frames, frame_count)
        shards.append(
            (max(0, own_start - overlap), min(frame_count, own_stop + overlap), own_start, own_stop)
        )
    return shards
