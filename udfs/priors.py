"""Per-shard decode pass: one row per owned frame with its presentation time and image quality."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pose_core.errors import EgolakeError
from pose_core.image_quality import frame_quality
from udfs.media.decode import DecodeOptions, iter_frames

__all__ = ["frames_for_shard"]


def frames_for_shard(shard: pd.DataFrame, decode: DecodeOptions) -> pd.DataFrame:
    """Decode one shard (one row of `shards`) once and describe each frame it owns.

    Returns:
        rows of the `frames` table for frames [own_start, own_stop).

    Raises:
        EgolakeError: the decoder returned fewer frames than the shard owns.
    """
    s = shard.iloc[0]
    parts = []
    for chunk in iter_frames(s.source_path, int(s.own_start), int(s.own_stop), decode):
        brightness, sharpness = frame_quality(chunk.frames)
        parts.append(
            pd.DataFrame(
                {
                    "episode_id": s.episode_id,
                    "frame_idx": chunk.frame_idx,
                    "ts_s": chunk.ts_s,
                    "shard_idx": np.int32(s.shard_idx),
                    "width": np.int32(chunk.frames.shape[2]),
                    "height": np.int32(chunk.frames.shape[1]),
                    "brightness": brightness,
                    "sharpness": sharpness,
                }
            )
        )
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    expected = int(s.own_stop) - int(s.own_start)
    if len(out) != expected:
        raise EgolakeError(
            f"{s.source_path}: decoded {len(out)} of {expected} frames in [{s.own_start}, {s.own_stop})"
        )
    return out
