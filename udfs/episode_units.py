"""One video through the per-episode stage units without Spark: priors, hands, tracking, ba, completion.

The Spark stages call the same unit functions on the same stacked pandas frames; this runs them in
one process for tests and benchmarks on real or rendered clips, with the configuration's defaults
unless given. Shards are planned as ingest plans them (`ingest.shard_frames`, `shard_overlap`).
A `StageSeconds` given to `episode_tables` collects each stage's wall and CPU seconds (the benches).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pandas as pd

from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.features import FeatureOptions
from schemas.tables import FEATURES, FRAMES
from udfs.guard import cpu_seconds
from udfs.hands import hands_for_shard
from udfs.ingest import plan_shards
from udfs.media.decode import decode_frames
from udfs.multi_output import split_tables, stack_tables
from udfs.options import CameraTrackingOptions, DecodeOptions, HandsOptions
from udfs.priors import shard_outputs
from udfs.tracking import (
    BA_INPUTS,
    BA_OUTPUTS,
    COMPLETION_INPUTS,
    TRACKING_OUTPUTS,
    ba_unit,
    completion_unit,
    feature_view_of,
    tracking_unit,
)

__all__ = ["STAGES", "StageSeconds", "episode_tables", "shard_rows"]

logger = logging.getLogger(__name__)

#: Makes the `hands_cam` rows of one shard row (the hands stage by default).
HandsUnit = Callable[[pd.DataFrame], pd.DataFrame]

#: What `StageSeconds` times, in order: counting the frames (as ingest's probe does), then the stages.
STAGES = ("ingest", "priors", "hands", "tracking", "ba", "completion")


@dataclass
class StageSeconds:
    """Wall and CPU seconds per stage (of `STAGES`), summed over shards and calls.

    CPU seconds are the process's (every thread, e.g. decode prefetch) and its waited-for children's.
    """

    wall_s: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the seconds of the block to stage `name`."""
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        try:
            yield
        finally:
            self.wall_s[name] = self.wall_s.get(name, 0.0) + time.perf_counter() - wall0
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + cpu_seconds() - cpu0


def shard_rows(
    path: str,
    calibration_json: str | None = None,
    shard_frames: int = 256,
    overlap: int = 8,
    episode: str = "ep",
) -> list[pd.DataFrame]:
    """The one-row `shards` frames (plus `calibration_json`) of a video, planned as ingest plans them.

    The frames are counted by decoding them all (ingest's probe also counts).
    """
    n = len(decode_frames(path, 0, None, DecodeOptions()).frame_idx)
    return [
        pd.DataFrame([{
            "episode_id": episode, "shard_idx": i, "source_path": path, "kind": "video", "decoder": "decord",
            "frame_start": start, "frame_stop": stop, "own_start": own_start, "own_stop": own_stop,
            "calibration_json": calibration_json,
        }])  # fmt: skip
        for i, (start, stop, own_start, own_stop) in enumerate(plan_shards(n, shard_frames, overlap))
    ]


def episode_tables(
    path: str,
    calibration_json: str | None = None,
    hands_unit: HandsUnit | None = None,
    shard_frames: int = 256,
    overlap: int = 8,
    seconds: StageSeconds | None = None,
    completion: CompletionOptions | None = None,
) -> dict[str, pd.DataFrame]:
    """Every camera-pose table of one episode, and its `frames` and `hands_cam` rows, by table name.

    Args:
        path: the video.
        calibration_json: `videos.calibration_json` (None: the 70-degree prior).
        hands_unit: `hands_cam` rows of a shard row; None: the hands stage (`hands_for_shard`, defaults).
            Their boxes mask the hands out of tracking, as in the pipeline.
        shard_frames: frames owned per shard.
        overlap: decoded frames of context on each side of a shard.
        seconds: when given, each stage's seconds are added to it (`STAGES`).
        completion: options of the ba and completion units (None: the defaults).

    Returns:
        `frames`, `hands_cam`, `tracks`, `cameras`, `keyframes`, `map_points`, `keyframe_poses`,
        `ba_points`, `ba_cameras` and `camera_poses` (episode id "ep").
    """
    hands_unit = hands_unit or (lambda shard: hands_for_shard(shard, HandsOptions(), DecodeOptions()))
    timed = (seconds if seconds is not None else StageSeconds()).stage
    with timed("ingest"):
        shards = shard_rows(path, calibration_json, shard_frames, overlap)
    frames, features, hands = [], [], []
    for shard in shards:
        with timed("priors"):
            out = split_tables(shard_outputs(shard, DecodeOptions(), FeatureOptions()), [FRAMES, FEATURES])
        frames.append(out["frames"])
        features.append(out["features"])
        with timed("hands"):
            hands.append(hands_unit(shard))
    frames, features, hands = (pd.concat(x, ignore_index=True) for x in (frames, features, hands))
    view = feature_view_of(features, frames, hands, calibration_json)
    opts, copts = CameraTrackingOptions(), completion or CompletionOptions()
    with timed("tracking"):
        tables = split_tables(tracking_unit(view, opts), TRACKING_OUTPUTS)
    with timed("ba"):
        ba_inputs = stack_tables([(s, tables[s.name]) for s in BA_INPUTS])
        tables |= split_tables(ba_unit(ba_inputs, copts), BA_OUTPUTS)
    given = {"feature_view": view, "frames": frames} | tables
    with timed("completion"):
        poses = completion_unit(stack_tables([(s, given[s.name]) for s in COMPLETION_INPUTS]), copts, opts)
    logger.info("episode units: %s, %d frames, %d hands_cam rows", path, len(frames), len(hands))
    return tables | {"frames": frames, "hands_cam": hands, "camera_poses": poses.sort_values("frame_idx")}
