"""LeRobot export speed: egolake's Spark export vs lerobot's own recorder, same episodes and codec.

    python -m bench.export --out bench/results [--episodes 4] [--frames 60]

Synthetic episodes (jobs.sample, 640x480 at 30 fps) become upstream tables written directly from
their ground truth (videos, frames, camera_poses, hands_world, runs), so only the export is timed.
egolake: `jobs.export.run` on local[1] and local[2] (a warm session each; the time covers planning,
the executors' decode + tensors + encode + data files, meta/ and publishing). lerobot 0.4.4 (in
.venv-lerobot, `EGOLAKE_LEROBOT_PYTHON`): `LeRobotDataset.create` + `add_frame` + `save_episode` +
`finalize` over the same tensors and source frames (bench/lerobot_baseline.py). Both write 320x240
H.264 (libx264, crf 30, GOP 2: lerobot's encoder defaults) without face blurring. CPU time is summed
over the whole process tree (JVM, Python workers, encoder) from /proc. Writes `export.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.logs import init_logging
from jobs.sample import SampleOptions, write_sample
from pose_core.geometry.rigid3 import quat_wxyz_from_matrix
from schemas.base import TableSchema
from schemas.tables import CAMERA_POSES, FRAMES, HANDS_WORLD, RUNS, VIDEOS

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants (live ones, plus waited-for dead ones), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _table(schema: TableSchema, columns: dict) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({c: columns.get(c, [None] * n) for c in schema.columns})


def _upstream_tables(spark, out: str, samples: list[Path]) -> None:
    """Write videos, frames, camera_poses, hands_world and fusion `runs` rows from the ground truth."""
    from jobs.tables import Layout, Lineage, append, write

    layout, lineage = Layout(out), Lineage("bench", "1", "bench")
    parts: dict[str, list[pd.DataFrame]] = {"videos": [], "frames": [], "camera_poses": [], "hands_world": []}
    for i, video in enumerate(samples):
        gt = video.parent.parent / "ground_truth" / video.stem
        ts, poses = np.load(gt / "ts_s.npy"), np.load(gt / "world_from_cam.npy")
        kp, visible = np.load(gt / "hands_world.npy"), np.load(gt / "hand_visible.npy")
        eid, n = f"{i:016x}", len(ts)
        parts["videos"].append(
            _table(
                VIDEOS,
                {
                    "episode_id": [eid],
                    "source_path": [str(video)],
                    "kind": ["video"],
                    "decoder": ["pyav"],
                    "task_text": ["pick and place"],
                    "content_sha256": [eid],
                },
            )
        )
        idx = np.arange(n)
        parts["frames"].append(
            _table(FRAMES, {"episode_id": [eid] * n, "frame_idx": idx, "ts_s": ts, "shard_idx": [0] * n})
        )
        parts["camera_poses"].append(
            _table(
                CAMERA_POSES,
                {
                    "episode_id": [eid] * n,
                    "frame_idx": idx,
                    "ts_s": ts,
                    "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(poses[:, :3, :3])),
                    "world_from_cam_t_m": list(poses[:, :3, 3]),
                    "pose_quality": ["keyframe"] * n,
                    "tracking_state": ["tracking"] * n,
                    "segment_id": [0] * n,
                    "is_keyframe": [False] * n,
                },
            )
        )
        f_idx, slot = np.nonzero(visible)
        parts["hands_world"].append(
            _table(
                HANDS_WORLD,
                {
                    "episode_id": [eid] * len(f_idx),
                    "frame_idx": f_idx,
                    "identity": np.array(["wearer_left", "wearer_right"])[slot],
                    "ts_s": ts[f_idx],
                    "keypoints_world_m": [
                        kp[f, s].ravel().tolist() for f, s in zip(f_idx, slot, strict=True)
                    ],
                    "filled": [False] * len(f_idx),
                    "scale_source": ["none"] * len(f_idx),
                },
            )
        )
    episodes = [f"{i:016x}" for i in range(len(samples))]
    for schema in (VIDEOS, FRAMES, CAMERA_POSES, HANDS_WORLD):
        pdf = pd.concat(parts[schema.name], ignore_index=True)
        write(spark.createDataFrame(pdf, schema.spark), layout, schema, episodes, lineage)
    now = datetime.now(timezone.utc)
    runs = pd.DataFrame(
        {
            "run_id": "bench",
            "stage": "fusion",
            "episode_id": episodes,
            "status": "ok",
            "started": now,
            "finished": now,
            "rows": 0,
            "error": None,
            "config_hash": "bench",
            "stage_version": "1",
        }
    )
    append(spark.createDataFrame(runs, RUNS.spark_full), layout, RUNS)


def _egolake(out: str, samples: list[Path], master: str, name: str) -> dict:
    from jobs import export
    from jobs.config import load_config
    from jobs.spark import build_spark
    from jobs.stage import StageContext
    from jobs.tables import Layout, Lineage

    cfg = load_config(
        [],
        [
            f"spark.master={master}",
            f"export.name={name}",
            "export.crf=30",
            "export.gop_size=2",
            "export.privacy.enabled=false",
            "spark.shuffle_partitions=4",
        ],
    )
    t_session = time.perf_counter()
    spark = build_spark(cfg.spark)
    session_s = time.perf_counter() - t_session
    if not os.path.isdir(os.path.join(out, "tables", "runs")):
        _upstream_tables(spark, out, samples)
    ctx = StageContext(spark, cfg, Layout(out), f"bench-{name}")
    spark.range(4).count()  # warm the JVM side
    t0, c0 = time.perf_counter(), _tree_cpu_s(os.getpid())
    result = export.run(ctx, Lineage(ctx.run_id, export.STAGE_VERSION, "bench"))
    wall, cpu = time.perf_counter() - t0, _tree_cpu_s(os.getpid()) - c0
    spark.stop()
    if result.version is None:
        raise RuntimeError(f"egolake export on {master} wrote no version: {result.outcomes}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "frames": result.manifest["counts"]["frames"],
        "session_s": session_s,
        "dataset": os.path.join(out, "datasets", name, result.version),
    }


def _lerobot(dataset: str, work: str) -> dict:
    python = os.environ.get("EGOLAKE_LEROBOT_PYTHON", str(REPO / ".venv-lerobot" / "bin" / "python"))
    info = json.loads(Path(dataset, "meta", "info.json").read_text(encoding="utf-8"))
    manifest = json.loads(Path(dataset, "manifest.json").read_text(encoding="utf-8"))
    index_keys = ("timestamp", "frame_index", "episode_index", "index", "task_index")
    key = "observation.images.ego"
    job = {
        "repo_id": "bench/lerobot",
        "root": os.path.join(work, "lerobot_dataset"),
        "fps": info["fps"],
        "vcodec": "h264",
        "video_key": key,
        "width": info["features"][key]["shape"][1],
        "height": info["features"][key]["shape"][0],
        "features": {
            k: {kk: v[kk] for kk in ("dtype", "shape", "names")}
            for k, v in info["features"].items()
            if k not in index_keys
        },
        "episodes": [
            {
                "data": os.path.join(dataset, f"data/chunk-000/file-{e['episode_index']:03d}.parquet"),
                "video": e["source_path"],
                "task": e["task"],
            }
            for e in manifest["episodes"]
        ],
    }
    job_path = os.path.join(work, "lerobot_job.json")
    with open(job_path, "w", encoding="utf-8") as fh:
        json.dump(job, fh)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [python, str(REPO / "bench" / "lerobot_baseline.py"), job_path],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"lerobot baseline failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _markdown(args: argparse.Namespace, rows: dict[str, dict], episodes: int) -> str:
    base = rows["lerobot"]
    lines = [
        "# LeRobot export: egolake (Spark executors) vs lerobot's recorder",
        "",
        f"- command: `python -m bench.export --episodes {args.episodes} --frames {args.frames}`",
        f"- machine: {platform.node()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores "
        "(shared with other work while measuring)",
        f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- episodes: {episodes} synthetic, {args.frames} source frames each at 640x480 30 fps; "
        f"dataset 30 fps, {base['frames']} frames in all; 320x240 H.264 (libx264, crf 30, GOP 2 = "
        "lerobot's defaults); no face blur",
        "- egolake time: `jobs.export.run` in a warm session (planning, executors' decode + tensors + "
        "encode + parquet, meta/, publish); lerobot time: create + add_frame + save_episode + finalize, "
        "decoding included",
        "",
        "| path | cores | wall s | CPU s | frames/s | frames/s per core | speed-up per core vs lerobot |",
        "|---|---|---|---|---|---|---|",
    ]
    base_per_core = base["frames"] / base["wall_s"]
    for label, r in rows.items():
        cores = r["cores"]
        fps = r["frames"] / r["wall_s"]
        lines.append(
            f"| {label} | {cores} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {fps:.1f} | {fps / cores:.1f} | "
            f"{fps / cores / base_per_core:.2f}x |"
        )
    lines += [
        "",
        "Per core = frames per wall second divided by the cores the path may use (lerobot: 1 process; "
        "its encoder may use more threads, see its CPU time).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both paths on the same episodes and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO")
    args = parser.parse_args()
    init_logging(args.verbose)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = args.work or tempfile.mkdtemp(prefix="bench_export_")
    sample_dir = Path(work) / "sample"
    for seed in range(args.episodes):
        write_sample(sample_dir, SampleOptions(frames=args.frames, seed=seed))
    samples = sorted((sample_dir / "videos").glob("synth_*.mp4"))
    out = os.path.join(work, "out")
    rows: dict[str, dict] = {}
    for cores in (1, 2):
        logger.info("egolake export on local[%d]", cores)
        r = _egolake(out, samples, f"local[{cores}]", f"bench{cores}")
        rows[f"egolake local[{cores}]"] = {**r, "cores": cores}
    logger.info("lerobot baseline")
    rows["lerobot"] = {**_lerobot(rows["egolake local[1]"]["dataset"], work), "cores": 1}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "export.md").write_text(_markdown(args, rows, len(samples)), encoding="utf-8")
    (Path(args.out) / "export.json").write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
    sys.stdout.write(_markdown(args, rows, len(samples)))


if __name__ == "__main__":
    main()
