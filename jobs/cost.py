"""`egolake cost`: per stage, CPU-seconds per video-hour, frames per second and failures, from `runs`.

`stage_costs` is pure pandas (the figures, testable without Spark); `run_costs` reads the tables.
What is measured: `runs.cpu_s` and `runs.unit_s` are the executors' unit functions (the Python
worker and its children, e.g. ingest's probe); Spark's own JVM work (shuffles, Delta reads and
writes) is outside them and inside the stage's wall time. No stage records GPU time: BA's cupy path
runs inside its units' wall and CPU seconds.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.tables import Layout, read
from schemas.tables import QUARANTINE, RUNS, VIDEOS

__all__ = ["COST_COLUMNS", "format_costs", "run_costs", "stage_costs", "wall_seconds"]

#: Columns of `stage_costs`, one row per stage.
COST_COLUMNS = (
    "stage", "episodes", "ok", "failed", "video_h", "frames", "wall_s", "unit_s", "cpu_s",
    "measured", "cpu_s_per_video_h", "frames_per_s", "failure_rate",
)  # fmt: skip


def wall_seconds(started: pd.Series, finished: pd.Series) -> float:
    """Seconds covered by the union of [started, finished] intervals (a stage's batches, any runs)."""
    spans = sorted(zip(started, finished, strict=True))
    total, end = 0.0, None
    for lo, hi in spans:
        if end is None or lo > end:
            total += (hi - lo).total_seconds()
            end = hi
        elif hi > end:
            total += (hi - end).total_seconds()
            end = hi
    return total


def stage_costs(runs: pd.DataFrame, videos: pd.DataFrame) -> pd.DataFrame:
    """Per stage: attempts, failures, video hours, frames, wall/unit/CPU seconds and the rates.

    Args:
        runs: `runs` rows (skipped ones are left out here: they cost nothing).
        videos: `episode_id`, `duration_s`, `frame_count` (an attempt counts its episode's video).

    Returns:
        `COST_COLUMNS`, stages in the order they first started; `cpu_s` sums the rows that measured
        it (`measured` of `episodes`), so `cpu_s_per_video_h` is over those rows' video only;
        `frames_per_s` is frames over wall seconds (NaN for a stage whose units never ran, e.g.
        retarget without embodiments: its instant `ok` rows would give absurd rates).
    """
    runs = runs.assign(**{c: float("nan") for c in ("unit_s", "cpu_s") if c not in runs.columns})  # runs v1
    done = runs[runs["status"] != "skipped"].merge(
        videos[["episode_id", "duration_s", "frame_count"]], on="episode_id", how="left"
    )
    rows = []
    for stage, g in done.groupby("stage", sort=False):
        measured = g[g["cpu_s"].notna()]
        video_h = float(g["duration_s"].fillna(0).sum()) / 3600.0
        measured_h = float(measured["duration_s"].fillna(0).sum()) / 3600.0
        wall = wall_seconds(g["started"], g["finished"])
        frames = int(g["frame_count"].fillna(0).sum())
        failed = int((g["status"] == "failed").sum())
        cpu = float(measured["cpu_s"].sum())
        rows.append({
            "stage": stage, "episodes": len(g), "ok": int((g["status"] == "ok").sum()), "failed": failed,
            "video_h": video_h, "frames": frames, "wall_s": wall,
            "unit_s": float(measured["unit_s"].sum()), "cpu_s": cpu, "measured": len(measured),
            "cpu_s_per_video_h": cpu / measured_h if measured_h > 0 else float("nan"),
            "frames_per_s": frames / wall if wall > 0 and len(measured) else float("nan"),  # nan: no work
            "failure_rate": failed / len(g),
        })  # fmt: skip
    first = done.groupby("stage")["started"].min().sort_values(kind="stable")
    out = pd.DataFrame(rows, columns=list(COST_COLUMNS)).set_index("stage", drop=False)
    return out.loc[list(first.index)].reset_index(drop=True)


def run_costs(spark: SparkSession, output: str, run_id: str | None = None) -> tuple[pd.DataFrame, int, int]:
    """`stage_costs` of one run (or of every run of OUTPUT); plus (quarantined inputs, runs covered).

    An OUTPUT without `runs` rows (for the run) gives no cost rows and 0 runs covered.
    """
    layout = Layout(output)
    runs = read(spark, layout, RUNS)
    quarantine = read(spark, layout, QUARANTINE)
    if run_id is not None:
        runs, quarantine = runs.where(F.col("run_id") == run_id), quarantine.where(F.col("run_id") == run_id)
    wanted = ("run_id", "stage", "episode_id", "status", "started", "finished", "unit_s", "cpu_s")
    runs_pdf = runs.select(*(c for c in wanted if c in runs.columns)).toPandas()  # runs v1: no seconds
    videos = read(spark, layout, VIDEOS).select("episode_id", "duration_s", "frame_count").toPandas()
    costs = stage_costs(runs_pdf, videos)
    return costs, quarantine.count(), runs_pdf["run_id"].nunique()


def format_costs(costs: pd.DataFrame, quarantined: int, runs: int) -> str:
    """The cost table as text, with what is and is not measured."""
    shown = costs.assign(
        video_h=costs["video_h"].map("{:.4f}".format),
        wall_s=costs["wall_s"].map("{:.1f}".format),
        cpu_s=costs["cpu_s"].map("{:.1f}".format),
        cpu_s_per_video_h=costs["cpu_s_per_video_h"].map("{:.0f}".format),
        frames_per_s=costs["frames_per_s"].map("{:.1f}".format),
        gpu_s="-",
    )[["stage", "episodes", "failed", "video_h", "frames", "wall_s", "cpu_s", "measured",
       "cpu_s_per_video_h", "frames_per_s", "gpu_s"]]  # fmt: skip
    return "\n".join([
        shown.to_string(index=False),
        f"runs: {runs}; quarantined inputs: {quarantined}",
        "cpu_s: executors' unit CPU seconds (over the rows that measured it: `measured`); Spark's JVM",
        "work is only in wall_s. frames_per_s: frames of the episodes attempted over wall_s.",
        "gpu_s: not recorded by any stage yet (BA's GPU path counts in its units' wall and CPU seconds).",
    ])  # fmt: skip
