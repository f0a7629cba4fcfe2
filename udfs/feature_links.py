"""Join per-shard KLT tracks into episode tracks: link ids where neighbouring shards see one point.

Every shard tracks its frames, overlap included, with its own id range. In a frame that two shards
both decoded, a track of one and a track of the other that are mutual nearest neighbours within
`max_px` are the same image point; over all shared frames each pair collects votes, pairs are
accepted one-to-one by votes (so no frame ends with an id twice), and a union-find gives every
linked chain the id of its oldest member. The episode's sequence takes each frame from the shard
that owns it, with linked ids.

This is id bookkeeping over `FrameFeatures` (no image is touched); it sits with the adapters
because it exists only to undo sharding.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
from scipy.spatial import cKDTree

from pose_core.camera_poses.features import FrameFeatures
from pose_core.errors import EgolakeError

__all__ = ["ShardFeatures", "link_shards"]

logger = logging.getLogger(__name__)

#: One shard's features: `frame_idx -> FrameFeatures` (decoded frames) and its owned range.
ShardFeatures = tuple[Mapping[int, FrameFeatures], int, int]


class _UnionFind:
    """Union-find over int64 ids; the root of a set is its smallest id (the oldest shard's)."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        root = x
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while x != root:  # path compression
            self.parent[x], x = root, self.parent.get(x, x)
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _pair_votes(
    older: Mapping[int, FrameFeatures], newer: Mapping[int, FrameFeatures], max_px: float
) -> dict[tuple[int, int], int]:
    """Per (older id, newer id): the shared frames in which the two are mutual nearest neighbours."""
    votes: dict[tuple[int, int], int] = {}
    for f in sorted(set(older) & set(newer)):
        a, b = older[f], newer[f]
        if len(a.track_ids) == 0 or len(b.track_ids) == 0:
            continue
        dist_ab, nn_ab = cKDTree(a.uv_px).query(b.uv_px, distance_upper_bound=max_px)
        _, nn_ba = cKDTree(b.uv_px).query(a.uv_px, distance_upper_bound=max_px)
        for j in np.nonzero(np.isfinite(dist_ab))[0]:
            i = nn_ab[j]
            if nn_ba[i] == j:
                key = (int(a.track_ids[i]), int(b.track_ids[j]))
                votes[key] = votes.get(key, 0) + 1
    return votes


def link_shards(shards: list[ShardFeatures], max_px: float) -> tuple[list[FrameFeatures], int]:
    """The episode's per-frame features with track ids linked across shard boundaries.

    Args:
        shards: per shard in frame order, its decoded frames' features and owned range
            ``[own_start, own_stop)``; owned ranges must tile ``0..F-1``.
        max_px: largest distance, pixels, at which two shards' tracks in a shared frame are one point.

    Returns:
        ``FrameFeatures`` for frames ``0..F-1`` and the number of links made.

    Raises:
        EgolakeError: owned ranges do not tile the episode or an owned frame
            has no features.
    """
    uf = _UnionFind()
    links = 0
    for (older, _, _), (newer, _, _) in zip(shards, shards[1:], strict=False):
        used_old: set[int] = set()
        used_new: set[int] = set()
        for (a, b), _ in sorted(_pair_votes(older, newer, max_px).items(), key=lambda kv: (-kv[1], kv[0])):
            if a in used_old or b in used_new:
                continue
            used_old.add(a)
            used_new.add(b)
            uf.union(a, b)
            links += 1
    out: list[FrameFeatures] = []
    for feats, own_start, own_stop in shards:
        for f in range(own_start, own_stop):
            if f != len(out) or f not in feats:
                raise EgolakeError(f"no features for frame {len(out)} (shard owning {own_start}..)")
            feat = feats[f]
            ids = np.fromiter((uf.find(int(t)) for t in feat.track_ids), np.int64, len(feat.track_ids))
            out.append(feat.with_track_ids(ids))
    logger.debug("linked %d tracks over %d shard boundaries", links, max(len(shards) - 1, 0))
    return out, links
