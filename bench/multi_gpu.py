"""The GPU stages on N GPUs of one host without Spark: one worker process per GPU, as executors run them.

    python -m bench.multi_gpu --out DIR --gpus 1,2,4,8 [--workers K] [--episodes E] [--frames F]
    python -m bench.multi_gpu --out DIR --gpus 0 --workers 2 ...        (CPU processes, no GPU)
    python -m bench.multi_gpu --out DIR --gpus 1 --workers 8 --hands-lockstep 8 ...   (hands stage only)

For each GPU count N of `--gpus` (a layout), N x K worker processes start (K = `--workers` per GPU; with
`--gpus 0`, K CPU processes in all). Each is a fresh interpreter whose environment is set before
anything loads: CUDA_VISIBLE_DEVICES pins it to its GPU (it sees cuda:0) and the thread variables cap
its CPU threads at host cores / processes (`--threads`); `udfs.device.enter` also caps the pools already
loaded, as a Spark task does. A worker loads the hand model once, then takes episodes from one queue
(as executors take tasks) and runs each through the stage units without Spark
(`udfs.episode_units.episode_tables`: ingest's frame count, priors, hands, tracking, ba, completion;
decode prefetch as configured); with `--hands-lockstep K`, the hands stage only, a worker taking up to K
episodes at once and running all their shards in lockstep (`udfs.hands.hands_for_shards`). The input
set is `--inputs` (videos; a `<stem>.calib.yaml` beside one is its calibration, as in ingest) or a
synthetic clip (`jobs.sample`), repeated to `--episodes`: the same set for every layout.

Writes OUT/<name>.{json,md}: per layout, frames per second of the whole chain (all frames / wall from
the start signal to the last worker's end), per stage (each worker's frames over its seconds in that
stage, summed over workers: what the stage sustains with every worker on it), frames per CPU-second,
the scaling against the first layout, and GPU utilisation per device (nvidia-smi, where it answers);
hand-written notes below the marker of an existing OUT/<name>.md are kept. `--profile` also writes
OUT/<name>.profile.txt: a cProfile of the first layout's first worker (where its CPU per frame goes).
Imports neither pyspark nor delta (the device machine has no Java).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.report import provenance, write_result
from udfs.device import choose_device, enter, thread_env
from udfs.episode_units import STAGES, StageSeconds, episode_tables, shard_rows
from udfs.guard import cpu_seconds

#: Seconds a worker may take to start and load its model before the bench gives up.
START_TIMEOUT_S = 600.0
#: The stages of the pose chain (issue 16's "poses": priors to completion, hands apart).
POSE_STAGES = ("priors", "tracking", "ba", "completion")


@dataclass(frozen=True)
class Layout:
    """One bench configuration: `gpus` GPUs (0: none), `per_gpu` processes on each (in all, for 0)."""

    gpus: int
    per_gpu: int
    threads: int

    @property
    def processes(self) -> int:
        """Worker processes in all."""
        return self.gpus * self.per_gpu if self.gpus else self.per_gpu

    @property
    def name(self) -> str:
        """E.g. "2 GPU x 1" or "CPU x 4"."""
        return f"{self.gpus} GPU x {self.per_gpu}" if self.gpus else f"CPU x {self.per_gpu}"


@dataclass
class WorkerResult:
    """What one worker measured: its episodes, frames, seconds per stage and its wall and CPU seconds."""

    rank: int
    device: str
    threads: int
    setup_s: float
    episodes: int = 0
    frames: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    stage_wall_s: dict[str, float] = field(default_factory=dict)
    stage_cpu_s: dict[str, float] = field(default_factory=dict)


def host_cpus() -> int:
    """CPUs this process may run on (the container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def gpu_names() -> list[str]:
    """The name of each GPU nvidia-smi lists, in index order; none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    args = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    out = subprocess.run(args, capture_output=True, text=True, check=False).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def worker_env(layout: Layout, rank: int) -> dict[str, str]:
    """The environment of worker `rank`: its GPU pinned (none visible without GPUs) and its thread caps."""
    gpu = str(rank // layout.per_gpu) if layout.gpus else ""
    return {"CUDA_VISIBLE_DEVICES": gpu, **thread_env(layout.threads)}


def _worker(  # noqa: PLR0913, PLR0917 - a spawned process's arguments
    rank: int, gpu: bool, threads: int, lockstep: int, tasks: Any, results: Any, start: Any,
    profile: str | None = None,
) -> None:
    """Load once, wait for the start signal, run episodes from `tasks` until None; report to `results`.

    `lockstep` 0: each episode through the chain (`episode_tables`); else the hands stage only, on the
    shards of up to `lockstep` episodes at a time (`hands_for_shards`, as a task runs its shards).
    `profile`: a file for a cProfile of this worker's work after the start signal (text, by own time
    and by cumulative time).
    """
    from udfs.hands import hands_for_shards, load_estimator
    from udfs.options import DecodeOptions, EstimatorOptions, HandsOptions

    t0 = time.perf_counter()
    dev = enter(choose_device(["0"] if gpu else [], threads))  # pinned: its GPU is cuda:0
    hands = HandsOptions(estimator=EstimatorOptions(lockstep_shards=max(lockstep, 1)))
    load_estimator(hands.estimator)  # one model per process, loaded before the clock starts
    result = WorkerResult(rank, dev.name, threads, time.perf_counter() - t0)
    results.put(("ready", rank))
    start.wait()
    seconds = StageSeconds()
    profiler = cProfile.Profile()
    if profile:
        profiler.enable()
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    while items := _take(tasks, max(lockstep, 1)):
        if not lockstep:
            tables = episode_tables(*items[0], seconds=seconds)
            result.frames += len(tables["frames"])
        else:
            with seconds.stage("ingest"):
                shards = [s for i, item in enumerate(items) for s in shard_rows(*item, episode=str(i))]
            with seconds.stage("hands"):
                found = hands_for_shards(shards, hands, DecodeOptions())
            failed = [f for f in found if isinstance(f, Exception)]
            if failed:
                raise RuntimeError(f"hands failed on {len(failed)} shards: {failed[0]}")
            result.frames += sum(int(s["own_stop"].iat[0] - s["own_start"].iat[0]) for s in shards)
        result.episodes += len(items)
    result.wall_s, result.cpu_s = time.perf_counter() - wall0, cpu_seconds() - cpu0
    if profile:
        profiler.disable()
        Path(profile).write_text(_profile_text(profiler))
    result.stage_wall_s, result.stage_cpu_s = seconds.wall_s, seconds.cpu_s
    results.put(("done", asdict(result)))


def _profile_text(profiler: cProfile.Profile, rows: int = 40) -> str:
    """The profile's top `rows` functions by own time, then by cumulative time."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    return text.getvalue()


