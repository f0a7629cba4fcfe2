"""Priors shard pass with and without decode prefetch: does decoding overlap the KLT work?

    python -m bench.decode_overlap --out bench/results [--frames 240] [--repeats 3]

Writes a synthetic 640x480 clip (`jobs.sample`), then runs the priors stage's per-shard function
(`udfs.priors.shard_outputs`: decode + KLT + image quality) over it as one shard, alternating
`prefetch_chunks=0` (decode in the caller's thread) and `prefetch_chunks=1` (next chunk decoded in a
background thread). Reports the best wall time of each and the CPU time. Writes `decode_overlap.{md,json}`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

import pandas as pd

from bench.report import provenance, write_key_values
from jobs.sample import SampleOptions, write_sample
from pose_core.camera_poses.features import FeatureOptions
from udfs.options import DecodeOptions
from udfs.priors import shard_outputs


def _shard(video: str, frames: int) -> pd.DataFrame:
    return pd.DataFrame(
        [{"episode_id": "bench", "shard_idx": 0, "source_path": video, "kind": "video", "decoder": "decord",
          "frame_start": 0, "frame_stop": frames, "own_start": 0, "own_stop": frames}]
    )  # fmt: skip


def main() -> None:
    """Time both modes and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        video = write_sample(tmp, SampleOptions(frames=args.frames))["video"]
        shard = _shard(video, args.frames)
        timings: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for depth, runs in timings.items():
                decode = replace(DecodeOptions(), prefetch_chunks=depth)
                wall0, cpu0 = time.perf_counter(), time.process_time()
                shard_outputs(shard, decode, FeatureOptions())
                runs.append((time.perf_counter() - wall0, time.process_time() - cpu0))
    best = {depth: min(t, key=lambda x: x[0]) for depth, t in timings.items()}
    result = {
        **provenance("bench.decode_overlap"),
        "input": f"synthetic sample, {args.frames} frames at 640x480, one shard, best of {args.repeats}",
        "inline_wall_s": round(best[0][0], 3),
        "inline_cpu_s": round(best[0][1], 3),
        "prefetch_wall_s": round(best[1][0], 3),
        "prefetch_cpu_s": round(best[1][1], 3),
        "wall_saved_pct": round(100 * (1 - best[1][0] / best[0][0]), 1),
    }
    write_key_values(args.out, "decode_overlap", "priors shard pass: decode prefetch vs inline", result)


if __name__ == "__main__":
    main()
