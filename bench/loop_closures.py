"""Loop closing as a loop repeats (issue 18): corrections, tracking CPU and accuracy against laps.

    python -m bench.loop_closures --out bench/results [--frames 300] [--laps 1,2,4,8,16] [--exhaustive]

The default synthetic clip (`jobs.sample`) with a closed trajectory of `--frames` frames, rendered
once and played as many laps as the largest `--laps` (`SampleOptions.loops`); each lap count takes the
video's first laps x frames frames. They go through the camera-pose core as the stage units run it:
KLT features with the true hands' boxes masked (`pose_core.hands.hand_box`, 15 % margin), tracking
(place recognition, loop correction by the Sim(3) pose graph), global BA and completion, on the
sample's calibration. Per lap count: keyframes, loops corrected (`TrackingResult.joins` within one
map; a loop whose similarity moves nothing only merges points and is not counted), those that
rescaled the map by more than 10 % and the range of their scales, maps joined, how far the tracker's
own poses (before global BA) disagree in scale from lap to lap (`tracked_lap_scale_spread`: the
largest over the smallest of the laps' Sim(3) scales to the ground truth), CPU seconds of
tracking (in all, per 100 frames, and of its first and last lap: place recognition's candidates grow
with the map, `pose_core.camera_poses.place_index`), BA and completion, every frame posed or not,
and ATE against the generator's ground truth. On a repeated lap each revisit of the table is a place seen
before; an hour of footage needs the corrections and tracking's CPU per frame to stay flat as laps
grow. `--exhaustive` matches every candidate point in place recognition and relocalisation, as
before keyframe retrieval (`RetrievalOptions.exhaustive_max_points` unbounded), and writes
`loop_closures_exhaustive.{md,json}` instead of `loop_closures.{md,json}` (command, machine, date).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench.report import provenance, write_result
from jobs.sample import SampleOptions, write_sample
from pose_core.camera_poses.completion import bundle_adjust_keyframes, complete_poses
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.camera_poses.features import FrameFeatures, extract_features
from pose_core.camera_poses.tracking import TrackingOptions, track_episode
from pose_core.hands import hand_box
from udfs.camera_tables import camera_for_frames
from udfs.ingest import calibration_to_json
from udfs.media.decode import decode_frames
from udfs.media.sidecars import read_calibration
from udfs.options import DecodeOptions

logger = logging.getLogger(__name__)

COLUMNS = (
    "laps", "frames", "keyframes", "loops_corrected", "rescaled_over_10pct", "scale_range", "maps_joined",
    "tracked_lap_scale_spread", "tracking_cpu_s",
    "tracking_cpu_s_per_100_frames", "tracking_cpu_s_first_lap", "tracking_cpu_s_last_lap",
    "ba_cpu_s", "completion_cpu_s", "all_posed", "ate_pct_of_path",
)  # fmt: skip


def hand_boxes(hands_px: np.ndarray) -> list[np.ndarray]:
    """Per frame the boxes `(h, 4)` of the hands in view, from the true keypoints `(F, 2, 21, 2)`."""
    return [
        np.array([hand_box(hand) for hand in frame if np.isfinite(hand).all(axis=1).any()]).reshape(-1, 4)
        for frame in hands_px
    ]


def lap_timed(features: list[FrameFeatures], lap: int, marks: list[float]) -> Iterator[FrameFeatures]:
    """`features` in order, appending the process time to `marks` as each lap of `lap` frames starts."""
    for feat in features:
        if feat.frame_idx % lap == 0:
            marks.append(time.process_time())
        yield feat
    marks.append(time.process_time())


def run_laps(root: Path, opts: SampleOptions, laps: int, tracking: TrackingOptions) -> dict[str, Any]:
    """The table row of the first `laps` laps of the sample written at `root`."""
    stem, count = opts.stem, laps * opts.frames
    videos, truth = root / "videos", root / "ground_truth" / opts.stem
    decoded = decode_frames(str(videos / f"{stem}.mp4"), 0, count, DecodeOptions())
    grays = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in decoded.frames]
    calibration = calibration_to_json(read_calibration(str(videos / f"{stem}.calib.yaml")))
    camera = camera_for_frames(calibration, grays[0].shape[1], grays[0].shape[0])
    boxes = hand_boxes(np.load(truth / "hands_px.npy")[:count])
    cpu = time.process_time()
    features = list(extract_features(grays, hand_masks=boxes))
    cpu, features_s = time.process_time(), time.process_time() - cpu
    marks: list[float] = []
    tracked = track_episode(lap_timed(features, opts.frames, marks), camera, tracking)
    cpu, tracking_s = time.process_time(), time.process_time() - cpu
    lap_cpu = np.diff(marks)
    tracked_poses = tracked.world_from_cam.copy()  # global BA below moves them
    bundle_adjust_keyframes(tracked, camera)
    cpu, ba_s = time.process_time(), time.process_time() - cpu
    done = complete_poses(tracked, features, camera)
    completion_s = time.process_time() - cpu
    truth_poses = np.load(truth / "world_from_cam.npy")[:count]
    err = evaluate_trajectory(done.world_from_cam, truth_poses)
    lap = opts.frames
    lap_scales = [evaluate_trajectory(tracked_poses[a : a + lap], truth_poses[a : a + lap]).scale
                  for a in range(0, count, lap)]  # fmt: skip
    scales = np.array([j.scale for j in tracked.joins if j.joined_to == j.segment])
    loops = len(scales)
    logger.info("%d laps: features %.1f CPU-s, tracking %.1f, %d loops corrected", laps, features_s,
                tracking_s, loops)  # fmt: skip
    return {
        "laps": laps,
        "frames": count,
        "keyframes": len(tracked.keyframes),
        "loops_corrected": int(loops),
        "rescaled_over_10pct": int(np.count_nonzero(np.abs(np.log(scales)) > np.log(1.1))),
        "scale_range": f"{scales.min():.2f}-{scales.max():.2f}" if loops else "-",
        "maps_joined": int(len(tracked.joins) - loops),
        "tracked_lap_scale_spread": round(max(lap_scales) / min(lap_scales), 2),
        "tracking_cpu_s": round(tracking_s, 1),
        "tracking_cpu_s_per_100_frames": round(100 * tracking_s / count, 2),
        "tracking_cpu_s_first_lap": round(float(lap_cpu[0]), 2),
        "tracking_cpu_s_last_lap": round(float(lap_cpu[-1]), 2),
        "ba_cpu_s": round(ba_s, 1),
        "completion_cpu_s": round(completion_s, 1),
        "all_posed": bool(np.isfinite(done.world_from_cam).all()),
        "ate_pct_of_path": round(err.ate_pct_of_path, 3),
    }


def markdown(result: dict[str, Any]) -> str:
    """Provenance and one row per lap count."""
    head = "\n".join(f"- {k}: {v}" for k, v in result.items() if k != "rows")
    table = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    table += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in result["rows"]]
    title = "# Loop closing as a loop repeats (issue 18)"
    return f"{title}\n\n{head}\n\n" + "\n".join(table) + "\n"


def main() -> None:
    """Parse the arguments, write the looped sample once, run each lap count, write the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=300, help="frames of one lap")
    parser.add_argument("--laps", default="1,2,4,8", help="lap counts, comma-separated")
    parser.add_argument("--exhaustive", action="store_true", help="place matching without keyframe retrieval")
    args = parser.parse_args()
    tracking = TrackingOptions()
    if args.exhaustive:
        retrieval = replace(tracking.loop.retrieval, exhaustive_max_points=sys.maxsize)
        tracking = replace(tracking, loop=replace(tracking.loop, retrieval=retrieval))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    laps = sorted({int(n) for n in args.laps.split(",")})
    opts = SampleOptions(frames=args.frames, loops=max(laps))
    with tempfile.TemporaryDirectory() as tmp:
        write_sample(tmp, opts)
        rows = [run_laps(Path(tmp), opts, n, tracking) for n in laps]
    sample = f"default synthetic clip, seed {opts.seed}, {args.frames} frames a lap"
    matching = "every candidate" if args.exhaustive else "keyframe retrieval above the default count"
    result = {**provenance("bench.loop_closures"), "sample": sample, "place_matching": matching, "rows": rows}
    name = "loop_closures_exhaustive" if args.exhaustive else "loop_closures"
    write_result(args.out, name, result, markdown(result))


if __name__ == "__main__":
    main()
