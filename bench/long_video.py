"""How long a video egolake takes (issue 18): memory, CPU and accuracy per stage against footage length.

    python -m bench.long_video --work WORK --out bench/results [--minutes 1,10,60] [--loop-frames 900]
        [--set KEY=VALUE ...]

Footage: one closed-loop synthetic clip (`jobs.sample --loops`: `--loop-frames` rendered frames at
640x480, 30 fps) played over and over into one video per length, so every length has the same motion
and ground truth for every frame. Each length runs through the pipeline stage by stage, each stage
an `egolake run --stages STAGE` of its own (its own JVM: its peaks are its own), into WORK/out_<m>min
(kept: a second call reports a finished stage without running it again).

Per stage it records the wall time, the CPU time of the whole process tree (driver, JVM, Python
workers; `process_tree.py`), and the peak resident memory (RSS) of the JVM, of the largest Python
worker and of all Python workers together, sampled from /proc every 0.2 s. Per length: the hands found
against the generator's hands in view (`hand_recall`), `other_N` identities and QA's verdict; every frame's
camera pose against the ground truth (ATE after a Sim(3) fit, every frame counted) and frames per
CPU-second over the whole pipeline, both of the process trees and of the stages' units alone (`runs.cpu_s`:
without the JVM starts and Spark's fixed cost per stage, which long footage amortises). A stage that
fails, or runs past `--stage-timeout-s`, stops its length; the table says where and why.
Writes `long_video.{md,json}`.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.process_tree import Peaks, adopt_orphans, run_measured
from bench.report import provenance, write_result
from jobs.sample import SampleOptions, write_sample

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
FPS = 30.0


@dataclass
class StageFigures:
    """One stage's run over one length."""

    stage: str
    ok: bool
    wall_s: float
    cpu_s: float
    peaks: Peaks = field(default_factory=Peaks)
    error: str = ""


def run_stage(stage: str, videos: Path, out: Path, settings: list[str], timeout_s: float) -> StageFigures:
    """`egolake run --stages STAGE` with its process tree watched, killed after `timeout_s`."""
    cmd = [sys.executable, "-m", "jobs.cli", "-q", "run", str(videos), str(out), "--stages", stage]
    run = run_measured(cmd + [a for s in settings for a in ("--set", s)], REPO, timeout_s=timeout_s)
    figures = StageFigures(stage, run.returncode == 0, run.wall_s, run.cpu_s, run.peaks)
    if run.returncode is None:
        figures.error = f"not done after {timeout_s:.0f} s (--stage-timeout-s): killed"
    elif run.returncode != 0:
        tail = run.stderr.strip().splitlines()
        figures.error = tail[-1][:300] if tail else f"exit {run.returncode}"
    return figures


def _query(out: Path, sql: str) -> pd.DataFrame:
    """Rows of an `egolake sql` query on OUTPUT (its own JVM, like the stages)."""
    cmd = [
        sys.executable,
        "-m",
        "jobs.cli",
        "-q",
        "sql",
        str(out),
        sql,
        "--format",
        "json",
        "--limit",
        "1000000000",
    ]
    run = run_measured(cmd, REPO)  # its JVM is reaped too: the next stage's CPU time does not include it
    if run.returncode != 0:
        raise RuntimeError(f"egolake sql failed: {run.stderr[-2000:]}")
    text = run.stdout
    return pd.read_json(io.StringIO(text), lines=True)


def _failed_episodes(out: Path, stage: str) -> str:
    """The first error of the stage's failed episodes in its latest run, or ''."""
    failed = _query(
        out,
        f"SELECT error FROM runs WHERE stage = '{stage}' AND status = 'failed' "
        f"AND run_id = (SELECT max_by(run_id, finished) FROM runs WHERE stage = '{stage}')",
    )
    return str(failed["error"].iat[0])[:300] if len(failed) else ""


