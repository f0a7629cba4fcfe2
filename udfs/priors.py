"""Per-shard decode pass: each shard decoded once into light `frames` rows and KLT `features` rows.

`frames` gets one row per owned frame (presentation time, size, image quality). `features` gets one
row per decoded frame, overlap included (`owned` false there), with the KLT track ids and pixel
positions, so that no later stage decodes the video or recomputes features. Each shard numbers its
tracks from `shard_idx << TRACK_ID_SHIFT`; the tracking stage links ids across shard boundaries on
the overlap frames (`udfs.feature_links`).
"""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pandas as pd

from pose_core.camera_poses.features import FeatureOptions, KltTracker
from pose_core.errors import EgolakeError
from pose_core.image_quality import frame_quality
from schemas.tables import FEATURES, FRAMES
from udfs.media.decode import iter_frames
from udfs.multi_output import stack_tables
from udfs.options import DecodeOptions

__all__ = ["TRACK_ID_SHIFT", "shard_outputs"]

logger = logging.getLogger(__name__)

#: Shard `s` numbers its tracks from `s << TRACK_ID_SHIFT` (2^32 tracks per shard, 2^31 shards).
TRACK_ID_SHIFT = 32


def shard_outputs(shard: pd.DataFrame, decode: DecodeOptions, features: FeatureOptions) -> pd.DataFrame:
    """Decode one shard (one row of `shards`) once: its `frames` and `features` rows, stacked.

    Frames `[frame_start, frame_stop)` are decoded and tracked in order; `frames` rows cover the
    owned frames `[own_start, own_stop)`, `features` rows every decoded frame.

    Returns:
        The two tables stacked (`udfs.multi_output.stack_tables`).

    Raises:
        EgolakeError: the decoder returned fewer frames than the shard decodes.
    """
    s = shard.iloc[0]
    start, stop, own_start, own_stop = (
        int(s.frame_start),
        int(s.frame_stop),
        int(s.own_start),
        int(s.own_stop),
    )
    tracker = KltTracker(features, first_track_id=int(s.shard_idx) << TRACK_ID_SHIFT)
    frame_parts, feature_rows = [], []
    for chunk in iter_frames(s.source_path, start, stop, decode):
        for frame_idx, rgb in zip(chunk.frame_idx, chunk.frames, strict=True):
            ids, uv, desc = tracker.step(int(frame_idx), cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)).to_flat()
            feature_rows.append((int(frame_idx), own_start <= frame_idx < own_stop, ids, uv, desc))
        owned = (chunk.frame_idx >= own_start) & (chunk.frame_idx < own_stop)
        if owned.any():
            frame_parts.append(_frame_rows(s, chunk.frames[owned], chunk.frame_idx[owned], chunk.ts_s[owned]))
    frames = (
        pd.concat(frame_parts, ignore_index=True) if frame_parts else pd.DataFrame(columns=FRAMES.columns)
    )
    if len(feature_rows) != stop - start:
        raise EgolakeError(
            f"{s.source_path}: decoded {len(feature_rows)} of {stop - start} frames in [{start}, {stop})"
        )
    feats = pd.DataFrame(
        {
            "episode_id": s.episode_id,
            "shard_idx": np.int32(s.shard_idx),
            "frame_idx": np.array([r[0] for r in feature_rows], np.int64),
            "owned": np.array([r[1] for r in feature_rows], bool),
            "track_ids": [r[2] for r in feature_rows],
            "uv_px": [r[3] for r in feature_rows],
            "descriptors": [r[4] for r in feature_rows],
        }
    )
    return stack_tables([(FRAMES, frames), (FEATURES, feats)])


def _frame_rows(s: pd.Series, rgb: np.ndarray, frame_idx: np.ndarray, ts_s: np.ndarray) -> pd.DataFrame:
    brightness, sharpness = frame_quality(rgb)
    return pd.DataFrame(
        {
            "episode_id": s.episode_id,
            "frame_idx": frame_idx,
            "ts_s": ts_s,
            "shard_idx": np.int32(s.shard_idx),
            "width": np.int32(rgb.shape[2]),
            "height": np.int32(rgb.shape[1]),
            "brightness": brightness,
            "sharpness": sharpness,
        }
    )
