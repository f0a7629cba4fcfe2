"""Stage `export`: every usable episode of OUTPUT into one new LeRobot v3 dataset version.

Dataset-level, not an episode `Stage` (like ingest it is special-cased in `run_pipeline`):

1. Candidates are all episodes whose latest `fusion` status is ok (the whole OUTPUT, not only this
   run's INPUT: a dataset holds every good episode). Left out, with reasons in the manifest: QA
   failures (when the `qa` table exists), too few frames with a wearer hand, upstream failures.
2. "Nothing changed": the fingerprint of the included episodes' sources (hands_world config hash
   and stage version, video content hash, QA verdict, metric scale) and the export config equals
   the latest version's -> no new version, every episode `skipped`.
3. The driver plans indices (`udfs.lerobot.dataset.plan_episodes`); executors write the
   per-episode data and video files in parallel into `datasets/<name>/_staging/<run_id>/`
   (`cogroup_per_episode`: episode k in task k mod n, `jobs.slots`) and return metadata rows.
4. The driver writes meta/, the card and the manifest, and publishes `v<N>` (`jobs.datasets`). The
   staging folder is locked as live while it exists; staging left by a killed export is removed
   first (`datasets.clean_stale_staging`).

Spark actions: `runs` (candidates and their hands_world lineage), one planning job (frames, hands_world,
videos, qa) and the write.

An episode whose unit fails is left out and the export is redone without it (indices must be
contiguous); its `runs` row is failed. Per-robot datasets `<name>-<embodiment>` (issue #7) take the
same path with `robot_actions` rows instead of `hands_world` (state = joint positions + gripper of
each followed hand, action = next / delta), one version history each; which episodes they take and
their retargeting figures: `jobs.robot_export`.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs import datasets
from jobs.config import encode
from jobs.disk import no_space, out_of_space, worded_no_space
from jobs.robot_export import retarget_report, robot_targets
from jobs.stage import EpisodeOutcome, StageContext, cogroup_per_episode, now
from jobs.tables import Lineage, exists, read
from pose_core.training import HAND_IDENTITIES
from schemas.tables import (
    CAMERA_POSES,
    CAMERAS,
    FRAMES,
    HANDS_WORLD,
    QA,
    ROBOT_ACTIONS,
    ROBOT_QUALITY,
    VIDEOS,
)
from udfs.guard import ERROR_KIND, ROW_KIND
from udfs.lerobot import dataset_spec
from udfs.lerobot.dataset import finish_dataset, plan_episodes, write_card
from udfs.lerobot.episode import EPISODE_META, PLAN_COLUMNS, RobotLayout, export_episode, robot_spec
from udfs.options import ExportOptions

__all__ = ["STAGE_NAME", "STAGE_VERSION", "UPSTREAM", "ExportResult", "run"]

logger = logging.getLogger(__name__)

STAGE_NAME = "export"
STAGE_VERSION = "1"
#: The stage whose ok episodes are candidates.
UPSTREAM = "fusion"
_CARD_NOTES = """## Conventions

