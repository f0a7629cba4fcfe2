"""Retargeting measured on the pipeline's own output (issue 22), not on ideal hands.

    python -m bench.retarget_pipeline --work WORK --out bench/results [--robots so100,panda]
        [--robots-dir ../shared/data/robots] [--from-stage retarget] [--before WORK_OF_AN_OLDER_RUN]

Runs the demo (`egolake demo`: the 150-frame synthetic clip, IMU scale) and the project's synthetic
episodes (`jobs.sample`: table seeds 1-3 at 300 frames, the `hard` preset at 600) through the whole
pipeline with `embodiments` set, each into its own output under WORK (kept: a second call only
reports, or runs them again from `--from-stage`). An episode whose IMU gives no metric scale gets the
user's scale (`fusion.user_metres_per_unit`, the documented way to give one): the Sim(3) scale of its
tracked camera path against the sample's ground truth, as tests/jobs/test_robot_export.py does; its
fusion and later stages run again with it.
Writes `retarget.{md,json}`: per output, robot and episode the `robot_quality` figures, pooled per
robot over the episodes from the `robot_actions` rows, and the robot datasets' versions. `--before`
reads outputs written by an older egolake for the comparison table: one without `hand_error_m` reported
its errors to the smoothed targets only (position = tracking there); one without `hand_state` (before
issue 22) had no `robot_quality` and counted every orientation miss as unreachable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import provenance
from pose_core.retarget.quality import retarget_figures
from udfs.retarget import STEP_ERRORS

SYNTHETIC = (("synth_table_1", "table", 1, 300), ("synth_table_2", "table", 2, 300),
             ("synth_table_3", "table", 3, 300), ("synth_hard_14", "hard", 14, 600))


def _settings(robots: list[str], robots_dir: str) -> list[str]:
    return [f"embodiments=[{','.join(robots)}]", f"retarget.robots_dir={robots_dir}"]


def _camera_path(spark: Any, out: str, truth_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output's camera path ``(F, 4, 4)``, its measured frames ``(F,)`` and the truth ``(F, 4, 4)``."""
    from udfs.camera_tables import world_from_cam_from_columns
    from udfs.fusion import MEASURED_QUALITIES

    poses = _table(spark, out, "camera_poses").sort_values("frame_idx")
    measured = poses["pose_quality"].isin(MEASURED_QUALITIES).to_numpy()
    est = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    return est, measured, np.load(truth_dir / "world_from_cam.npy")[poses["frame_idx"].to_numpy()]


def _user_scale(spark: Any, out: str, truth_dir: Path) -> float:
    """Metres per map unit of the tracked camera path: its Sim(3) fit to the sample's ground truth."""
    from pose_core.camera_poses.evaluation import evaluate_trajectory

    est, measured, gt = _camera_path(spark, out, truth_dir)
    return float(evaluate_trajectory(est[measured], gt[measured]).scale)


def _camera_ate_pct(spark: Any, out: str) -> float | None:
    """ATE of the output's camera path over every frame, % of the path; None without ground truth."""
    from pose_core.camera_poses.evaluation import evaluate_trajectory

    truth = sorted(Path(out, "sample", "ground_truth").glob("*/world_from_cam.npy"))
    if len(truth) != 1:  # no single rendered path to compare with
        return None
    est, _, gt = _camera_path(spark, out, truth[0].parent)
    return round(float(evaluate_trajectory(est, gt).ate_pct_of_path), 3)


def _retarget_cpu_s(spark: Any, out: str) -> float | None:
    """CPU seconds of the output's latest retarget run (its units, every robot and hand)."""
    runs = _table(spark, out, "runs")
    if runs is None:
        return None
    mine = runs[(runs["stage"] == "retarget") & (runs["status"] == "ok")]
    if mine.empty:
        return None
    latest = mine[mine["run_id"] == mine.sort_values("finished")["run_id"].iloc[-1]]
    return round(float(latest["cpu_s"].sum()), 1)


def _table(spark: Any, out: str, name: str) -> Any:
    from jobs.tables import Layout, exists, read
    from schemas import table as schema_of

    schema = schema_of(name)
    if not exists(Layout(out), schema):
        return None
    return read(spark, Layout(out), schema).toPandas()


