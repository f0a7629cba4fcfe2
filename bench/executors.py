"""Throughput across executors (issue 18): one batch of episodes on local[1], local[2] and a local cluster.

    python -m bench.executors --work WORK --out bench/results [--episodes 8] [--frames 300]
        [--masters local[1],local[2],local-cluster[2,1,4096]] [--set KEY=VALUE ...]

The batch: `--episodes` synthetic table episodes (`jobs.sample`, seeds 1..N, `--frames` frames at
640x480 each; written once under WORK/in). Each master runs the whole pipeline over the batch into an
output of its own (WORK/out_<master>): `egolake run` for local masters, `spark-submit jobs/submit.py`
for a `local-cluster[workers,cores,MiB]` (a master, workers and executors in JVMs of their own, as on
a cluster). Records the wall time, the CPU time of the whole process tree, frames per second and per
core-second, and the speed-up over the first master. Writes `executors.{md,json}`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.process_tree import adopt_orphans, run_measured
from bench.report import provenance, write_result
from jobs.sample import SampleOptions, write_sample

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


def _cores(master: str) -> int:
    """Cores a master runs tasks on: local[N] -> N, local-cluster[W,C,M] -> W * C."""
    if m := re.fullmatch(r"local\[(\d+)\]", master):
        return int(m.group(1))
    if m := re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master):
        return int(m.group(1)) * int(m.group(2))
    raise ValueError(f"unsupported master {master!r}: local[N] or local-cluster[W,C,MiB]")


def _command(master: str, videos: Path, out: Path, settings: list[str]) -> list[str]:
    sets = [a for s in settings for a in ("--set", s)]
    if master.startswith("local["):
        return [sys.executable, "-m", "jobs.cli", "-q", "run", str(videos), str(out),
                "--set", f"spark.master={master}", *sets]  # fmt: skip
    import pyspark

    from jobs.spark import LOG4J_CONFIG, delta_jars

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return [str(spark_submit), "--master", master, "--jars", ",".join(delta_jars()),
            "--driver-java-options", f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
            str(REPO / "jobs" / "submit.py"), str(videos), str(out), *sets]  # fmt: skip


def _batch(work: Path, episodes: int, frames: int) -> Path:
    """The batch's videos folder (written when missing)."""
    root = work / f"in_{episodes}x{frames}"
    for seed in range(1, episodes + 1):
        if not (root / "videos" / f"synth_{seed:03d}.mp4").exists():
            write_sample(root, SampleOptions(frames=frames, seed=seed))
    return root / "videos"


def run_master(master: str, videos: Path, out: Path, settings: list[str]) -> dict[str, Any]:
    """The whole pipeline over `videos` on `master`: wall and CPU seconds (a fresh output)."""
    shutil.rmtree(out, ignore_errors=True)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": path,
    }
    run = run_measured(_command(master, videos, out, settings), REPO, env)
    if run.returncode != 0:
        raise RuntimeError(f"{master}: exit {run.returncode}: {(run.stderr or run.stdout)[-2000:]}")
    return {"master": master, "cores": _cores(master), "wall_s": run.wall_s, "cpu_s": run.cpu_s,
            "peak_rss_mb": asdict(run.peaks)}  # fmt: skip


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Throughput across executors (issue 18): one batch of episodes, the whole pipeline", "",
        f"- command: `{result['command']}`", f"- date: {result['date']}", f"- machine: {result['machine']}",
        f"- batch: {result['episodes']} synthetic episodes x {result['frames']} frames (640x480, 30 fps); "
        f"settings: {', '.join(result['settings']) or 'defaults'}", "",
        "| master | cores | wall s | CPU s | frames/s | frames per core-s | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    base = result["runs"][0]["wall_s"]
    total = result["episodes"] * result["frames"]
    for r in result["runs"]:
        rate = total / r["wall_s"]
        lines.append(
            f"| {r['master']} | {r['cores']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {rate:.2f} | "
            f"{rate / r['cores']:.2f} | {base / r['wall_s']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="folder for the batch and the outputs")
    parser.add_argument("--out", default="bench/results", help="where executors.{md,json} go")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--frames", type=int, default=300, help="frames per episode")
    parser.add_argument("--masters", default="local[1],local[2],local-cluster[2,1,4096]")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    adopt_orphans()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {**provenance("bench.executors"), "episodes": args.episodes,
                              "frames": args.frames, "settings": args.settings, "runs": []}  # fmt: skip
    videos = _batch(work, args.episodes, args.frames)
    for master in re.findall(r"local(?:-cluster)?\[[^\]]*\]", args.masters):
        slug = re.sub(r"[^a-z0-9]+", "_", master).strip("_")
        result["runs"].append(run_master(master, videos, work / f"out_{slug}", args.settings))
        logger.info("%s", result["runs"][-1])
    write_result(args.out, "executors", result, _markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