World frame: the first frame's camera (x right, y down, z forward), per episode. Dataset frame k is at
`timestamp = k / fps`; its values come from the source frame nearest in presentation time (sample and
hold, `source_frame_idx`), never interpolated. A missing hand or camera pose is written as zeros and
`observation.present` is 0 there: always apply the mask. `action` is `{action_mode}`; `action_valid`
says where it is defined. Statistics (`meta/stats.json`) of masked features count valid frames only.
Camera translation is metric when the episode's `scale_source` is not `none` (metres_per_unit applied);
otherwise it is in the map's arbitrary units. Video: {codec}, {width}x{height}, letterboxed, faces
blurred: {blur}. `observation.images.ego_overlay`, where present, is the same video with each frame's
hand keypoints projected through the camera the hands were fitted with: evidence, not a model input."""


@dataclass
class ExportResult:
    """What an export did: the version published (None: nothing new), per-episode outcomes, robot datasets."""

    version: str | None
    outcomes: list[EpisodeOutcome] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    robot_versions: dict[str, str | None] = field(default_factory=dict)  # per-robot dataset: version
    robot_outcomes: dict[str, list[EpisodeOutcome]] = field(default_factory=dict)  # per-robot dataset
    # per exported episode: (wall, CPU) seconds of its executor unit (decode, tensors, files)
    unit_seconds: dict[str, tuple[float, float]] = field(default_factory=dict)


def _candidates(ctx: StageContext) -> tuple[pd.DataFrame, dict[str, str]]:
    """(candidates, {episode whose upstream failed: reason}) from `runs`.

    Candidates: one row per episode whose latest `fusion` status is ok, with the lineage of its
    `hands_world` rows (that fusion run wrote them): `hands_run_ids`, `hands_config_hash`,
    `hands_stage_version`.
    """
    latest = ctx.latest_runs()
    up = latest[latest["stage"] == UPSTREAM]
    failed = {
        r.episode_id: f"{UPSTREAM} failed: {r.error}" for r in up[up["status"] == "failed"].itertuples()
    }
    ok = up[up["status"] == "ok"].sort_values("episode_id")
    candidates = pd.DataFrame(
        {
            "episode_id": ok["episode_id"].to_numpy(),
            "hands_run_ids": [[r] for r in ok["run_id"]],
            "hands_config_hash": ok["config_hash"].to_numpy(),
            "hands_stage_version": ok["stage_version"].to_numpy(),
        }
    )
    return candidates, failed


def _summaries(ctx: StageContext, episodes: list[str], opts: ExportOptions) -> pd.DataFrame:
    """One row per episode: times, frame and hand counts, source video, scale, camera, QA verdict.

    One Spark job over frames, hands_world, videos, cameras and qa (when they exist; `qa_passed` null
    without a verdict, `camera_json` null without a cameras row).
    """
    spark, layout, scope = ctx.spark, ctx.layout, F.col("episode_id").isin(episodes)
    times = (
        read(spark, layout, FRAMES)
        .where(scope)
        .groupBy("episode_id")
        .agg(F.min("ts_s").alias("ts_first"), F.max("ts_s").alias("ts_last"), F.count("*").alias("frames"))
    )
    hands = _wearer_hands(read(spark, layout, HANDS_WORLD).where(scope), opts)
    extra = [
        F.first(c, ignorenulls=True).alias(c)
        for c in ("metres_per_unit", "metres_per_unit_std")
        if c in hands.columns
    ]
    hand_rows = hands.groupBy("episode_id").agg(
        F.countDistinct("frame_idx").alias("hand_frames"),
        F.first("scale_source").alias("scale_source"),
        *extra,
    )
    videos = (
        read(spark, layout, VIDEOS)
        .where(scope)
        .select("episode_id", "source_path", "task_text", "content_sha256")
    )
    out = times.join(videos, "episode_id").join(hand_rows, "episode_id", "left")
    if exists(layout, CAMERAS):
        cameras = read(spark, layout, CAMERAS).where(scope)
        camera = F.to_json(F.struct(*[c for c in CAMERAS.columns if c != "episode_id"]))
        out = out.join(cameras.select("episode_id", camera.alias("camera_json")), "episode_id", "left")
    if exists(layout, QA):
        verdicts = read(spark, layout, QA).where(scope)
        out = out.join(
            verdicts.select(
                "episode_id", F.col("passed").alias("qa_passed"), F.col("reasons").alias("qa_reasons")
            ),
            "episode_id",
            "left",
        )
    out = out.toPandas()
    if "qa_passed" not in out:
        out["qa_passed"], out["qa_reasons"] = None, None
    if "camera_json" not in out:
        out["camera_json"] = None
    if "metres_per_unit" not in out:
        out["metres_per_unit"] = 1.0
    out["metres_per_unit"] = out["metres_per_unit"].fillna(1.0)
    if "metres_per_unit_std" not in out:
        out["metres_per_unit_std"] = None
    out["hand_frames"] = out["hand_frames"].fillna(0).astype(int)
    return out.sort_values("episode_id").reset_index(drop=True)


def _wearer_hands(hands: DataFrame, opts: ExportOptions) -> DataFrame:
    rows = hands.where(F.col("identity").isin(list(HAND_IDENTITIES)))
    return rows if opts.tensors.use_filled else rows.where(~F.col("filled"))


def _fingerprint(
    summary: pd.DataFrame, opts: ExportOptions, qa: dict[str, str], robot: RobotLayout | None
) -> str:
    columns = ["episode_id", "hands_config_hash", "hands_stage_version", "content_sha256", "metres_per_unit"]
    sources = summary[columns + (["robot_config_hash"] if robot else [])].to_dict("records")
    content = {"exporter": STAGE_VERSION, "export": encode(opts), "episodes": sources, "qa": qa}
    return datasets.fingerprint({**content, "robot": None if robot is None else asdict(robot)})


def _source_rows(
    ctx: StageContext, scope: Column, opts: ExportOptions, robot: RobotLayout | None
) -> DataFrame:
    """The second input of the units: wearer `hands_world` rows, or the embodiment's `robot_actions` rows."""
    if robot is None:
        return _wearer_hands(read(ctx.spark, ctx.layout, HANDS_WORLD).where(scope), opts).select(
            "episode_id", "frame_idx", "identity", "keypoints_world_m", "filled"
        )
    rows = read(ctx.spark, ctx.layout, ROBOT_ACTIONS).where(scope & (F.col("embodiment") == robot.embodiment))
    return rows.select(
        "episode_id", "step_idx", "frame_idx", "ts_s", "identity", "joint_positions", "gripper", "reachable"
    )


