"""Stage `qa`: per-episode quality flags and evidence pages (groupBy(episode_id).applyInPandas) into `qa`.

Each episode's light rows (frames, camera poses, hands, intrinsics, sparse points, actions, its
videos row, and its `robot_actions` when retargeting has run: the arms drawn beside the hands) are
stacked into one group (`udfs.multi_output`); the executor decodes the video
itself for the overlay and writes OUTPUT/qa/<episode_id>/ (index.html, overlay.mp4, thumb.jpg).
After each batch the driver rewrites the batch index OUTPUT/qa/index.html from the small `qa`,
`videos`, `quarantine` and `runs` tables.
"""

from __future__ import annotations

import logging
import os
from functools import partial

import pandas as pd
from pyspark.sql import functions as F

from jobs.cost import stage_costs
from jobs.stage import (
    EpisodeOutcome,
    Stage,
    StageContext,
    apply_per_episode,
    read_stacked,
    write_guarded,
)
from jobs.tables import Layout, Lineage, exists, read
from schemas.tables import QA, QUARANTINE, VIDEOS
from udfs.qa_report import QA_INPUTS, ROBOT_INPUT, index_page, qa_unit

__all__ = ["INDEX_NAME", "STAGE", "index_path", "process", "write_index"]

logger = logging.getLogger(__name__)

#: File name of the batch index inside OUTPUT/qa.
INDEX_NAME = "index.html"


def index_path(layout: Layout) -> str:
    """OUTPUT/qa/index.html."""
    return os.path.join(layout.qa, INDEX_NAME)


def _unchecked(latest: pd.DataFrame) -> dict[str, str]:
    """{episode: why it has no qa row}: the first stage whose latest status is failed, with its error."""
    failed = latest[latest["status"] == "failed"].sort_values("finished")
    return {
        r.episode_id: f"{r.stage} failed: {r.error}"
        for r in failed.drop_duplicates("episode_id").itertuples()
    }


def write_index(ctx: StageContext) -> str:
    """Write the batch index from the `qa`, `videos`, `quarantine` and `runs` tables; returns its path.

    Its cost table is `stage_costs` of the latest attempt per episode and stage (what the current
    outputs cost); this batch's qa rows are recorded after it.
    """
    cols = [c for c in QA.columns if c != "report_path"]
    qa = read(ctx.spark, ctx.layout, QA).select(*cols).toPandas()
    videos = (
        read(ctx.spark, ctx.layout, VIDEOS)
        .select("episode_id", "source_path", "duration_s", "frame_count")
        .toPandas()
    )
    quarantine = (
        read(ctx.spark, ctx.layout, QUARANTINE).select("source_path", "reason_code", "message").toPandas()
    )
    episodes = videos[["episode_id", "source_path"]].merge(qa, on="episode_id", how="left")
    latest = ctx.latest_runs()
    reasons = _unchecked(latest)
    episodes["unchecked"] = [
        reasons.get(e, "not checked yet") if pd.isna(ok) else None
        for e, ok in zip(episodes["episode_id"], episodes["passed"], strict=True)
    ]
    os.makedirs(ctx.layout.qa, exist_ok=True)
    path = index_path(ctx.layout)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(index_page(episodes, quarantine, stage_costs(latest, videos)))
    logger.info("qa index: %s (%d episodes, %d quarantined)", path, len(episodes), len(quarantine))
    return path


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Check the episodes, write their pages and `qa` rows, then the batch index."""
    tables = (*QA_INPUTS, ROBOT_INPUT) if exists(ctx.layout, ROBOT_INPUT) else QA_INPUTS
    inputs = read_stacked(ctx, episodes, tables, {}).where(F.col("episode_id").isin(episodes))
    unit = partial(qa_unit, opts=ctx.cfg.qa, qa_root=os.path.abspath(ctx.layout.qa))
    outcomes = write_guarded(ctx, lineage, episodes, apply_per_episode(inputs, episodes, unit, (QA,)), QA)
    write_index(ctx)
    return outcomes


STAGE = Stage(
    name="qa",
    version="3",
    upstream="actions",
    # The page draws the retargeted arms: a change of robots or retargeting renders it again.
    config_sections=("qa", "embodiments", "retarget"),
    outputs=(QA,),
    process=process,
)
