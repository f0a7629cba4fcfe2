"""Camera paths on the real first-person clips (no ground truth): how still a still head stays.

    python -m bench.ego_camera [--out bench/results]

Each clip of ../shared/data/ego_clips goes through the stage units (`udfs.episode_units`: priors,
hands, tracking, ba, completion, defaults, no calibration) twice: with the camera path's motion
model (`completion.path`, the default) and without it (`enabled: false`; the hands stage runs once
and is replayed). Without ground truth, the figures are the path's own: QA's `pose_jitter` (RMS
second difference over RMS first difference of the centres; white noise gives ~1.7, a smooth path
well below 1; QA fails an episode above 1.2), the largest frame-to-frame step over the median one,
and the frames whose step is more than 10 median steps (jumps a head cannot make in 1/30 s).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench.report import NOTES_MARKER, SHARED_DATA, kept_notes, provenance
from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.path_smoothing import PathSmoothingOptions
from pose_core.qa.flags import path_jitter
from udfs.camera_tables import world_from_cam_from_columns
from udfs.episode_units import episode_tables
from udfs.hands import hands_for_shard
from udfs.options import DecodeOptions, HandsOptions

CLIPS = SHARED_DATA / "ego_clips"
JUMP_STEPS = 10.0


def _figures(poses: pd.DataFrame) -> dict[str, float | int | str]:
    wfc = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_mu"])
    steps = np.linalg.norm(np.diff(wfc[:, :3, 3], axis=0), axis=1)
    median = float(np.median(steps[steps > 0])) if (steps > 0).any() else float("nan")
    quality = poses["pose_quality"].value_counts()
    return {
        "frames": len(poses),
        "pose_quality": " ".join(f"{k}:{v}" for k, v in sorted(quality.items())),
        "pose_jitter": round(path_jitter(wfc[:, :3, 3])[0], 2),
        "max_step_over_median": round(float(steps.max() / median), 1),
        "jumps": int((steps > JUMP_STEPS * median).sum()),
    }


def run_clip(path: Path) -> list[dict]:
    """The clip's figures with the motion model and without it."""
    cache: dict[int, pd.DataFrame] = {}

    def hands(shard: pd.DataFrame) -> pd.DataFrame:
        key = int(shard["shard_idx"].iat[0])
        if key not in cache:
            cache[key] = hands_for_shard(shard, HandsOptions(), DecodeOptions())
        return cache[key]

    rows = []
    for setting, enabled in (("motion model (default)", True), ("without", False)):
        options = replace(CompletionOptions(), path=PathSmoothingOptions(enabled=enabled))
        poses = episode_tables(str(path), hands_unit=hands, completion=options)["camera_poses"]
        rows.append({"clip": path.name, "completion.path": setting, **_figures(poses)})
    return rows


def _markdown(meta: dict, rows: list[dict], notes: str) -> str:
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n\n".join([
        "# Camera paths on real first-person clips (no ground truth)",
        "\n".join(f"- {k}: {v}" for k, v in meta.items()),
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "\n".join(table),
        f"{NOTES_MARKER}\n{notes}",
    ])


def main() -> None:
    """Run every clip and write OUT/ego_camera.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    meta = provenance("bench.ego_camera")
    rows = [row for clip in sorted(CLIPS.glob("*.mp4")) for row in run_clip(clip)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes = kept_notes(out / "ego_camera.md")
    (out / "ego_camera.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (out / "ego_camera.md").write_text(_markdown(meta, rows, notes))


if __name__ == "__main__":
    main()