def _write_files(
    ctx: StageContext, plan: pd.DataFrame, opts: ExportOptions, robot: RobotLayout | None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Executors write the planned episodes' files; returns (metadata rows, {failed episode: error})."""
    episodes = plan["episode_id"].tolist()
    scope = F.col("episode_id").isin(episodes)
    planned = F.broadcast(ctx.spark.createDataFrame(plan[["episode_id", *PLAN_COLUMNS]]))
    frames = read(ctx.spark, ctx.layout, FRAMES).where(scope).select("episode_id", "frame_idx", "ts_s")
    poses = (
        read(ctx.spark, ctx.layout, CAMERA_POSES)
        .where(scope)
        .select("episode_id", "frame_idx", "world_from_cam_q_wxyz", "world_from_cam_t_mu")
    )
    posed = frames.join(poses, ["episode_id", "frame_idx"], "left").join(planned, "episode_id")
    rows = _source_rows(ctx, scope, opts, robot)
    # One task per episode (`jobs.slots`), in dataset order: episode index k in task k mod n.
    in_order = plan.sort_values("episode_index")["episode_id"].tolist()
    unit = partial(export_episode, opts=opts, robot=robot)
    result = cogroup_per_episode(posed, rows, in_order, unit, EPISODE_META).toPandas()
    failed = result[result["_row_kind"] == ERROR_KIND]
    return result[result["_row_kind"] == ROW_KIND], dict(
        zip(failed["episode_id"], failed["_error"], strict=True)
    )


def _manifest(  # noqa: PLR0913 - the parts a manifest records
    ctx: StageContext,
    lineage: Lineage,
    opts: ExportOptions,
    plan: pd.DataFrame,
    metas: pd.DataFrame,
    excluded: dict[str, str],
    fingerprint: str,
    robot: RobotLayout | None,
) -> dict[str, Any]:
    rows = plan.merge(metas[["episode_id", "faces_blurred", "worker"]], on="episode_id")
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_id": ctx.run_id,
        "source_run_ids": sorted({r for ids in plan["hands_run_ids"] for r in ids}),
        "config_hash": lineage.config_hash,
        "stage_versions": {
            STAGE_NAME: STAGE_VERSION,
            "hands_world": sorted(set(plan["hands_stage_version"])),
        },
        "fingerprint": fingerprint,
        "format": "lerobot v3.0",
        "embodiment": None if robot is None else robot.embodiment,
        "fps": opts.tensors.fps,
        "codec": opts.codec,
        "action_mode": opts.tensors.action_mode,
        "export_config": encode(opts),
        "counts": {
            "episodes": len(plan),
            "frames": int(plan["length"].sum()),
            "excluded": len(excluded),
            "faces_blurred": int(rows["faces_blurred"].sum()),
        },
        "episodes": [
            {
                "episode_index": int(r.episode_index),
                "episode_id": r.episode_id,
                "length": int(r.length),
                "task": r.task,
                "scale_source": r.scale_source,
                "metres_per_unit": float(r.metres_per_unit),
                "metres_per_unit_std": (
                    None if pd.isna(r.metres_per_unit_std) else float(r.metres_per_unit_std)
                ),
                "source_path": r.source_path,
                "hands_config_hash": r.hands_config_hash,
                "worker": r.worker,
            }
            for r in rows.itertuples()
        ],
        "exclusions": [{"episode_id": e, "reason": why} for e, why in sorted(excluded.items())],
    }


