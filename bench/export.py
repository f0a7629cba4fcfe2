"""LeRobot export speed: egolake's Spark export vs lerobot's own recorder, same episodes and codec.

    nice -n 10 python -m bench.export --out bench/results [--episodes 16] [--frames 300] [--videos 2]

Synthetic episodes (jobs.sample, 640x480 at 30 fps; `--videos` distinct rendered clips, reused
round-robin by the episodes, since rendering costs far more than exporting) become upstream tables
written directly from their ground truth (videos, frames, camera_poses, hands_world, runs), so only
the export is timed. egolake: `jobs.export.run` on local[N] for each N of `--cores` (a warm session
each, Python workers cold; the time covers planning, the executors' decode + tensors + encode + data
files, meta/ and publishing); the executors' own unit times are summed next to it. lerobot 0.4.4 (in
.venv-lerobot, `EGOLAKE_LEROBOT_PYTHON`): `LeRobotDataset.create` + `add_frame` + `save_episode` +
`finalize` over the same tensors and source frames, decoded by egolake's decoder with the export's
settings (bench/lerobot_baseline.py), in its default mode
(PNG frames, encoded at save_episode) and its `streaming_encoding` mode. Both write 320x240 H.264
(libx264, crf 30, GOP 2: lerobot's encoder defaults) with one encoder thread, without face blurring.
CPU time is summed over the whole process tree (JVM, Python workers, encoder) from /proc. The load
average before and after goes into the results: on a shared machine wall times are inflated, CPU
times much less. Writes `export.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from bench.report import provenance
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
                    "world_from_cam_t_mu": list(poses[:, :3, 3]),
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
            "unit_s": np.nan,
            "cpu_s": np.nan,
            "config_hash": "bench",
            "stage_version": "1",
        }
    )
    append(spark.createDataFrame(runs, RUNS.spark_full), layout, RUNS)


def _timed_export(ctx, name: str) -> dict:  # noqa: ANN001
    """One `jobs.export.run` into dataset `name`: wall and process-tree CPU, the units' sums."""
    from jobs import export
    from jobs.tables import Lineage

    ctx = replace(ctx, cfg=replace(ctx.cfg, export=replace(ctx.cfg.export, name=name)))
    t0, c0 = time.perf_counter(), _tree_cpu_s(os.getpid())
    result = export.run(ctx, Lineage(ctx.run_id, export.STAGE_VERSION, "bench"))
    wall, cpu = time.perf_counter() - t0, _tree_cpu_s(os.getpid()) - c0
    if result.version is None:
        raise RuntimeError(f"egolake export {name} wrote no version: {result.outcomes}")
    units = np.array(list(result.unit_seconds.values()))
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "unit_wall_s": float(units[:, 0].sum()),
        "unit_cpu_s": float(units[:, 1].sum()),
        "frames": result.manifest["counts"]["frames"],
        "dataset": os.path.join(ctx.layout.datasets, name, result.version),
    }


