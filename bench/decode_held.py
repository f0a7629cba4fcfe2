"""Decoding while the caller works on each chunk: the decoder's CPU and memory, per backend.

    python -m bench.decode_held --out bench/results [--frames 256] [--hold-s 0,0.5]

The per-shard stages decode a shard in chunks and work on each one (hands: ~1 s per 32-frame chunk
on one CPU) before asking for the next. A decoder that keeps decoding while the caller works spends CPU
and memory on frames nobody asked for (decord's decoder thread does, to the end of the video, unless
parked: dmlc/decord#157). Footage: the synthetic 640x480 clip (`jobs.sample`, 300 frames, 9 loops
= 2700 frames); `--frames` frames from the middle in 32-frame chunks, the caller sleeping `hold`
seconds on each chunk (sleeping costs no CPU: what the process spends is the decoder's). Each case
runs in a fresh process: its CPU seconds, wall seconds and peak RSS. Writes `decode_held.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import provenance, write_result
from jobs.sample import SampleOptions, write_sample

CHUNK = 32
_CASE = f"""
import json, resource, sys, time
from udfs.media.decode import iter_frames
from udfs.options import DecodeOptions
path, backend = sys.argv[1:3]
start, frames, hold = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
opts = DecodeOptions(backend=backend, prefetch_chunks=0, timeout_s=0.0)
cpu0, wall0, n = time.process_time(), time.perf_counter(), 0
for chunk in iter_frames(path, start, start + frames, opts, {CHUNK}):
    n += len(chunk.frame_idx)
    time.sleep(hold)
print(json.dumps({{"frames": n, "cpu_s": time.process_time() - cpu0,
                   "wall_s": time.perf_counter() - wall0 - hold * -(-n // {CHUNK}),
                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def run_case(video: str, backend: str, start: int, frames: int, hold_s: float) -> dict:
    """One case in a fresh process: frames, decode CPU-s, wall-s less the holds, peak RSS MiB."""
    out = subprocess.run(  # noqa: S603 - our own snippet, no shell
        [sys.executable, "-c", _CASE, video, backend, str(start), str(frames), str(hold_s)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {"backend": backend, "hold_s": hold_s, **json.loads(out.stdout.strip().splitlines()[-1])}


def _markdown(rows: list[dict], meta: dict, frames: int) -> str:
    lines = [
        "# Decoding while the caller works: the decoder's CPU and memory per backend",
        "",
        f"- command: {meta['command']}",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine']}",
        f"- input: synthetic 640x480 H.264, 2700 frames; {frames} frames from frame 1200 in {CHUNK}-frame "
        "chunks, the caller holding each chunk `hold_s` seconds; cpu_s = the process's CPU (the "
        "decoder's: holding is a sleep); wall_s excludes the holds",
        "",
        "| backend | hold_s | frames | cpu_s | cpu_ms_per_frame | wall_s | peak_rss_mb |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['hold_s']} | {r['frames']} | {r['cpu_s']:.2f} | "
            f"{1000 * r['cpu_s'] / max(r['frames'], 1):.2f} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--hold-s", default="0,0.5", help="comma-separated seconds per chunk")
    args = parser.parse_args(argv)
    meta = provenance("bench.decode_held")
    with tempfile.TemporaryDirectory() as tmp:
        video = str(write_sample(Path(tmp), SampleOptions(frames=300, loops=9))["video"])
        rows = [
            run_case(video, backend, 1200, args.frames, float(hold))
            for hold in args.hold_s.split(",")
            for backend in ("decord", "pyav")
        ]
    write_result(args.out, "decode_held", {**meta, "results": rows}, _markdown(rows, meta, args.frames))
    return 0


if __name__ == "__main__":
    sys.exit(main())