def _take(tasks: Any, most: int) -> list[tuple[str, str | None]]:
    """Up to `most` episodes from the queue: the first waited for, the rest only if queued; [] at the end."""
    first = tasks.get()
    if first is None:
        return []
    items = [first]
    while len(items) < most:
        try:
            item = tasks.get(timeout=0.1)
        except queue.Empty:
            break
        if item is None:
            tasks.put(None)  # an end marker: left for the next take
            break
        items.append(item)
    return items


class GpuSampler:
    """GPU utilisation and memory per device from `nvidia-smi` every `period_ms`, in a background thread."""

    def __init__(self, period_ms: int = 500) -> None:
        self.samples: list[tuple[int, float, float]] = []  # (index, utilisation %, memory MiB)
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._period_ms = period_ms

    def start(self) -> None:
        """Start sampling (nothing without nvidia-smi)."""
        if shutil.which("nvidia-smi") is None:
            return
        query = "--query-gpu=index,utilization.gpu,memory.used"
        args = ["nvidia-smi", query, "--format=csv,noheader,nounits", f"--loop-ms={self._period_ms}"]
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, lines: Any) -> None:
        for line in lines:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and all(p.replace(".", "", 1).isdigit() for p in parts):
                self.samples.append((int(parts[0]), float(parts[1]), float(parts[2])))

    def stop(self) -> dict[str, dict[str, float]]:
        """Stop; per device index: mean and max utilisation (%), max memory (MiB), samples."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
        by_gpu: dict[str, dict[str, float]] = {}
        for index in sorted({s[0] for s in self.samples}):
            rows = [s for s in self.samples if s[0] == index]
            by_gpu[str(index)] = {
                "util_mean_pct": round(sum(r[1] for r in rows) / len(rows), 1),
                "util_max_pct": max(r[1] for r in rows),
                "memory_max_mib": max(r[2] for r in rows),
                "samples": len(rows),
            }
        return by_gpu


def _collect(results: Any, procs: list[mp.process.BaseProcess], kind: str, timeout_s: float) -> list[Any]:
    """One `kind` message per worker; raises when a worker dies first or the time runs out."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < len(procs):
        try:
            message = results.get(timeout=1.0)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"workers died (exit codes {dead}) or timed out before {kind!r}") from None
            continue
        if message[0] == kind:
            got.append(message[1])
    return got