def camera_accuracy(out: Path, truth: Path, loop_frames: int) -> dict[str, Any]:
    """Every frame's pose against the ground truth: frames posed, ATE after a Sim(3) fit, metres; per lap.

    The whole path's ATE can hide a lap whose shape collapsed (its poses bunched into a fraction of its
    size: a small error beside a 90-m path): each lap (``loop_frames`` frames) is also fitted alone, and
    the worst lap's ATE (% of its own path) and the spread of the laps' fitted scales, relative to the
    median lap's, are reported.
    """
    from pose_core.camera_poses.evaluation import evaluate_trajectory
    from udfs.camera_tables import world_from_cam_from_columns

    gt = np.load(truth / "world_from_cam.npy")
    poses = _query(out, "SELECT frame_idx, world_from_cam_q_wxyz, world_from_cam_t_mu FROM camera_poses")
    est = np.full_like(gt, np.nan)
    est[poses["frame_idx"].to_numpy()] = world_from_cam_from_columns(
        poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"]
    )
    errors = evaluate_trajectory(est, gt)
    return {"frames": len(gt), "posed": errors.num_frames, "ate_rmse_m": errors.ate_rmse_m,
            "ate_pct_of_path": errors.ate_pct_of_path, "path_m": errors.path_length_m,
            **lap_accuracy(est, gt, loop_frames)}  # fmt: skip


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box ``a`` ``(4,)`` with each of ``b`` ``(K, 4)``, boxes as x0, y0, x1, y1."""
    wh = np.clip(np.minimum(a[2:], b[:, 2:]) - np.maximum(a[:2], b[:, :2]), 0.0, None)
    inter = wh[:, 0] * wh[:, 1]
    union = np.prod(a[2:] - a[:2]) + np.prod(b[:, 2:] - b[:, :2], axis=1) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def hand_recall(
    found: dict[int, np.ndarray], hands_px: np.ndarray, visible: np.ndarray, size_wh: tuple[int, int],
    min_iou: float = 0.3,
) -> dict[str, int]:
    """The generator's visible hands against the hands found, frame by frame.

    Args:
        found: frame -> boxes of the hands found there `(K, 4)`, pixels.
        hands_px: true keypoints `(F, 2, 21, 2)` (NaN behind the camera); a hand's true box is theirs,
            clipped to the image.
        visible: `(F, 2)` the generator's "hand in view".
        size_wh: image width and height, pixels.
        min_iou: a true hand is found when a found box, not matched to the frame's other hand, overlaps
            its box by at least this.

    Returns:
        ``visible``, ``found`` (true hands found) and ``unmatched`` (found boxes matching no true hand).
    """
    limit = np.array([*size_wh, *size_wh], np.float64)
    counts = {"visible": 0, "found": 0, "unmatched": 0}
    for f in range(len(hands_px)):
        boxes = found.get(f, np.empty((0, 4)))
        free = np.ones(len(boxes), bool)
        for slot in np.flatnonzero(visible[f]):
            points = hands_px[f, slot][np.isfinite(hands_px[f, slot]).all(axis=1)]
            if len(points) == 0:
                continue
            counts["visible"] += 1
            truth = np.clip(np.r_[points.min(axis=0), points.max(axis=0)], 0.0, limit)
            iou = np.where(free, box_iou(truth, boxes), 0.0) if len(boxes) else np.zeros(0)
            if len(iou) and iou.max() >= min_iou:
                counts["found"] += 1
                free[int(np.argmax(iou))] = False
        counts["unmatched"] += int(free.sum())
    return counts


def hands_and_qa(out: Path, truth: Path) -> dict[str, Any]:
    """The hands stage against the generator's hands (`hand_recall`), fusion's identities, QA's verdict."""
    rows = _query(out, "SELECT frame_idx, box_px, image_width, image_height FROM hands_cam")
    found = {int(f): np.stack(g["box_px"].map(np.asarray)) for f, g in rows.groupby("frame_idx")}
    size = (int(rows["image_width"].iat[0]), int(rows["image_height"].iat[0])) if len(rows) else (1, 1)
    recall = hand_recall(found, np.load(truth / "hands_px.npy"), np.load(truth / "hand_visible.npy"), size)
    others = _query(out, "SELECT count(DISTINCT identity) AS n FROM hands_world WHERE identity LIKE 'other%'")
    qa = _query(out, "SELECT passed, identity_switches FROM qa")
    return {**recall, "other_identities": int(others["n"].iat[0]), "qa_passed": bool(qa["passed"].all()),
            "identity_switches": int(qa["identity_switches"].sum())}  # fmt: skip