def _stage_files(
    ctx: StageContext, summary: pd.DataFrame, opts: ExportOptions, staging: str, robot: RobotLayout | None
) -> tuple[pd.DataFrame, list[str], pd.DataFrame, dict[str, str]]:
    """Plan and write the episodes' files; an episode whose unit fails is dropped and the rest redone.

    Returns:
        (plan, tasks, metadata rows, {failed episode: error}); the plan is empty when all failed.

    Raises:
        OSError: ENOSPC when a unit found the file system full (no episode is to blame).
    """
    failed: dict[str, str] = {}
    while True:  # every pass drops at least one episode or ends
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        plan, tasks = plan_episodes(
            summary[~summary["episode_id"].isin(failed)], opts.tensors.fps, opts.default_task
        )
        plan["staging_root"] = staging
        if plan.empty:
            return plan, tasks, pd.DataFrame(columns=EPISODE_META.names), failed
        metas, new_failures = _write_files(ctx, plan, opts, robot)
        if not new_failures:
            return plan, tasks, metas, failed
        if full := out_of_space(new_failures.values()):  # the disk, not the episodes: stop
            raise no_space(f"writing dataset files ({full})", staging)
        failed.update(new_failures)


def _usable(ctx: StageContext, opts: ExportOptions) -> tuple[pd.DataFrame, dict[str, str]]:
    """(summaries of the episodes to export, {left-out episode: reason})."""
    candidates, excluded = _candidates(ctx)
    if candidates.empty:
        return pd.DataFrame(columns=["episode_id"]), excluded
    summary = _summaries(ctx, candidates["episode_id"].tolist(), opts).merge(candidates, on="episode_id")
    for r in summary[summary["qa_passed"].eq(False)].itertuples():  # null: no QA verdict
        reasons = list(r.qa_reasons) if r.qa_reasons is not None else []
        excluded[r.episode_id] = "qa failed: " + "; ".join(reasons or ["no reason given"])
    summary = summary[~summary["episode_id"].isin(excluded)]
    for r in summary[summary["hand_frames"] < opts.min_hand_fraction * summary["frames"]].itertuples():
        excluded[r.episode_id] = (
            f"no usable hands: a wearer hand in {r.hand_frames} of {r.frames} frames "
            f"(< export.min_hand_fraction {opts.min_hand_fraction})"
        )
    return summary[~summary["episode_id"].isin(excluded)].reset_index(drop=True), excluded


