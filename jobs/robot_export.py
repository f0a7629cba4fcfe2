"""The robot datasets of an export (issues #7, #22): which episodes each takes, what it says of retargeting.

Per embodiment in `robot_actions`, `<export.name>-<embodiment>` takes the usable episodes of the human
dataset that the retarget stage did not refuse (no metric scale), that were retargeted at the dataset's
rate, and whose `robot_quality` row passed `retarget.quality` (valid share, tool position error p95);
the others are left out with the reason, as the human dataset leaves out QA failures. The manifest's
`retarget` block holds the thresholds, the profile's tolerances, each included episode's figures (and
per hand its base pose) and the figures pooled over the dataset's steps; the card shows them.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pandas as pd
from pyspark.sql import functions as F

from jobs.stage import StageContext
from jobs.tables import exists, read
from pose_core.retarget.quality import retarget_figures
from schemas.tables import ROBOT_ACTIONS, ROBOT_QUALITY
from udfs.lerobot.episode import RobotLayout
from udfs.options import ExportOptions
from udfs.retarget import STEP_ERRORS

__all__ = ["retarget_report", "robot_targets"]

logger = logging.getLogger(__name__)

#: The figures of a `robot_quality` row (its counts, fractions, errors and violations; not the tolerances).
_FIGURE_COLUMNS = [
    c for c in ROBOT_QUALITY.columns
    if "_tol_" not in c and (c == "steps" or c.endswith(("_steps", "_fraction", "_m", "_rad", "violations")))
]
_VIOLATIONS = ("limit_violations", "speed_violations", "acceleration_violations")


def _episodes(ctx: StageContext, summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per embodiment and identity: joint names, gripper; per embodiment and episode: hash, rate, refusal."""
    scope = F.col("episode_id").isin(list(summary["episode_id"]))
    rows = read(ctx.spark, ctx.layout, ROBOT_ACTIONS).where(scope)
    arms = (
        rows.groupBy("embodiment", "identity")
        .agg(
            F.first("joint_names", ignorenulls=True).alias("joint_names"),
            F.max(F.col("gripper").isNotNull().cast("int")).alias("gripper"),
        )
        .toPandas()
    )
    episodes = (
        rows.groupBy("embodiment", "episode_id")
        .agg(
            F.first("config_hash").alias("robot_config_hash"),
            F.max("control_fps").alias("control_fps"),
            F.first("refused", ignorenulls=True).alias("refused"),
        )
        .toPandas()
    )
    return arms[arms["joint_names"].notna()].sort_values(["embodiment", "identity"]), episodes


def _quality_failures(ctx: StageContext, episodes: list[str]) -> dict[tuple[str, str], str]:
    """{(embodiment, episode): why its retargeting failed retarget.quality} (refusals are said elsewhere)."""
    if not exists(ctx.layout, ROBOT_QUALITY):
        return {}
    rows = (
        read(ctx.spark, ctx.layout, ROBOT_QUALITY)
        .where(F.col("episode_id").isin(episodes) & ~F.col("passed"))
        .select("embodiment", "episode_id", "flags", "reasons")
        .toPandas()
    )
    return {
        (r.embodiment, r.episode_id): "retarget quality: " + "; ".join(r.reasons)
        for r in rows.itertuples()
        if "refused" not in list(r.flags)
    }


def robot_targets(
    ctx: StageContext, opts: ExportOptions, summary: pd.DataFrame, excluded: dict[str, str]
) -> list[tuple[RobotLayout, pd.DataFrame, dict[str, str]]]:
    """Per embodiment in `robot_actions`: its layout, the usable episodes it takes, its exclusions.

    Episodes the retarget stage refused for an embodiment (`refused`, e.g. no metric scale) or whose
    `robot_quality` failed are left out of its dataset with the reason. The dataset's rate is the
    embodiment's `control_fps` (the rate most of its episodes were retargeted at); an episode retargeted at
    another rate (the profile changed and retarget has not run again) is left out, saying so.
    """
    if not opts.robot_datasets or summary.empty or not exists(ctx.layout, ROBOT_ACTIONS):
        return []
    arms, episodes = _episodes(ctx, summary)
    failures = _quality_failures(ctx, list(summary["episode_id"]))
    targets = []
    for embodiment, mine in arms.groupby("embodiment"):
        grip = [bool(g) for g in mine["gripper"]]
        names = tuple(
            tuple([*j, "gripper"] if g else list(j)) for j, g in zip(mine["joint_names"], grip, strict=True)
        )
        own = episodes[episodes["embodiment"] == embodiment]
        rates = own.loc[own["refused"].isna(), "control_fps"]
        fps = int(rates.mode().max() if len(rates) else own["control_fps"].max())
        layout = RobotLayout(str(embodiment), tuple(mine["identity"]), names, tuple(grip), fps)
        why = {e: reason for (emb, e), reason in failures.items() if emb == embodiment}
        refused = own[own["refused"].notna()]
        why.update({r.episode_id: f"retarget refused: {r.refused}" for r in refused.itertuples()})
        why.update(
            {
                r.episode_id: f"robot_actions at {r.control_fps} Hz, the dataset at {fps} Hz: rerun retarget"
                for r in own[own["refused"].isna() & (own["control_fps"] != fps)].itertuples()
            }
        )
        why.update(
            {
                e: f"no robot_actions rows for {embodiment}"
                for e in summary["episode_id"]
                if e not in set(own["episode_id"])
            }
        )
        ok = summary.merge(own[["episode_id", "robot_config_hash"]], on="episode_id")
        targets.append((layout, ok[~ok["episode_id"].isin(why)].reset_index(drop=True), {**excluded, **why}))
    return targets


def _none_for_nan(record: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


def retarget_report(ctx: StageContext, robot: RobotLayout, episodes: list[str]) -> dict[str, Any]:
    """The manifest's `retarget` block of one robot dataset (see the module's docstring).

    Returns:
        ``{"thresholds", "tolerances", "dataset": pooled figures, "episodes": {id: figures + hands}}``;
        figures as `pose_core.retarget.quality.RetargetFigures.to_dict` (metres, radians).
    """
    scope = F.col("episode_id").isin(episodes) & (F.col("embodiment") == robot.embodiment)
    quality = read(ctx.spark, ctx.layout, ROBOT_QUALITY).where(scope).toPandas().sort_values("episode_id")
    steps = read(ctx.spark, ctx.layout, ROBOT_ACTIONS).where(scope)
    steps = steps.select("hand_state", "reachable", *STEP_ERRORS).toPandas()
    violations = tuple(int(quality[k].sum()) for k in _VIOLATIONS)
    errors = [steps[c].to_numpy(float) for c in STEP_ERRORS]
    reachable = steps["reachable"].fillna(False).to_numpy(bool)
    pooled = retarget_figures(steps["hand_state"].to_numpy(object), reachable, *errors, violations)
    tolerance_columns = ["position_tol_m", "approach_tol_rad", "closing_tol_rad"]
    tolerances = quality[tolerance_columns].iloc[:1].to_dict("records")
    return {
        "thresholds": {
            "min_valid_fraction": ctx.cfg.retarget.quality.min_valid_fraction,
            "max_position_error_p95_m": ctx.cfg.retarget.quality.max_position_error_p95_m,
        },
        "tolerances": _none_for_nan(tolerances[0]) if tolerances else {},
        "dataset": pooled.to_dict(),
        "episodes": {
            r["episode_id"]: {**_none_for_nan({c: r[c] for c in _FIGURE_COLUMNS}),
                              "hands": json.loads(r["hands_json"])}
            for r in quality.to_dict("records")
        },
    }