def run_layout(
    layout: Layout, episodes: list[tuple[str, str | None]], lockstep: int = 0, profile: str | None = None
) -> dict[str, Any]:
    """Run the episodes on `layout`'s workers; the layout's figures (see the module doc).

    `profile`: a file for the cProfile of the first worker (`_worker`).
    """
    ctx = mp.get_context("spawn")
    tasks, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    for item in episodes:
        tasks.put(item)
    for _ in range(layout.processes):
        tasks.put(None)
    procs = []
    saved = dict(os.environ)
    try:
        for rank in range(layout.processes):
            os.environ.update(worker_env(layout, rank))  # a spawned child starts with this environment
            mine = profile if rank == 0 else None
            args = (rank, layout.gpus > 0, layout.threads, lockstep, tasks, results, start, mine)
            procs.append(ctx.Process(target=_worker, args=args, daemon=True))
            procs[-1].start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _collect(results, procs, "ready", START_TIMEOUT_S)
    sampler = GpuSampler()
    sampler.start()
    t0 = time.perf_counter()
    start.set()
    done = [WorkerResult(**r) for r in _collect(results, procs, "done", float("inf"))]
    wall = time.perf_counter() - t0
    gpus = sampler.stop()
    for p in procs:
        p.join()
    return summarise(layout, done, wall, gpus)


def summarise(layout: Layout, workers: list[WorkerResult], wall_s: float, gpus: dict[str, Any]) -> dict:
    """A layout's figures from its workers' results and the wall from start signal to last result."""
    frames = sum(w.frames for w in workers)
    busy = [w for w in workers if w.frames]

    def rate(stages: tuple[str, ...]) -> float | None:
        walls = [sum(w.stage_wall_s.get(s, 0.0) for s in stages) for w in busy]
        return round(sum(w.frames / t for w, t in zip(busy, walls, strict=True)), 2) if all(walls) else None

    cpu = {s: sum(w.stage_cpu_s.get(s, 0.0) for w in workers) for s in STAGES}
    return {
        "layout": layout.name,
        "gpus": layout.gpus,
        "processes": layout.processes,
        "threads_per_process": layout.threads,
        "episodes": sum(w.episodes for w in workers),
        "frames": frames,
        "wall_s": round(wall_s, 3),
        "frames_per_s": round(frames / wall_s, 2),
        "frames_per_cpu_s": round(frames / max(sum(w.cpu_s for w in workers), 1e-9), 2),
        "stage_frames_per_s": {s: rate((s,)) for s in STAGES},
        "stage_frames_per_cpu_s": {s: round(frames / cpu[s], 2) if cpu[s] else None for s in STAGES},
        "poses_frames_per_s": rate(POSE_STAGES),
        "gpu_utilisation": gpus,
        "workers": [asdict(w) for w in workers],
    }