def _publish_dataset(  # noqa: PLR0913 - one dataset: where, what, and which episodes
    ctx: StageContext,
    lineage: Lineage,
    name: str,
    summary: pd.DataFrame,
    excluded: dict[str, str],
    robot: RobotLayout | None,
) -> ExportResult:
    """Write and publish one dataset version from `summary`'s episodes (none when nothing changed)."""
    opts: ExportOptions = ctx.cfg.export
    if robot is not None:  # one dataset frame per control step
        opts = replace(opts, tensors=replace(opts.tensors, fps=robot.fps))
    started, root = now(), ctx.layout.datasets
    datasets.clean_stale_staging(root, name)  # of exports killed earlier; never a running one's
    left_out = [EpisodeOutcome(e, "skipped", 0, why, started, now()) for e, why in sorted(excluded.items())]
    if summary.empty:
        logger.warning(
            "export: no usable episode for %s (%d left out); no version written", name, len(excluded)
        )
        return ExportResult(None, left_out)
    qa = {e: r for e, r in excluded.items() if r.startswith("qa")}
    fingerprint = _fingerprint(summary, opts, qa, robot)
    latest = datasets.latest_version(root, name)
    if latest and datasets.read_manifest(root, name, latest).get("fingerprint") == fingerprint:
        logger.info("export: nothing changed since %s/%s; no new version", name, latest)
        same = [
            EpisodeOutcome(e, "skipped", 0, f"unchanged since {latest}", started, now())
            for e in summary["episode_id"]
        ]
        return ExportResult(None, same + left_out)
    with (
        worded_no_space(f"exporting dataset {name}", root),  # staging, meta/, the card, the lock
        datasets.locked_staging(root, name, ctx.run_id) as staging,
    ):
        plan, tasks, metas, failed = _stage_files(ctx, summary, opts, staging, robot)
        failures = [EpisodeOutcome(e, "failed", 0, m, started, now()) for e, m in sorted(failed.items())]
        if plan.empty:
            return ExportResult(None, failures + left_out)
        spec = dataset_spec(opts) if robot is None else robot_spec(opts, robot)
        finish_dataset(staging, spec, opts.tensors.fps, plan, metas, tasks)
        manifest = _manifest(ctx, lineage, opts, plan, metas, {**excluded, **failed}, fingerprint, robot)
        if robot is not None and exists(ctx.layout, ROBOT_QUALITY):
            manifest["retarget"] = retarget_report(ctx, robot, list(plan["episode_id"]))
        notes = _CARD_NOTES.format(
            action_mode=opts.tensors.action_mode,
            codec=opts.codec,
            width=opts.image_width,
            height=opts.image_height,
            blur=opts.privacy.enabled,
        )
        version = datasets.publish(
            staging, root, name, manifest, lambda folder, m: write_card(folder, spec, m, notes)
        )
    units = {r.episode_id: (float(r.unit_s), float(r.unit_cpu_s)) for r in metas.itertuples()}
    done = [
        EpisodeOutcome(r.episode_id, "ok", int(r.length), None, started, now(), *units[r.episode_id])
        for r in plan.itertuples()
    ]
    logger.info(
        "export: %s/%s with %d episodes, %d left out", name, version, len(plan), len(excluded) + len(failed)
    )
    return ExportResult(
        version, done + failures + left_out, {**manifest, "version": version}, unit_seconds=units
    )


def run(ctx: StageContext, lineage: Lineage) -> ExportResult:
    """Export every usable episode as a new version of `export.name`, then one dataset per embodiment.

    Even a forced run (`--from-stage`, no `--resume`) publishes no version when the fingerprint is
    the latest version's: the content decides, not the run. Per-robot datasets (`<name>-<embodiment>`,
    from `robot_actions` when `export.robot_datasets` and the table exists) are versioned the same way;
    `outcomes` are the human-hands dataset's `runs` rows, `robot_outcomes` each robot dataset's (recorded
    as stage `export:<dataset>`).
    """
    opts: ExportOptions = ctx.cfg.export
    summary, excluded = _usable(ctx, opts)
    result = _publish_dataset(ctx, lineage, opts.name, summary, excluded, None)
    for robot, robot_summary, robot_excluded in robot_targets(ctx, opts, summary, excluded):
        name = f"{opts.name}-{robot.embodiment}"
        robot_result = _publish_dataset(ctx, lineage, name, robot_summary, robot_excluded, robot)
        result.robot_versions[name] = robot_result.version
        result.robot_outcomes[name] = robot_result.outcomes
    return result
