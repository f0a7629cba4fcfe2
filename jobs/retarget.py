"""Stage `retarget`: wearer hands to robot joint trajectories per episode: `robot_actions`, `robot_quality`.

Inputs are light columns only: `frames` (the time axis) with each frame's camera centre from
`camera_poses` (left join: hands beyond a human arm's reach of it are not followed), and `hands_world`
(world keypoints of the retargeted identities, gap-filled or not, the episode's scale and gravity), in
one cogroup per episode. The robots are `cfg.embodiments`
(`--set embodiments=[so100,panda]`); with none the stage writes nothing and says so. Profiles and URDFs
are loaded on the driver first, so a missing profile or URDF fails the batch with an error naming it
before any Spark job starts. The profiles' text is part of the stage's config hash (`inputs_digest`).
"""

from __future__ import annotations

import logging
from functools import partial

from pyspark.sql import functions as F

from jobs.stage import EpisodeOutcome, Stage, StageContext, cogroup_per_episode, now, write_guarded
from jobs.tables import Lineage, exists, read
from schemas.tables import CAMERA_POSES, FRAMES, HANDS_WORLD, ROBOT_ACTIONS, ROBOT_QUALITY
from udfs.retarget import (
    CAMERA_COLUMN,
    FRAME_COLUMNS,
    GRAVITY_COLUMN,
    HAND_COLUMNS,
    OUTPUT_SCHEMA,
    SCALE_COLUMNS,
    load_embodiments,
    profiles_digest,
    retarget_named,
)

_OPTIONAL_HAND_COLUMNS = ("filled", GRAVITY_COLUMN, *SCALE_COLUMNS)

__all__ = ["STAGE", "process"]

logger = logging.getLogger(__name__)


def process(ctx: StageContext, lineage: Lineage, episodes: list[str]) -> list[EpisodeOutcome]:
    """Retarget the episodes' wearer hands to every configured embodiment and write `robot_actions`."""
    names, opts = ctx.cfg.embodiments, ctx.cfg.retarget
    if not names:
        logger.info(
            "retarget: no embodiments configured (e.g. --set embodiments=[so100,panda]); "
            "%d episodes, nothing written",
            len(episodes),
        )
        return [EpisodeOutcome(e, "ok", 0, None, now(), now()) for e in episodes]
    for emb in load_embodiments(names, opts):
        logger.info("retarget: %s (%s, %d joints)", emb.name, emb.kind, emb.model.num_joints)
    in_scope = F.col("episode_id").isin(episodes)
    frames = read(ctx.spark, ctx.layout, FRAMES).where(in_scope).select(*FRAME_COLUMNS)
    if exists(ctx.layout, CAMERA_POSES):
        centres = read(ctx.spark, ctx.layout, CAMERA_POSES).where(in_scope)
        centres = centres.select("episode_id", "frame_idx", CAMERA_COLUMN)
        frames = frames.join(centres, ["episode_id", "frame_idx"], "left")
    retargeted = F.col("identity").isin(list(opts.identities))
    hands = read(ctx.spark, ctx.layout, HANDS_WORLD).where(in_scope & retargeted)
    hands = hands.select(*HAND_COLUMNS, *(c for c in _OPTIONAL_HAND_COLUMNS if c in hands.columns))
    unit = partial(retarget_named, names=names, opts=opts)
    result = cogroup_per_episode(frames, hands, episodes, unit, OUTPUT_SCHEMA)
    return write_guarded(ctx, lineage, episodes, result, ROBOT_ACTIONS, ROBOT_QUALITY)


STAGE = Stage(
    name="retarget",
    version="4",
    upstream="fusion",
    config_sections=("embodiments", "retarget"),
    outputs=(ROBOT_ACTIONS, ROBOT_QUALITY),
    process=process,
    inputs_digest=lambda cfg: profiles_digest(cfg.embodiments, cfg.retarget),
)
