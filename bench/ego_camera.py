"""Camera paths on the real first-person clips (no ground truth): how still a still head stays.

    python -m bench.ego_camera [--out bench/results]

Each clip of ../shared/data/ego_clips goes through the stage units (`udfs.episode_units`: priors,
hands, tracking, ba, completion, defaults, no calibration) twice: with the camera path's motion
model (`completion.path`, the default) and without it (`enabled: false`; the hands stage runs once
and is replayed). Without ground truth, the figures are the path's own: QA's `pose_jitter` (RMS
second difference over RMS first difference of the centres; white noise gives ~1.7, a smooth path
well below 1; QA fails an episode above 1.2), the largest frame-to-frame step over the median one,
and the frames whose step is more than 10 median steps (jumps a head cannot make in 1/30 s).
`unobserved_kf_moves` counts consecutive keyframes (one map) whose shared observations fit a pure
rotation (median rotation-compensated parallax under 0.1 deg: no translation the images can see)
while global BA puts their centres more than 10 median frame steps apart; `worst_kf_move` names
the farthest such pair (frames, parallax, distance in median steps): translation BA made up.
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
from pose_core.camera_poses.twoview import parallax_deg, rotation_between
from pose_core.qa.flags import path_jitter
from udfs.camera_tables import world_from_cam_from_columns
from udfs.episode_units import episode_tables
from udfs.hands import hands_for_shard
from udfs.options import DecodeOptions, HandsOptions

CLIPS = SHARED_DATA / "ego_clips"
JUMP_STEPS = 10.0
PURE_ROTATION_DEG = 0.1


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
        "median_step": median,
    }


def _unobserved_moves(tables: dict[str, pd.DataFrame], median_step: float) -> dict[str, int | str]:
    """Consecutive keyframes whose images show only a rotation, yet far apart after global BA."""
    kfs = tables["keyframe_poses"].sort_values("frame_idx")
    wfc = world_from_cam_from_columns(kfs["world_from_cam_q_wxyz"], kfs["world_from_cam_t_mu"])
    rows = list(kfs.itertuples(index=False))
    moves = []
    for i in range(len(rows) - 1):
        a, b = rows[i], rows[i + 1]
        if a.segment_id != b.segment_id:
            continue
        _, ia, ib = np.intersect1d(
            np.asarray(a.obs_point_idx), np.asarray(b.obs_point_idx), return_indices=True
        )
        if len(ia) < 3:
            continue
        xy_a = np.asarray(list(a.obs_xy), np.float64).reshape(-1, 2)[ia]
        xy_b = np.asarray(list(b.obs_xy), np.float64).reshape(-1, 2)[ib]
        parallax = float(np.median(parallax_deg(xy_a, xy_b, rotation_between(xy_a, xy_b))))
        steps = float(np.linalg.norm(wfc[i + 1, :3, 3] - wfc[i, :3, 3]) / median_step)
        if parallax < PURE_ROTATION_DEG and steps > JUMP_STEPS:
            pair = f"{int(a.frame_idx)}-{int(b.frame_idx)}"
            moves.append((steps, f"{pair}: {parallax:.2f} deg, {steps:.0f} steps"))
    return {"unobserved_kf_moves": len(moves), "worst_kf_move": max(moves)[1] if moves else "-"}


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
        tables = episode_tables(str(path), hands_unit=hands, completion=options)
        figures = _figures(tables["camera_poses"])
        moves = _unobserved_moves(tables, float(figures.pop("median_step")))
        rows.append({"clip": path.name, "completion.path": setting, **figures, **moves})
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