def _egolake(outs: dict[int, str], samples: list[Path], cores: int) -> dict[str, dict]:
    """Exports in a fresh local[cores] session, in this order.

    All episodes cold (a standalone `egolake run --stages export`: JIT, Delta logs and Python workers
    start), all warm (as at the end of a pipeline run), a quarter of them warm (separates the cost of
    an export from the cost of a frame, `_at_scale`; their OUTPUT is exported once untimed first, so
    its Delta logs are as warm as the first's), and that quarter again with faces blurred (the product
    default; lerobot has no such step). `outs`: {episodes: OUTPUT folder holding that many of `samples`}.
    """
    from jobs.config import load_config
    from jobs.spark import build_spark
    from jobs.stage import StageContext
    from jobs.tables import Layout

    cfg = load_config(
        [],
        [
            f"spark.master=local[{cores}]",
            "export.crf=30",
            "export.gop_size=2",
            "export.encoder_threads=1",
            "export.privacy.enabled=false",
            "spark.shuffle_partitions=4",
        ],
    )
    spark = build_spark(cfg.spark)
    for episodes, out in outs.items():
        if not os.path.isdir(os.path.join(out, "tables", "runs")):
            _upstream_tables(spark, out, samples[:episodes])
    spark.range(4).count()  # the session is up
    every, quarter = max(outs), min(outs)
    blurred = replace(cfg, export=replace(cfg.export, privacy=replace(cfg.export.privacy, enabled=True)))
    runs = {
        "cold": (every, cfg),
        "warm": (every, cfg),
        "": (quarter, cfg),  # untimed: warms the quarter's OUTPUT
        f"warm, {quarter} episodes": (quarter, cfg),
        f"warm, {quarter} episodes, faces blurred": (quarter, blurred),
    }
    rows = {}
    for n, (state, (episodes, run_cfg)) in enumerate(runs.items()):
        ctx = StageContext(spark, run_cfg, Layout(outs[episodes]), f"bench-{cores}")
        if not state:
            _timed_export(ctx, f"bench{cores}n{n}")
            continue
        rows[f"egolake local[{cores}] {state}"] = {
            **_timed_export(ctx, f"bench{cores}n{n}"),
            "cores": cores,
            "episodes": episodes,
            "faces_blurred": run_cfg.export.privacy.enabled,
        }
    spark.stop()
    return rows


def _at_scale(rows: dict[str, dict]) -> dict[str, dict]:
    """Per local[N]: the cost of one export (fixed) and of each frame, from its warm exports.

    CPU seconds = fixed + per_frame x frames, solved from the all-episodes and quarter-size warm runs
    without face blur; likewise wall seconds. The per-frame cost with faces blurred is the blurred
    quarter's CPU less the fixed cost. At scale (thousands of episodes per export) the per-frame cost
    is what counts.
    """
    out = {}
    for label, big in rows.items():
        if not label.endswith(" warm"):
            continue
        mine = [r for r in rows.values() if "episodes" in r and r["cores"] == big["cores"] and r is not big]
        small = next(r for r in mine if r["episodes"] < big["episodes"] and not r["faces_blurred"])
        blurred = next(r for r in mine if r["faces_blurred"])
        frames = big["frames"] - small["frames"]
        cpu, wall = (big[k] - small[k] for k in ("cpu_s", "wall_s"))
        fixed = big["cpu_s"] - cpu / frames * big["frames"]
        out[label.removesuffix(" warm")] = {
            "cores": big["cores"],
            "fixed_cpu_s": fixed,
            "cpu_ms_per_frame": 1e3 * cpu / frames,
            "frames_per_s_per_core": frames / wall / big["cores"],
            "cpu_ms_per_frame_faces_blurred": 1e3 * (blurred["cpu_s"] - fixed) / blurred["frames"],
        }
    return out


def _decode_encode_floor(dataset: str, work: str) -> dict:
    """Decode + encode alone, in this process, for the exported episodes: the work both paths share.

    Same source frames, decoder settings (`source_decode_options`) and encoder settings as the export;
    no tensors, files, statistics or Spark.
    """
    from udfs.lerobot.episode import encode_options, source_decode_options
    from udfs.media.decode import iter_frames
    from udfs.media.encode import VideoWriter
    from udfs.options import ExportOptions

    manifest = json.loads(Path(dataset, "manifest.json").read_text(encoding="utf-8"))
    opts = ExportOptions(crf=30, gop_size=2, encoder_threads=1)
    path = os.path.join(work, "floor.mp4")
    t0, c0 = time.perf_counter(), _tree_cpu_s(os.getpid())
    frames = 0
    for episode in manifest["episodes"]:
        with VideoWriter(path, manifest["fps"], encode_options(opts)) as writer:
            decode = source_decode_options(opts)
            for chunk in iter_frames(episode["source_path"], 0, episode["length"], decode):
                for frame in chunk.frames:
                    writer.write(frame)
                    frames += 1
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _tree_cpu_s(os.getpid()) - c0, "frames": frames}


