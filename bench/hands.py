"""Hand estimation speed: frames per second per CPU core at 640x480 (one interpreter thread).

    python -m bench.hands --out bench/results [--frames 120]

Runs the default estimator (MediaPipe's palm + landmark models on LiteRT, video mode) on frames of the
real hand video in ../shared/data resized to 640x480, and reports wall and CPU time per frame and how many
frames had a hand. Writes `hands.{md,json}` with the command, machine and date.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.report import SHARED_DATA, provenance, write_key_values
from conf.models import model_path
from pose_core.hands import MediaPipeHandEstimator, MediaPipeOptions
from udfs.media.decode import DecodeOptions, decode_frames

DATA = SHARED_DATA
VIDEO = DATA / "hands_dexretargeting" / "human_hand_video.mp4"


def main() -> None:
    """Time the estimator and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=120)
    args = parser.parse_args()
    decoded = decode_frames(str(VIDEO), 0, args.frames, DecodeOptions(max_long_side_px=0))
    import cv2

    frames = np.ascontiguousarray(np.stack([cv2.resize(f, (640, 480)) for f in decoded.frames]))
    estimator = MediaPipeHandEstimator(
        model_path("palm_detection_full.tflite"), model_path("hand_landmark_full.tflite"),
        MediaPipeOptions(mode="video", num_threads=1),
    )  # fmt: skip
    camera_k = np.array([[500.0, 0, 320], [0, 500.0, 240], [0, 0, 1]])
    estimator.estimate(frames[:2], camera_k)  # warm-up
    estimator.reset()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    hands = estimator.estimate(frames, camera_k)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    result = {
        **provenance("bench.hands"),
        "input": f"{VIDEO.name}, first {len(frames)} frames resized to 640x480",
        "frames": len(frames),
        "frames_with_hand": sum(1 for h in hands if h),
        "frames_per_wall_s": round(len(frames) / wall, 1),
        "frames_per_cpu_s": round(len(frames) / cpu, 1),
    }
    write_key_values(args.out, "hands", "hand estimation speed", result)


if __name__ == "__main__":
    main()
