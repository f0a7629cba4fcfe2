"""Stage `actions`: the action timeline per episode and wearer hand (cogroup per episode) into `actions`.

Inputs are light columns only: `frames` (times) with the episode's `videos.task_text`, and
`hands_world` (world keypoints per frame and identity). An episode whose `hands_world` has no rows
(no hand seen) gets `missing` segments over all its frames.
"""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, cogroup_per_episode, write_guarded
from jobs.tables import Lineage, read
from schemas.tables import ACTIONS, FRAMES, HANDS_WORLD, VIDEOS
from udfs.actions import FRAME_COLUMNS, HAND_COLUMNS, episode_actions

__all__ = ["STAGE", "process"]

logger = logging.getLogger(__name__)


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Segment the episodes' wearer hands into actions and write `actions`."""
    in_scope = F.col("episode_id").isin(episodes)
    tasks = read(ctx.spark, ctx.layout, VIDEOS).where(in_scope).select("episode_id", "task_text")
    frames = read(ctx.spark, ctx.layout, FRAMES).where(in_scope).select("episode_id", "frame_idx", "ts_s")
    frames = frames.join(tasks, "episode_id", "left").select(*FRAME_COLUMNS)
    hands = read(ctx.spark, ctx.layout, HANDS_WORLD).where(in_scope).select(*HAND_COLUMNS)
    unit = partial(episode_actions, opts=ctx.cfg.actions)
    result = cogroup_per_episode(frames, hands, episodes, unit, ACTIONS.arrow)
    return write_guarded(ctx, lineage, episodes, result, ACTIONS)


STAGE = Stage(
    name="actions",
    version="1",
    upstream="fusion",
    config_sections=("actions",),
    outputs=(ACTIONS,),
    process=process,
)