def _lerobot(dataset: str, work: str, mode: str) -> dict:
    from udfs.lerobot.episode import source_decode_options
    from udfs.options import ExportOptions

    python = os.environ.get("EGOLAKE_LEROBOT_PYTHON", str(REPO / ".venv-lerobot" / "bin" / "python"))
    info = json.loads(Path(dataset, "meta", "info.json").read_text(encoding="utf-8"))
    manifest = json.loads(Path(dataset, "manifest.json").read_text(encoding="utf-8"))
    index_keys = ("timestamp", "frame_index", "episode_index", "index", "task_index")
    key = "observation.images.ego"
    job = {
        "repo_id": "bench/lerobot",
        "root": os.path.join(work, f"lerobot_{mode}"),
        "mode": mode,
        "fps": info["fps"],
        "vcodec": "h264",
        "decode": asdict(source_decode_options(ExportOptions())),  # the export's decoder settings
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
    shutil.rmtree(job["root"], ignore_errors=True)  # LeRobotDataset.create wants a new folder
    job_path = os.path.join(work, f"lerobot_{mode}.json")
    with open(job_path, "w", encoding="utf-8") as fh:
        json.dump(job, fh)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}  # lerobot + udfs.media.decode
    done = subprocess.run(
        [python, str(REPO / "bench" / "lerobot_baseline.py"), job_path],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"lerobot baseline ({mode}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _header(columns: list[str], ratios: tuple[str, ...], baselines: dict[str, dict]) -> list[str]:
    """A markdown table's header and rule: `columns`, then each ratio kind against each baseline."""
    names = columns + [f"{kind} vs {base}" for kind in ratios for base in baselines]
    return ["| " + " | ".join(names) + " |", "|---" * len(names) + "|"]


def _markdown(args: argparse.Namespace, rows: dict[str, dict], meta: dict) -> str:
    baselines = {k: r for k, r in rows.items() if k.startswith("lerobot")}
    base = next(iter(baselines.values()))
    lines = [
        "# LeRobot export: egolake (Spark executors) vs lerobot's recorder",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        f"- episodes: {args.episodes} synthetic ({args.videos} distinct rendered clips, reused), "
        f"{args.frames} source frames each at 640x480 30 fps; dataset 30 fps, {base['frames']} frames "
        "in all; 320x240 H.264 (libx264, crf 30, GOP 2 = lerobot's defaults, one encoder thread); "
        "no face blur unless a row says so",
        "- egolake time: `jobs.export.run` (planning, executors' decode + tensors + encode + parquet, "
        "meta/, publish), four times per fresh local[N] session: cold (JIT, Delta log and Python "
        "workers start, as a standalone `egolake run --stages export`), then warm (as at the end of a "
        "pipeline run), then warm on a quarter of the episodes (another OUTPUT, exported once untimed "
        "before), then that quarter with "
        "faces blurred (egolake's default; lerobot has no such step); Σ unit: the executors' "
        "per-episode unit "
        "times (wall, and CPU of the worker process) summed; lerobot time: create + add_frame + "
        "save_episode + finalize, decoding included, imports excluded",
        "",
        *_header(
            ["path", "cores", "wall s", "CPU s", "Σ unit wall s", "Σ unit CPU s"]
            + ["frames/s per core", "frames per CPU-s"],
            ("per core", "per CPU-s"),
            baselines,
        ),
    ]
    for label, r in rows.items():
        per_core = r["frames"] / r["wall_s"] / r["cores"]
        per_cpu = r["frames"] / r["cpu_s"]
        units = [f"{r[k]:.1f}" if k in r else "" for k in ("unit_wall_s", "unit_cpu_s")]
        ratios = [f"{per_core / (b['frames'] / b['wall_s']):.2f}x" for b in baselines.values()]
        ratios += [f"{per_cpu / (b['frames'] / b['cpu_s']):.2f}x" for b in baselines.values()]
        lines.append(
            f"| {label} | {r['cores']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {' | '.join(units)} | "
            f"{per_core:.1f} | {per_cpu:.1f} | {' | '.join(ratios)} |"
        )
    lines += [
        "",
        "Per core = frames per wall second divided by the cores the path may use (local[N]: N; lerobot: "
        "1 process; either may run a few threads at once: decoding ahead, the JVM, lerobot's streaming "
        "encoder thread). Per CPU-s = frames per CPU second of the whole process tree, the fairer figure "
        "on a shared machine. `decode + encode only`: the source decoded and the video encoded with the "
        "same settings and nothing else, the floor under both paths.",
        "",
        "## At scale: the cost of an export and the cost of a frame",
        "",
        "From each local[N]'s two warm exports (all episodes, a quarter of them): CPU s = fixed + "
        "per frame x frames, and likewise wall s. An export of thousands of episodes costs the per-frame "
        "figure; lerobot's figures are its whole run (its fixed part, create + finalize, is under a "
        "second).",
        "",
        *_header(
            ["path", "fixed CPU s per export", "CPU ms per frame", "frames per CPU-s", "frames/s per core"]
            + ["CPU ms per frame, faces blurred"],
            ("per CPU-s", "per core"),
            baselines,
        ),
    ]
    for label, s in _at_scale(rows).items():
        per_cpu = 1e3 / s["cpu_ms_per_frame"]
        ratios = [f"{per_cpu / (b['frames'] / b['cpu_s']):.2f}x" for b in baselines.values()]
        ratios += [
            f"{s['frames_per_s_per_core'] / (b['frames'] / b['wall_s']):.2f}x" for b in baselines.values()
        ]
        lines.append(
            f"| {label} | {s['fixed_cpu_s']:.1f} | {s['cpu_ms_per_frame']:.2f} | {per_cpu:.1f} | "
            f"{s['frames_per_s_per_core']:.1f} | {s['cpu_ms_per_frame_faces_blurred']:.2f} | "
            f"{' | '.join(ratios)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both paths on the same episodes and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--videos", type=int, default=2, help="distinct rendered clips the episodes reuse")
    parser.add_argument("--cores", default="1,2", help="comma-separated N of the local[N] runs")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO")
    args = parser.parse_args()
    init_logging(args.verbose)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = args.work or tempfile.mkdtemp(prefix="bench_export_")
    sample_dir = Path(work) / "sample"
    for seed in range(min(args.videos, args.episodes)):
        if not (sample_dir / "videos" / f"synth_{seed:03d}.mp4").exists():
            write_sample(sample_dir, SampleOptions(frames=args.frames, seed=seed))
    clips = sorted((sample_dir / "videos").glob("synth_*.mp4"))[: args.videos]
    samples = [clips[i % len(clips)] for i in range(args.episodes)]
    quarter = max(1, args.episodes // 4)
    outs = {n: os.path.join(work, f"out{n}") for n in (args.episodes, quarter)}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)  # an earlier run's datasets would make "nothing changed"
    meta = {**provenance("bench.export"), "load average (1 min) before": f"{os.getloadavg()[0]:.1f}"}
    rows: dict[str, dict] = {}
    for cores in (int(c) for c in args.cores.split(",")):
        logger.info("egolake export on local[%d]", cores)
        rows.update(_egolake(outs, samples, cores))
    first = next(iter(rows.values()))["dataset"]
    for mode in ("png", "streaming"):
        logger.info("lerobot baseline, %s", mode)
        rows[f"lerobot {mode}"] = {**_lerobot(first, work, mode), "cores": 1}
    logger.info("decode + encode alone")
    rows["decode + encode only"] = {**_decode_encode_floor(first, work), "cores": 1}
    meta["load average (1 min) after"] = f"{os.getloadavg()[0]:.1f}"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    text = _markdown(args, rows, meta)
    (Path(args.out) / "export.md").write_text(text, encoding="utf-8")
    (Path(args.out) / "export.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "at_scale": _at_scale(rows)}, indent=2, default=str),
        encoding="utf-8",
    )
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