def run_outputs(spark: Any, work: Path, settings: list[str], from_stage: str | None = None) -> dict[str, str]:
    """Every output (label -> folder): run when its folder has no tables yet, else again from `from_stage`."""
    from jobs.cli import run_demo
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline
    from jobs.sample import SampleOptions, write_sample

    cfg = load_config([], settings)
    outputs = {"demo": str(work / "demo")}
    if not (work / "demo" / "tables").is_dir():
        run_demo(spark, cfg, outputs["demo"])
    elif from_stage:
        demo_videos = str(work / "demo" / "sample" / "videos")
        run_pipeline(spark, cfg, demo_videos, outputs["demo"], from_stage=from_stage)
    for label, scene, seed, frames in SYNTHETIC:
        out = work / label
        outputs[label] = str(out)
        videos = str(out / "sample" / "videos")
        sample = SampleOptions(frames=frames, seed=seed, scene=scene)
        fresh = not (out / "tables").is_dir()
        if fresh:
            write_sample(out / "sample", sample)
            run_pipeline(spark, cfg, videos, str(out))
        sources = set(_table(spark, str(out), "hands_world")["scale_source"].dropna())
        if sources <= {"none", "user"}:  # no IMU scale: the user's, from ground truth (again when rerun)
            scale = _user_scale(spark, str(out), out / "sample" / "ground_truth" / sample.stem)
            with_scale = load_config([], [*settings, f"fusion.user_metres_per_unit={scale}"])
            if fresh or "none" in sources or from_stage:
                run_pipeline(spark, with_scale, videos, str(out), from_stage=from_stage or "fusion")
        elif from_stage and not fresh:
            run_pipeline(spark, cfg, videos, str(out), from_stage=from_stage)
    return outputs


def _nan_none(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, 5)


def _pooled(actions: Any, quality: Any) -> dict[str, Any]:
    """Figures of one robot's steps over all episodes it was not refused for (valid, errors pooled)."""
    rows = actions[actions["refused"].isna()]
    if "hand_state" not in rows:  # an older egolake: a step had a hand where it had joints
        states = np.where(rows["joint_positions"].notna(), "observed", "missing")
        rows = rows.assign(hand_state=states, approach_error_rad=np.nan,
                           closing_error_rad=rows["ee_error_rad"], target_shift_m=0.0)
    if "hand_error_m" not in rows:  # no errors to the hand: those to the (smoothed) target
        rows = rows.assign(hand_error_m=rows["ee_error_m"])
    keys = ("limit_violations", "speed_violations", "acceleration_violations")
    violations = (0, 0, 0) if quality is None else tuple(int(quality[k].sum()) for k in keys)
    reachable = rows["reachable"].fillna(False).to_numpy(bool)
    fig = retarget_figures(rows["hand_state"].to_numpy(object), reachable,
                           *(rows[c].to_numpy(float) for c in STEP_ERRORS), violations)
    return {k: _nan_none(v) if isinstance(v, float) else v for k, v in fig.to_dict().items()}


def measure(spark: Any, outputs: dict[str, str]) -> list[dict[str, Any]]:
    """Per output and robot: pooled figures, episodes (refused or not, passed or not), dataset versions."""
    from jobs.datasets import latest_version

    rows = []
    for label, out in outputs.items():
        actions = _table(spark, out, "robot_actions")
        if actions is None:
            continue
        camera_ate = _camera_ate_pct(spark, out)
        retarget_cpu = _retarget_cpu_s(spark, out)
        quality = _table(spark, out, "robot_quality")
        for embodiment, mine in actions.groupby("embodiment"):
            own = None if quality is None else quality[quality["embodiment"] == embodiment]
            refused = sorted(set(mine.loc[mine["refused"].notna(), "episode_id"]))
            row = {"output": label, "camera_ate_pct": camera_ate, "retarget_cpu_s": retarget_cpu,
                   "robot": embodiment,
                   "episodes": int(mine["episode_id"].nunique()), "refused": len(refused),
                   **_pooled(mine, own)}
            if own is not None:
                row["passed"] = int(own["passed"].sum())
                row["reasons"] = sorted({r for reasons in own["reasons"] for r in reasons})
                row["base_search_score"] = [
                    round(h["base_search_score"], 2) for hj in own["hands_json"]
                    for h in json.loads(hj).values() if h.get("base_search_score") is not None]
            dataset = Path(out, "datasets")
            version = latest_version(str(dataset), f"hands-{embodiment}") if dataset.is_dir() else None
            row["dataset"] = f"hands-{embodiment}/{version}" if version else None
            rows.append(row)
    return rows


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_m"):
        return f"{1e3 * value:.1f}"
    if key.endswith("_rad"):
        return f"{math.degrees(value):.1f}"
    if key.endswith("_fraction"):
        return f"{100 * value:.1f} %"
    return str(value)