def lap_accuracy(est: np.ndarray, gt: np.ndarray, loop_frames: int) -> dict[str, Any]:
    """Each lap of ``loop_frames`` poses ``(F, 4, 4)`` fitted alone (Sim(3)) against the truth ``(F, 4, 4)``.

    Returns:
        ``worst_lap`` (index), ``worst_lap_ate_pct`` (its ATE, % of its own path) and ``lap_scale_min`` /
        ``lap_scale_max``: the laps' fitted scales over the median lap's.
    """
    from pose_core.camera_poses.evaluation import evaluate_trajectory

    laps = [evaluate_trajectory(est[s : s + loop_frames], gt[s : s + loop_frames])
            for s in range(0, len(gt) - loop_frames + 1, loop_frames)]  # fmt: skip
    worst = int(np.argmax([lap.ate_pct_of_path for lap in laps]))
    scales = np.array([lap.scale for lap in laps]) / np.median([lap.scale for lap in laps])
    return {"worst_lap": worst, "worst_lap_ate_pct": laps[worst].ate_pct_of_path,
            "lap_scale_min": float(scales.min()), "lap_scale_max": float(scales.max())}  # fmt: skip


def _sample(work: Path, minutes: float, loop_frames: int) -> tuple[Path, Path]:
    """The `minutes` of footage (written when missing): (videos folder, ground-truth folder)."""
    loops = max(1, round(minutes * 60.0 * FPS / loop_frames))
    name = f"loop{loop_frames}x{loops}"
    root = work / f"in_{name}"
    truth = root / "ground_truth" / name
    if not (truth / "world_from_cam.npy").exists():
        write_sample(root, SampleOptions(frames=loop_frames, loops=loops, name=name))
    return root / "videos", truth


def bench_length(
    work: Path, minutes: float, loop_frames: int, settings: list[str], timeout_s: float
) -> dict[str, Any]:
    """Every stage over one length of footage; see the module docstring."""
    from jobs.pipeline import STAGE_NAMES

    videos, truth = _sample(work, minutes, loop_frames)
    out = work / f"out_{minutes:g}min"
    done_file = out / "bench_stages.json"
    done = json.loads(done_file.read_text()) if done_file.exists() else {}
    stages = []
    for stage in STAGE_NAMES:
        if stage not in done:
            figures = run_stage(stage, videos, out, settings, timeout_s)
            if figures.ok and (error := _failed_episodes(out, stage)):
                figures.ok, figures.error = False, error
            done[stage] = asdict(figures)
            out.mkdir(parents=True, exist_ok=True)
            done_file.write_text(json.dumps(done, indent=2))
            logger.info("%g min %s: %s", minutes, stage, done[stage])
        stages.append(done[stage])
        if not done[stage]["ok"]:
            break
    frames = int(round(minutes * 60.0 * FPS / loop_frames)) * loop_frames
    result: dict[str, Any] = {"minutes": minutes, "frames": frames, "stages": stages}
    if all(s["ok"] for s in stages) and len(stages) == len(STAGE_NAMES):
        cpu = sum(s["cpu_s"] for s in stages)
        result["frames_per_cpu_s"] = frames / cpu
        # a stage with nothing to do (retarget without embodiments) measures no unit: 0
        # each stage's latest run only: a stage run again into the same OUTPUT keeps its earlier runs' rows
        units = _query(
            out,
            "SELECT r.stage, coalesce(sum(r.cpu_s), 0.0) AS cpu_s FROM runs r JOIN (SELECT stage, "
            "max(run_id) AS run_id FROM runs GROUP BY stage) l ON r.stage = l.stage AND r.run_id = l.run_id "
            "GROUP BY r.stage",
        )
        result["unit_cpu_s"] = dict(zip(units["stage"], units["cpu_s"].astype(float), strict=True))
        result["frames_per_unit_cpu_s"] = frames / sum(result["unit_cpu_s"].values())
        result["camera"] = camera_accuracy(out, truth, loop_frames)
        result["hands"] = hands_and_qa(out, truth)
    return result


def _mib(value: float | None) -> str:
    """A peak in MiB, or "-" for figures recorded before it was measured."""
    return "-" if value is None else f"{value:.0f}"


def _worst_lap(cam: dict[str, Any]) -> str:
    """"ATE % (lap N)", or "-" for figures recorded before laps were measured."""
    return f"{cam['worst_lap_ate_pct']:.2f} (lap {cam['worst_lap']})" if "worst_lap" in cam else "-"


