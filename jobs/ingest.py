"""Stage `ingest`: list inputs, probe them in parallel, de-duplicate, write videos/shards/quarantine.

Nothing is lost: every listed input ends as a `videos` row (an episode) or a `quarantine` row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

import pandas as pd

from jobs.stage import EpisodeOutcome, StageContext, now
from jobs.tables import Lineage, read, write
from schemas.base import spark_schema
from schemas.tables import QUARANTINE, SHARDS, VIDEOS
from udfs.ingest import PROBE_SCHEMA, item_to_json, plan_shards, probe_items, to_uint64
from udfs.media.dedup import find_duplicates
from udfs.media.inputs import InputItem, list_inputs
from udfs.media.probe import content_size

__all__ = ["IngestResult", "STAGE_NAME", "STAGE_VERSION", "run"]

logger = logging.getLogger(__name__)

STAGE_NAME = "ingest"
STAGE_VERSION = "2"
EPISODE_ID_HEX = 16


@dataclass(frozen=True)
class IngestResult:
    """What ingest did: per-episode outcomes, the episodes in this run's scope, quarantined count."""

    outcomes: list[EpisodeOutcome]
    episodes: list[str]
    quarantined: int


def run(ctx: StageContext, lineage: Lineage, input_spec: str, force: bool) -> IngestResult:
    """Ingest every input under `input_spec`.

    With `force=False`, inputs already ingested with the same config (same path and size) are kept.
    """
    started = now()
    items, rejected = list_inputs(input_spec, ctx.cfg.ingest.video_extensions)
    logger.info("listed inputs=%d rejected=%d spec=%s", len(items), len(rejected), input_spec)
    videos = (
        read(ctx.spark, ctx.layout, VIDEOS)
        .select("episode_id", "source_path", "size_bytes", "content_sha256", "phashes", "config_hash")
        .toPandas()
    )
    todo, kept = _split_resumable(items, videos, lineage.config_hash, force, ctx)
    probes = _probe(ctx, todo)

    ok = probes[probes["ok"]].copy()
    ok["episode_id"] = ok["content_sha256"].str[:EPISODE_ID_HEX]
    existing = videos[~videos["source_path"].isin(probes["source_path"])]
    dups = find_duplicates(
        [(r.source_path, r.content_sha256, [to_uint64(h) for h in r.phashes]) for r in ok.itertuples()],
        [(r.source_path, r.content_sha256, [to_uint64(h) for h in r.phashes]) for r in existing.itertuples()],
        ctx.cfg.ingest.near_duplicate_max_hamming,
    )
    quarantine = _quarantine_rows(probes, dups, rejected)
    ok = ok[~ok["source_path"].isin(quarantine["source_path"])]

    # Episodes that used to come from a path now quarantined are removed with their shards.
    stale = videos[videos["source_path"].isin(quarantine["source_path"])]["episode_id"].tolist()
    episode_keys = ok["episode_id"].tolist() + stale
    spark = ctx.spark
    write(spark.createDataFrame(ok[VIDEOS.columns], VIDEOS.spark), ctx.layout, VIDEOS, episode_keys, lineage)
    write(
        spark.createDataFrame(_shard_rows(ok, ctx), SHARDS.spark), ctx.layout, SHARDS, episode_keys, lineage
    )
    write(
        spark.createDataFrame(quarantine[QUARANTINE.columns], QUARANTINE.spark),
        ctx.layout, QUARANTINE,
        quarantine["source_path"].tolist() + ok["source_path"].tolist(),
        lineage,
    )  # fmt: skip

    finished = now()
    outcomes = [
        EpisodeOutcome(r.episode_id, "ok", 1, None, started, finished, r.unit_s, r.unit_cpu_s)
        for r in ok.itertuples()
    ]
    outcomes += [EpisodeOutcome(e, "skipped", 0, None, started, finished) for e in kept]
    logger.info("ingest episodes=%d skipped=%d quarantined=%d", len(ok), len(kept), len(quarantine))
    return IngestResult(outcomes, sorted(set(ok["episode_id"]) | set(kept)), len(quarantine))


def _split_resumable(
    items: list[InputItem], videos: pd.DataFrame, config_hash: str, force: bool, ctx: StageContext
) -> tuple[list[InputItem], list[str]]:
    """(items to probe, episode ids kept as they are) — resume keeps same path, size and config."""
    if force:
        return items, []
    quarantine = read(ctx.spark, ctx.layout, QUARANTINE).select("source_path", "size_bytes", "config_hash")
    done = pd.concat([videos[["source_path", "size_bytes", "config_hash"]], quarantine.toPandas()])
    done_keys = {(r.source_path, r.size_bytes, r.config_hash) for r in done.itertuples()}
    episode_of = dict(zip(videos["source_path"], videos["episode_id"], strict=True))
    todo, kept = [], []
    for item in items:
        if (item.path, content_size(item), config_hash) in done_keys:
            if item.path in episode_of:
                kept.append(episode_of[item.path])
        else:
            todo.append(item)
    return todo, kept


def _probe(ctx: StageContext, items: list[InputItem]) -> pd.DataFrame:
    """Probe items in parallel on the cluster, one task per few items; returns PROBE_SCHEMA rows."""
    if not items:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in PROBE_SCHEMA.names}).astype(
            {"ok": bool}
        )
    spark = ctx.spark
    n_tasks = max(1, min(len(items), 4 * spark.sparkContext.defaultParallelism))
    rows = spark.createDataFrame(pd.DataFrame({"item_json": [item_to_json(i) for i in items]}))
    probed = rows.repartition(n_tasks).mapInPandas(
        partial(probe_items, opts=ctx.cfg.ingest.probe), spark_schema(PROBE_SCHEMA)
    )
    out = probed.toPandas()
    out["ok"] = out["ok"].astype(bool)
    return out


def _quarantine_row(
    path: str, reason: str, message: str, size: int | None = None, sha: str | None = None,
    dup: str | None = None,
) -> dict:
    return {"source_path": path, "reason_code": reason, "message": message, "size_bytes": size,
            "content_sha256": sha, "duplicate_of": dup}  # fmt: skip


def _quarantine_rows(probes: pd.DataFrame, dups: dict, rejected: list) -> pd.DataFrame:
    """QUARANTINE rows for failed probes, duplicates and inputs rejected at listing."""
    rows = [
        _quarantine_row(r.source_path, r.reason_code, r.message, r.size_bytes, r.content_sha256)
        for r in probes[~probes["ok"]].itertuples()
    ]
    by_path = probes.set_index("source_path")
    for path, (reason, duplicate_of, message) in dups.items():
        size, sha = by_path.at[path, "size_bytes"], by_path.at[path, "content_sha256"]
        rows.append(_quarantine_row(path, reason, message, size, sha, duplicate_of))
    rows += [_quarantine_row(r.path, r.reason_code, r.message) for r in rejected]
    return pd.DataFrame(rows, columns=QUARANTINE.columns)


def _shard_rows(ok: pd.DataFrame, ctx: StageContext) -> pd.DataFrame:
    opts = ctx.cfg.ingest
    rows = [
        {"episode_id": r.episode_id, "shard_idx": i, "source_path": r.source_path, "kind": r.kind,
         "decoder": r.decoder, "frame_start": a, "frame_stop": b, "own_start": c, "own_stop": d}
        for r in ok.itertuples()
        for i, (a, b, c, d) in enumerate(
            plan_shards(int(r.frame_count), opts.shard_frames, opts.shard_overlap_frames)
        )
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=SHARDS.columns)
