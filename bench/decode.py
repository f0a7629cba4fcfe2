"""Decoding to the dataset size: CPU per frame per backend, and the fidelity cost of skipping deblocking.

    python -m bench.decode --out bench/results [--frames 300] [--long-side 320] [--repeats 3]

Inputs: a synthetic 640x480 clip (`jobs.sample`) and the real 1280x720 hand video of shared/data
(`EGOLAKE_SHARED_DATA`, default ../shared/data; skipped when absent). Each is decoded whole, in this
process with prefetch off, at `--long-side` pixels by `udfs.media.decode`: decord, PyAV, and PyAV
with `skip_deblocking_below=0.5` (the export's default). CPU ms per frame is the best of `--repeats`.
Fidelity of the skipped deblocking: Y-PSNR (dB) of each frame against the full PyAV decode at the
same size. Writes `decode.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from bench.report import SHARED_DATA, provenance
from jobs.sample import SampleOptions, write_sample
from udfs.media.decode import decode_frames
from udfs.options import DecodeOptions

HAND_VIDEO = SHARED_DATA / "hands_dexretargeting" / "human_hand_video.mp4"


def _settings(long_side: int) -> dict[str, DecodeOptions]:
    pyav = DecodeOptions(backend="pyav", max_long_side_px=long_side, prefetch_chunks=0)
    return {
        "decord": DecodeOptions(backend="decord", max_long_side_px=long_side, prefetch_chunks=0),
        "pyav": pyav,
        "pyav, deblocking skipped": DecodeOptions(
            backend="pyav", max_long_side_px=long_side, prefetch_chunks=0, skip_deblocking_below=0.5
        ),
    }


def _luma(frames: np.ndarray) -> np.ndarray:
    return np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]).astype(np.float64)


def _measure(video: str, long_side: int, repeats: int) -> dict:
    """CPU ms per frame per setting, and Y-PSNR of the skipped deblocking against the full decode."""
    row: dict = {}
    frames = {}
    for name, opts in _settings(long_side).items():
        best = np.inf
        for _ in range(repeats):
            cpu0 = time.process_time()
            decoded = decode_frames(video, 0, None, opts)
            best = min(best, (time.process_time() - cpu0) / len(decoded.frames) * 1e3)
        frames[name] = decoded.frames
        row[f"{name}: CPU ms/frame"] = round(best, 2)
    mse = ((_luma(frames["pyav"]) - _luma(frames["pyav, deblocking skipped"])) ** 2).mean(axis=(1, 2))
    psnr = 10 * np.log10(255.0**2 / np.maximum(mse, 1e-12))
    row["deblocking skipped: Y-PSNR vs full decode, worst frame dB"] = round(float(psnr.min()), 1)
    row["deblocking skipped: Y-PSNR vs full decode, median dB"] = round(float(np.median(psnr)), 1)
    row["frames"] = len(frames["pyav"])
    row["decoded size"] = "x".join(map(str, frames["pyav"].shape[2:0:-1]))
    return row


def main() -> None:
    """Measure every input and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--long-side", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    meta = {**provenance("bench.decode"), "load average (1 min) before": f"{os.getloadavg()[0]:.1f}"}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sample = write_sample(tmp, SampleOptions(frames=args.frames))["video"]
        results["synthetic 640x480 H.264"] = _measure(sample, args.long_side, args.repeats)
    if HAND_VIDEO.exists():
        results["real hand video 1280x720 H.264"] = _measure(str(HAND_VIDEO), args.long_side, args.repeats)
    meta["load average (1 min) after"] = f"{os.getloadavg()[0]:.1f}"
    columns = list(next(iter(results.values())))
    lines = [
        "# Decoding to the dataset size: CPU per frame, and the fidelity of skipped deblocking",
        "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "",
        "| input | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
        *(f"| {name} | " + " | ".join(str(r[c]) for c in columns) + " |" for name, r in results.items()),
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.md").write_text("\n".join(lines), encoding="utf-8")
    (out / "decode.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2), encoding="utf-8"
    )
    sys.stdout.write("\n".join(lines))


if __name__ == "__main__":
    main()
