"""One Spark task per episode in the per-episode stages, whatever adaptive execution would merge.

A per-episode stage groups its batch's rows by episode. Those rows are light (paths, features, poses,
never pixels), so adaptive query execution (on by default) coalesces the grouping shuffle's partitions
towards its 64 MB advisory size: a batch of eight episodes became one task on one core while the
others idled. Hash-partitioning by `episode_id` into n partitions (which adaptive execution leaves
alone) still puts two ids in one task wherever their hashes collide. So each episode of a batch gets
an integer slot chosen so that Spark's hash partitioning sends the k-th episode to partition k mod n;
the stage groups by the slot, which that partitioning already satisfies: no further shuffle, nothing to
merge (`tests/jobs/test_slots.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["SLOT", "hash_partition", "slot_values", "spread", "task_count"]

#: The column holding an episode's slot (dropped before a unit sees its rows).
SLOT = "_slot"

#: Tasks a batch may use per core of the session (more episodes than that share tasks).
TASKS_PER_CORE = 4

_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _murmur3_mix(h1: int, k1: int) -> int:
    k1 = (_rotl32((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32
    return (_rotl32(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def hash_partition(value: int, n: int) -> int:
    """The partition `repartition(n, col)` sends a LongType `value` to, computed without a Spark job.

    Spark's hash partitioning is `pmod(murmur3_x86_32(value, seed 42), n)` (`HashPartitioning`,
    `Murmur3Hash.hashLong`: the low then the high 32 bits mixed, finalised with length 8);
    tests/jobs/test_slots.py checks it against Spark's own `hash()`.
    """
    v = value & 0xFFFFFFFFFFFFFFFF
    h = _murmur3_mix(_murmur3_mix(42, v & _M32), v >> 32) ^ 8
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & _M32
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return (h - (1 << 32) if h >> 31 else h) % n


def slot_values(n: int, count: int) -> list[int]:
    """`count` distinct integers, the k-th one sent to partition k mod n by Spark's hash partitioning."""
    by_partition: dict[int, list[int]] = {p: [] for p in range(n)}
    value = 0
    while any(len(by_partition[p]) < -(-count // n) for p in range(min(n, count))):
        by_partition[hash_partition(value, n)].append(value)
        value += 1
    return [by_partition[k % n][k // n] for k in range(count)]


def task_count(df: DataFrame, episodes: int) -> int:
    """Tasks for a batch of `episodes`: one each, at most `TASKS_PER_CORE` per core of `df`'s session."""
    cores = df.sparkSession.sparkContext.defaultParallelism
    return max(1, min(episodes, TASKS_PER_CORE * cores))


def spread(df: DataFrame, episodes: Sequence[str]) -> DataFrame:
    """`df`'s rows of `episodes` with their `SLOT`, the k-th episode's in partition k mod n (`task_count`).

    Call it once per input of a stage (each gets its own small slot table, so two spread inputs of
    one cogroup are not a self-join).
    """
    n = task_count(df, len(episodes))
    slots = pd.DataFrame({"episode_id": list(episodes), SLOT: slot_values(n, len(episodes))})
    table = F.broadcast(df.sparkSession.createDataFrame(slots, f"episode_id string, {SLOT} long"))
    return df.join(table, "episode_id").repartition(n, SLOT)
