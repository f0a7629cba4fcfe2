"""Exact and near-duplicate detection over content hashes and sampled-frame perceptual hashes."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from udfs.media.phash import sample_positions

__all__ = ["DedupOptions", "aligned_mean_hamming", "find_duplicates"]

logger = logging.getLogger(__name__)

Candidate = tuple[Any, str, Sequence[int]]


@dataclass(frozen=True)
class DedupOptions:
    """Near-duplicate threshold.

    Attributes:
        max_mean_hamming: two clips whose aligned sampled-frame pHashes differ by at most this many
            bits (of 64) on average are near duplicates. Re-encodes of one clip measure ~0-4 bits,
            unrelated textured clips ~32.
    """

    # Mean Hamming distance (bits of 64) at or below which two clips are near duplicates.
    max_mean_hamming: float = 10.0


def aligned_mean_hamming(a: Sequence[int], b: Sequence[int]) -> float:
    """Mean Hamming distance of two hash lists aligned by relative position.

    Both lists are sampled at `k = min(len(a), len(b))` relative positions `(i + 0.5) / k`.

    Returns:
        Mean differing bits over the `k` pairs; `inf` when either list is empty.
    """
    distances = _distances(np.asarray(a, dtype=np.uint64), np.asarray([b], dtype=np.uint64))
    return float(distances[0])


def _distances(hashes: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Aligned mean Hamming distance of one `(m,)` hash list to each row of `(G, n)` lists."""
    m, n = len(hashes), group.shape[1]
    if m == 0 or n == 0:
        return np.full(len(group), np.inf)
    k = min(m, n)
    xor = hashes[sample_positions(m, k)][None, :] ^ group[:, sample_positions(n, k)]
    return np.bitwise_count(xor).mean(axis=1)


class _Index:
    """Kept clips, searchable by SHA-256 and by aligned pHash distance."""

    def __init__(self) -> None:
        self.by_sha: dict[str, Any] = {}
        self.groups: dict[int, tuple[list[Any], list[Sequence[int]]]] = {}

    def add(self, key: Any, sha: str, hashes: Sequence[int]) -> None:
        self.by_sha.setdefault(sha, key)
        keys, lists = self.groups.setdefault(len(hashes), ([], []))
        keys.append(key)
        lists.append(hashes)

    def match(self, key: Any, sha: str, hashes: Sequence[int], limit: float) -> tuple[str, Any, str] | None:
        if sha in self.by_sha:
            other = self.by_sha[sha]
            return "duplicate_exact", other, f"{key} is byte-identical to {other} (sha256 {sha[:12]}...)"
        best: tuple[float, Any] | None = None
        query = np.asarray(hashes, dtype=np.uint64)
        for keys, lists in self.groups.values():
            distances = _distances(query, np.asarray(lists, dtype=np.uint64))
            i = int(np.argmin(distances))
            if distances[i] <= limit and (best is None or distances[i] < best[0]):
                best = (float(distances[i]), keys[i])
        if best is None:
            return None
        return (
            "duplicate_near",
            best[1],
            f"{key} looks like {best[1]}: sampled frames differ by {best[0]:.1f} of 64 pHash bits "
            f"on average (threshold {limit})",
        )


def find_duplicates(
    candidates: Sequence[Candidate], existing: Sequence[Candidate], max_mean_hamming: float
) -> dict[Hashable, tuple[str, Any, str]]:
    """Find exact and near duplicates among new clips and against earlier ones.

    Args:
        candidates: new clips `(key, content_sha256, phashes)`; phashes are the 64-bit hashes of
            frames sampled evenly over the clip.
        existing: clips kept by earlier runs, same layout; they are always kept.
        max_mean_hamming: near-duplicate threshold in bits (see `DedupOptions`).

    Returns:
        `{key: (reason_code, duplicate_of_key, message)}` for every candidate to drop: `duplicate_exact`
        (same SHA-256) or `duplicate_near` (aligned mean Hamming distance <= threshold). A
        candidate matching an existing clip is a duplicate of it; within the batch the first key in
        sorted order is kept and later ones point to it.
    """
    index = _Index()
    for key, sha, hashes in existing:
        index.add(key, sha, hashes)
    result: dict[Hashable, tuple[str, Any, str]] = {}
    for key, sha, hashes in sorted(candidates, key=lambda c: c[0]):
        found = index.match(key, sha, hashes, max_mean_hamming)
        if found is None:
            index.add(key, sha, hashes)
        else:
            result[key] = found
    logger.info("dedup: %d of %d candidates are duplicates", len(result), len(candidates))
    return result
