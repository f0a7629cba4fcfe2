"""`egolake status`: per stage and episode, done / failed / pending, with the last errors."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from pyspark.sql import SparkSession

from jobs.stage import latest_runs
from jobs.tables import Layout, exists, read
from schemas.tables import QUARANTINE, VIDEOS

__all__ = ["OutputStatus", "StageStatus", "episode_matrix", "episode_table", "format_status", "stage_status"]


@dataclass(frozen=True)
class StageStatus:
    """Counts for one stage over all episodes in the output."""

    stage: str
    ok: int
    failed: int
    pending: int
    errors: list[tuple[str, str]]  # (episode_id, error), most recent first


@dataclass(frozen=True)
class OutputStatus:
    """Where an output folder stands: per stage, per episode, and quarantined inputs."""

    stages: list[StageStatus]
    latest: pd.DataFrame  # latest non-skipped `runs` row per (stage, episode)
    episodes: list[str]
    quarantined: int


def stage_status(spark: SparkSession, output: str, stages: list[str], max_errors: int = 5) -> OutputStatus:
    """The status of every stage and episode of an output folder."""
    layout = Layout(output)
    episodes = set(read(spark, layout, VIDEOS).select("episode_id").toPandas()["episode_id"])
    latest = latest_runs(spark, layout)
    latest = latest[latest["episode_id"].isin(episodes)]
    result = []
    for stage in stages:
        mine = latest[latest["stage"] == stage].sort_values("finished", ascending=False)
        ok = int((mine["status"] == "ok").sum())
        failed_rows = mine[mine["status"] == "failed"]
        result.append(
            StageStatus(
                stage, ok, len(failed_rows), len(episodes) - ok - len(failed_rows),
                list(zip(failed_rows["episode_id"], failed_rows["error"], strict=True))[:max_errors],
            )
        )  # fmt: skip
    quarantined = read(spark, layout, QUARANTINE).count() if exists(layout, QUARANTINE) else 0
    return OutputStatus(result, latest, sorted(episodes), quarantined)


def format_status(statuses: list[StageStatus], quarantined: int) -> str:
    """Human-readable table of `stage_status`."""
    lines = [f"{'stage':<12}{'ok':>8}{'failed':>8}{'pending':>9}"]
    lines += [f"{s.stage:<12}{s.ok:>8}{s.failed:>8}{s.pending:>9}" for s in statuses]
    lines.append(f"quarantined inputs: {quarantined}")
    for s in statuses:
        for episode, error in s.errors:
            lines.append(f"  {s.stage} {episode}: {error}")
    return "\n".join(lines)


def episode_table(latest: pd.DataFrame, episodes: list[str], stages: list[str]) -> pd.DataFrame:
    """Episodes x stages: each episode's latest status per stage (`pending` where it never ran)."""
    status = latest.pivot_table(index="episode_id", columns="stage", values="status", aggfunc="first")
    return status.reindex(index=sorted(episodes), columns=stages).fillna("pending")


def episode_matrix(latest: pd.DataFrame, episodes: list[str], stages: list[str]) -> str:
    """One line per episode: its latest status in each stage (`pending` where it never ran)."""
    return episode_table(latest, episodes, stages).to_string()
