"""Camera tracking alone, again, on a finished output's tables: per-lap accuracy, no pipeline run.

    python -m bench.track_output --output OUTPUT --truth GROUND_TRUTH_DIR [--loop-frames 900]
        [--set KEY=VALUE ...]

Reads the output's `features`, `videos`, `frames` and `hands_cam` tables (the files their Delta logs
hold live, no Spark), builds tracking's input as the tracking stage does (`udfs.tracking.FEATURE_VIEW`:
features, calibration, frame size, the hands' boxes that mask features) and runs `udfs.tracking.tracking_unit`
with the configuration (plus `--set`). Prints, against the truth's `world_from_cam.npy`, the tracked
path's ATE after a Sim(3) fit and each lap fitted alone (`bench.long_video.lap_accuracy`), and the
tracking CPU seconds. For one-episode outputs of `bench.long_video` (its WORK/out_<m>min and
WORK/in_loop<frames>x<laps>/ground_truth/<name>): a tracking change measured on 10 minutes of footage in
minutes instead of the whole pipeline's 45.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bench.long_video import lap_accuracy


def read_table(output: Path, name: str) -> pd.DataFrame:
    """A table of `output`: the Parquet files its Delta log holds live (every commit replayed, no Spark).

    Files that a later overwrite removed stay in the folder until a vacuum, so the folder's Parquet files
    alone would read a rerun stage's rows twice.
    """
    table = output / "tables" / name
    commits = sorted((table / "_delta_log").glob("*.json"))
    if not commits or commits[0].name != f"{0:020d}.json":
        raise FileNotFoundError(f"{table}: no Delta log from version 0 (a checkpointed log is not read here)")
    live: dict[str, dict[str, str]] = {}  # path -> partition values (not stored in the file)
    for commit in commits:
        for action in map(json.loads, commit.read_text(encoding="utf-8").splitlines()):
            if "add" in action:
                live[action["add"]["path"]] = action["add"].get("partitionValues") or {}
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    frames = []
    for path, partition in live.items():
        frame = pq.read_table(table / unquote(path)).to_pandas()
        frames.append(frame.assign(**{k: v for k, v in partition.items() if k not in frame}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def feature_view(output: Path) -> pd.DataFrame:
    """Tracking's input rows (`FEATURE_VIEW`) of the output's one episode, in frame order."""
    from udfs.tracking import FEATURE_VIEW, feature_view_of

    videos = read_table(output, "videos")
    if len(videos) != 1:
        raise ValueError(f"{output}: one episode expected, found {len(videos)}")
    view = feature_view_of(
        read_table(output, "features"), read_table(output, "frames"), read_table(output, "hands_cam"),
        videos["calibration_json"].iloc[0],
    )  # fmt: skip
    return view[list(FEATURE_VIEW.columns)].sort_values("frame_idx").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    from jobs.config import load_config
    from pose_core.camera_poses.evaluation import evaluate_trajectory
    from udfs.camera_tables import world_from_cam_from_columns
    from udfs.tracking import tracking_unit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="a finished egolake OUTPUT (one episode)")
    parser.add_argument("--truth", type=Path, required=True, help="folder holding world_from_cam.npy")
    parser.add_argument("--loop-frames", type=int, default=900, help="frames of a lap")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    view = feature_view(args.output)
    cfg = load_config([], args.settings)
    start = time.process_time()
    stacked = tracking_unit(view, cfg.tracking)
    cpu_s = time.process_time() - start
    tracks = stacked[stacked["_table"] == "tracks"].sort_values("frame_idx")
    gt = np.load(args.truth / "world_from_cam.npy")
    est = np.full_like(gt, np.nan)
    est[tracks["frame_idx"].to_numpy(np.int64)] = world_from_cam_from_columns(
        tracks["world_from_cam_q_wxyz"], tracks["world_from_cam_t_mu"]
    )
    whole = evaluate_trajectory(est, gt)
    laps = lap_accuracy(est, gt, args.loop_frames)
    figures = {"frames": len(gt), "posed": whole.num_frames, "ate_rmse_m": round(whole.ate_rmse_m, 4),
               "ate_pct_of_path": round(whole.ate_pct_of_path, 3), "tracking_cpu_s": round(cpu_s, 1),
               **{k: round(v, 3) if isinstance(v, float) else v for k, v in laps.items()}}  # fmt: skip
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
