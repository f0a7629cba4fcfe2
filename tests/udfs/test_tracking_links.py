"""Linking KLT track ids across shard boundaries (synthetic FrameFeatures, no video)."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.camera_poses.features import FrameFeatures
from pose_core.errors import EgolakeError
from udfs.feature_links import link_shards


def _scene(n_points: int, n_frames: int, seed: int = 0) -> np.ndarray:
    """Image positions of points drifting right by 2 px a frame, ``(F, N, 2)``."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(20, 600, (n_points, 2))
    return start[None] + np.arange(n_frames)[:, None, None] * np.array([2.0, 0.3])


def _shard(uv: np.ndarray, visible: np.ndarray, frames: range, first_id: int, jitter: float, rng) -> dict:
    """One shard's tracks: points visible in the shard get ids from `first_id` (shard-local numbering)."""
    out = {}
    for f in frames:
        idx = np.nonzero(visible)[0]
        pos = uv[f, idx] + rng.uniform(-jitter, jitter, (len(idx), 2))
        out[f] = FrameFeatures(f, first_id + idx.astype(np.int64), pos.astype(np.float32))
    return out


def test_links_same_points_one_to_one_and_keeps_frame_ids_unique():
    rng = np.random.default_rng(1)
    uv = _scene(200, 60)
    seen_a = np.ones(200, bool)
    seen_b = rng.random(200) < 0.7  # the second shard re-detects 70 % of the points
    a = _shard(uv, seen_a, range(0, 34), 0, 0.0, rng)  # owns 0..29, decodes 4 more
    b = _shard(uv, seen_b, range(26, 60), 1 << 32, 0.3, rng)  # owns 30..59, decodes 4 before
    linked, links = link_shards([(a, 0, 30), (b, 30, 60)], max_px=1.0)
    assert [f.frame_idx for f in linked] == list(range(60))
    assert links == int(seen_b.sum())
    # Every re-detected point continues under its shard-a id; the others keep their shard-b ids.
    ids_30 = linked[30].track_ids
    assert np.array_equal(np.sort(ids_30), np.sort(np.nonzero(seen_b)[0]))
    for feat in linked:
        assert len(np.unique(feat.track_ids)) == len(feat.track_ids)


def test_distant_tracks_are_not_linked():
    rng = np.random.default_rng(2)
    uv = _scene(50, 20)
    a = _shard(uv, np.ones(50, bool), range(0, 12), 0, 0.0, rng)
    shifted = uv + 3.0  # every point of shard b 4.2 px away from its shard-a twin
    b = _shard(shifted, np.ones(50, bool), range(8, 20), 1 << 32, 0.0, rng)
    linked, links = link_shards([(a, 0, 10), (b, 10, 20)], max_px=1.0)
    assert links == 0
    assert linked[10].track_ids.min() >= 1 << 32


def test_gap_in_owned_frames_raises():
    rng = np.random.default_rng(3)
    uv = _scene(10, 20)
    a = _shard(uv, np.ones(10, bool), range(0, 10), 0, 0.0, rng)
    b = _shard(uv, np.ones(10, bool), range(12, 20), 1 << 32, 0.0, rng)
    with pytest.raises(EgolakeError, match="no features for frame 10"):
        link_shards([(a, 0, 10), (b, 12, 20)], max_px=1.0)