def input_set(args: argparse.Namespace, tmp: str) -> tuple[list[tuple[str, str | None]], str]:
    """(video, calibration_json) per episode, and the input's description."""
    from jobs.sample import SampleOptions, write_sample
    from udfs.ingest import calibration_to_json
    from udfs.media.sidecars import CALIB_SUFFIX, read_calibration

    if args.inputs:
        videos, what = [str(Path(p).resolve()) for p in args.inputs], f"{len(args.inputs)} videos"
    else:
        sample = SampleOptions(
            frames=args.frames, width=args.width, height=args.height, focal_px=500.0 * args.width / 640
        )
        videos = [write_sample(tmp, sample)["video"]]
        what = f"synthetic clip ({args.frames} frames at {args.width}x{args.height})"
    items = []
    for video in videos:
        calib = Path(video).with_suffix("").as_posix() + CALIB_SUFFIX
        items.append((video, calibration_to_json(read_calibration(calib)) if Path(calib).exists() else None))
    n = args.episodes or len(items)
    return [items[i % len(items)] for i in range(n)], f"{what}, {n} episodes"


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown page: provenance, one row per layout, GPU utilisation."""
    head = [f"{k}: `{v}`" if k == "command" else f"{k}: {v}" for k, v in result.items() if k != "layouts"]
    columns = ["layout", "processes", "threads each", "frames", "wall s", "total f/s", "scaling", "poses f/s"]
    columns += [f"{s} f/s" for s in STAGES] + ["frames per CPU-s"]
    table = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    lines = ["# GPU stages on one host, Spark-free", "", "  \n".join(head), "", *table]
    base = result["layouts"][0]["frames_per_s"]
    for r in result["layouts"]:
        cells = [r["layout"], r["processes"], r["threads_per_process"], r["frames"], r["wall_s"]]
        cells += [r["frames_per_s"], f"{r['frames_per_s'] / base:.2f}x", r["poses_frames_per_s"]]
        cells += [r["stage_frames_per_s"][s] for s in STAGES] + [r["frames_per_cpu_s"]]
        cells = ["-" if c is None else c for c in cells]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    util = [
        f"- {r['layout']}: " + ", ".join(
            f"GPU {i} mean {g['util_mean_pct']} % (max {g['util_max_pct']} %, {g['memory_max_mib']:.0f} MiB)"
            for i, g in r["gpu_utilisation"].items()
        )
        for r in result["layouts"] if r["gpu_utilisation"]
    ]  # fmt: skip
    notes = [
        "",
        "Total f/s: all frames over the wall from the start signal to the last worker's end (models loaded "
        "before it). Stage f/s: each worker's frames over its seconds in that stage, summed over workers. "
        "Poses: priors, tracking, ba and completion together. ingest: counting the frames by decoding them.",
    ]
    return "\n".join(lines + (["", "GPU utilisation (nvidia-smi):", *util] if util else []) + notes) + "\n"


def layouts(args: argparse.Namespace) -> list[Layout]:
    """The layouts `--gpus`, `--workers` and `--threads` ask for."""
    counts = [int(g) for g in args.gpus.split(",")]
    if any(g < 0 for g in counts) or args.workers < 1:
        raise SystemExit("--gpus takes counts >= 0 and --workers >= 1")
    have = len(gpu_names())
    if max(counts) > have:
        raise SystemExit(f"--gpus {args.gpus}: this machine shows {have} GPUs (nvidia-smi)")
    out = []
    for g in counts:
        processes = g * args.workers if g else args.workers
        out.append(Layout(g, args.workers, args.threads or max(1, host_cpus() // processes)))
    return out


def main() -> None:
    """Parse the arguments, run every layout on the same input set, write the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default="multi_gpu", help="result file stem")
    parser.add_argument("--gpus", default="0", help="GPU counts, comma-separated (0: CPU processes)")
    parser.add_argument("--workers", type=int, default=1, help="processes per GPU; with --gpus 0, in all")
    parser.add_argument("--threads", type=int, default=0, help="threads per process; 0: cores / processes")
    parser.add_argument("--episodes", type=int, default=0, help="episodes (inputs repeated); 0: one each")
    parser.add_argument(
        "--hands-lockstep", type=int, default=0,
        help="0: the chain per episode; K: the hands stage only, K episodes' shards in lockstep a call",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="cProfile the first layout's first worker: OUT/<name>.profile.txt (own and cumulative time)",
    )  # fmt: skip
    parser.add_argument("--inputs", nargs="*", default=[], help="videos; none: a synthetic clip")
    parser.add_argument("--frames", type=int, default=120, help="synthetic clip: frames")
    parser.add_argument("--width", type=int, default=640, help="synthetic clip: width, pixels")
    parser.add_argument("--height", type=int, default=480, help="synthetic clip: height, pixels")
    args = parser.parse_args()
    plan = layouts(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = str(out.resolve() / f"{args.name}.profile.txt") if args.profile else None
    with tempfile.TemporaryDirectory() as tmp:
        episodes, described = input_set(args, tmp)
        runs = [
            run_layout(layout, episodes, args.hands_lockstep, profile if i == 0 else None)
            for i, layout in enumerate(plan)
        ]
    names = gpu_names()
    accelerator = f"{len(names)} x {names[0]}" if names else ""
    result = {
        **provenance("bench.multi_gpu", accelerator), "input": described, "host_cpus": host_cpus(),
        "layouts": runs,
    }  # fmt: skip
    write_result(out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