COLUMNS = (
    "output", "camera_ate_pct", "retarget_cpu_s", "robot", "episodes", "refused", "passed", "steps",
    "valid_fraction", "reachable_fraction",
    "position_error_median_m", "position_error_p95_m", "tracking_error_median_m", "tracking_error_p95_m",
    "target_shift_p95_m", "approach_error_median_rad", "approach_error_p95_rad",
    "closing_error_median_rad", "closing_error_p95_rad", "limit_violations",
    "speed_violations", "acceleration_violations", "dataset",
)


def _table_md(rows: list[dict[str, Any]]) -> list[str]:
    head = [re.sub(r"_rad$", " (deg)", re.sub(r"_m$", " (mm)", c)) for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(c, r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return lines


def main() -> None:
    """Run (or reuse) the outputs, measure, write the report."""
    from jobs.config import load_config
    from jobs.logs import init_logging
    from jobs.spark import build_spark

    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, help="folder of the pipeline outputs (kept)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--robots", default="so100,panda")
    parser.add_argument("--robots-dir", default=os.environ.get("EGOLAKE_ROBOTS_DIR", "../shared/data/robots"))
    parser.add_argument("--before", help="outputs of an older egolake (same layout as WORK) to compare with")
    parser.add_argument("--from-stage", help="run the existing outputs again from this stage (e.g. retarget)")
    args = parser.parse_args()
    init_logging(False)
    settings = _settings(args.robots.split(","), str(Path(args.robots_dir).resolve()))
    spark = build_spark(load_config([], settings).spark)
    outputs = run_outputs(spark, Path(args.work), settings, args.from_stage)
    rows = measure(spark, outputs)
    before = measure(spark, {k: str(Path(args.before, k)) for k in outputs}) if args.before else []
    meta = provenance("bench.retarget_pipeline")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "retarget.json").write_text(json.dumps({**meta, "rows": rows, "before": before}, indent=2) + "\n")
    lines = [
        "# Retargeting on the pipeline's own output (issue 22)", "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "- outputs: `demo` (egolake demo, 150 frames, IMU scale) and the synthetic episodes (jobs.sample: "
        "table seeds 1-3 at 300 frames, hard at 600), each through the whole pipeline with "
        f"`--set embodiments=[{args.robots}]`; an episode without an IMU scale gets the user scale of its "
        "camera path's Sim(3) fit to ground truth (`fusion.user_metres_per_unit`); camera_ate_pct = that "
        "path's ATE over every frame, % of its length (synthetic outputs); retarget_cpu_s = CPU seconds "
        "of the output's latest retarget run, both robots and hands (the same on both rows).",
        "- figures pool both hands' control steps over the output's episodes the robot was not refused for "
        "(no metric scale: `refused`); valid = a hand observed or gap-filled within 0.9 m of the camera; "
        "reachable = of the valid steps, within the profile's tolerances of the smoothed target the arm "
        "follows; errors over valid steps, robot base frame: position = tool to the hand's own "
        "(unsmoothed) wrist target, tracking = tool to the smoothed target, shift = how far smoothing moved "
        "the target from the hand; axes against the smoothed target; `passed` = episodes within "
        "retarget.quality (position error p95 to the hand; kept by the robot dataset).", "",
        *_table_md(rows), "",
    ]
    if before:
        lines += [
            "## Before (the same outputs' hands through the retargeting of the older egolake)", "",
            "An egolake without `hand_error_m` measured errors against the smoothed targets only (its "
            "position column = its tracking column). One without hand states (before issue 22: valid = "
            "joints written, no approach/closing split, closing column = its full rotation error) counted "
            "every orientation miss as unreachable.",
            "", *_table_md(before), "",
        ]
    reasons = sorted({r for row in rows for r in row.get("reasons", [])})
    if reasons:
        lines += ["## Reasons episodes were left out", "", *(f"- {r}" for r in reasons), ""]
    (out / "retarget.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