def _lap_scales(cam: dict[str, Any]) -> str:
    return f"{cam['lap_scale_min']:.2f} to {cam['lap_scale_max']:.2f}" if "lap_scale_min" in cam else "-"


def _camera_row(r: dict[str, Any]) -> str:
    """One length's row of the camera table."""
    cam = r.get("camera")
    if cam is None:
        return f"| {r['minutes']:g} | {r['frames']} | not reached | | | | | | | |"
    return (
        f"| {r['minutes']:g} | {r['frames']} | {cam['posed']} | {cam['ate_rmse_m']:.4f} | "
        f"{cam['ate_pct_of_path']:.2f} | {cam['path_m']:.1f} | {_worst_lap(cam)} | {_lap_scales(cam)} | "
        f"{r['frames_per_cpu_s']:.2f} | {r['frames_per_unit_cpu_s']:.2f} |"
    )


def _hands_row(r: dict[str, Any]) -> str:
    """One length's row of the hands table."""
    h = r.get("hands")
    if h is None:
        return f"| {r['minutes']:g} | not measured | | | | | | |"
    found = 100 * h["found"] / max(h["visible"], 1)
    return (
        f"| {r['minutes']:g} | {h['visible']} | {h['found']} | {found:.1f} | {h['unmatched']} | "
        f"{h['other_identities']} | {'yes' if h['qa_passed'] else 'no'} | {h['identity_switches']} |"
    )


def _markdown(results: list[dict[str, Any]], meta: dict[str, str], settings: list[str]) -> str:
    lines = [
        "# Long videos (issue 18): memory, CPU and accuracy per stage against footage length", "",
        f"- command: `{meta['command']}`", f"- date: {meta['date']}", f"- machine: {meta['machine']}",
        f"- settings: {', '.join(settings) or 'defaults'}", "",
        "Peak RSS, MiB: the JVM, the largest Python worker, all workers at once; workers PSS: all workers' "
        "proportional shares at once (RSS counts the pages a forked worker or decoding child shares with "
        "its parent in both). CPU: the whole process tree of the stage's `egolake run` (its JVM's start "
        "included).", "",
        "| minutes | stage | ok | wall s | CPU s | JVM MiB | worker MiB | workers MiB | workers PSS MiB "
        "| error |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in results:
        for s in r["stages"]:
            p = s["peaks"]
            lines.append(
                f"| {r['minutes']:g} | {s['stage']} | {'yes' if s['ok'] else 'NO'} | {s['wall_s']:.0f} | "
                f"{s['cpu_s']:.0f} | {p['jvm_mb']:.0f} | {p['worker_mb']:.0f} | {p['workers_mb']:.0f} | "
                f"{_mib(p.get('workers_pss_mb'))} | {s['error']} |"
            )
    lines += [
        "",
        "| minutes | frames | frames posed | ATE RMSE m | ATE % of path | camera path m | worst lap: ATE % "
        "of its path | laps' scales / the median lap's | frames/CPU-s | frames/unit CPU-s |",
        "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    lines += [_camera_row(r) for r in results]
    lines += [
        "",
        "Hands: the generator's hands in view against the hands stage's boxes (a hand is found when a box "
        "overlaps its true box, clipped to the image, by IoU >= 0.3; unmatched: boxes on no true hand); "
        "`other_N` identities fusion gave; QA's verdict.",
        "",
        "| minutes | hands in view | found | found % | unmatched boxes | other identities | QA passed "
        "| identity switches |",
        "|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    lines += [_hands_row(r) for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="folder for the footage and the outputs (kept)")
    parser.add_argument("--out", default="bench/results", help="where long_video.{md,json} go")
    parser.add_argument("--minutes", default="1,10", help="comma-separated lengths, minutes")
    parser.add_argument("--loop-frames", type=int, default=900, help="frames of the rendered loop")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--stage-timeout-s", type=float, default=7200.0, help="a stage running longer is killed, reported"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    adopt_orphans()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    meta = provenance("bench.long_video")
    results = [
        bench_length(work, float(m), args.loop_frames, args.settings, args.stage_timeout_s)
        for m in args.minutes.split(",")
    ]
    result = {**meta, "settings": args.settings, "results": results}
    write_result(args.out, "long_video", result, _markdown(results, meta, args.settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
