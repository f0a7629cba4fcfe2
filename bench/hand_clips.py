"""The wearer's hands on real clips against labels made by looking at the frames.

Labels: `tests/data/ego_clip_labels/*.csv` (see its README). A clip goes through the hands udf
(`hands_for_shard`, one shard of the whole clip, prior intrinsics) and the fusion udf (`fuse_hands`)
with the camera held still (identity poses: identities do not depend on the camera's motion), as
the pipeline runs them. Scores:

- `frame_recall`: labelled frames with a visible wearer hand in which an observed (not gap-filled)
  wearer hand was found (the issue's measure);
- `hand_recall`: labelled visible hands found as the right identity (`wearer_left` for the left
  hand ...) and, where the label gives palm centres (coarse, +-0.1), nearer to that hand's centre
  than to the other hand's and within `POSITION_TOLERANCE` of it;
- identities, identity switches, and observations farther than `POSITION_TOLERANCE` from every
  labelled hand (`unmatched_observations`, counted on frames with positions).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.report import SHARED_DATA
from pose_core.hands import FusionOptions
from udfs.fusion import fuse_hands
from udfs.hands import HandsOptions, hands_for_shard
from udfs.media.decode import DecodeOptions

__all__ = [
    "CLIPS",
    "LABELS",
    "POSITION_TOLERANCE",
    "ClipLabels",
    "ClipRun",
    "load_labels",
    "run_clip",
    "score",
]

LABELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "ego_clip_labels"
#: Label file stem -> (video relative to the shared data, its frame count).
CLIPS: dict[str, tuple[str, int]] = {
    "egoloc_desk_pour": ("ego_clips/egoloc_desk_pour.mp4", 298),
    "lavila_ego4d_stirring": ("ego_clips/lavila_ego4d_stirring.mp4", 60),
    "egox_egoexo4d_covidtest": ("ego_clips/egox_egoexo4d_covidtest.mp4", 50),
    "human_hand_video": ("hands_dexretargeting/human_hand_video.mp4", 621),
}
#: Largest distance of a found palm centre from the labelled one, fraction of the frame's long side.
POSITION_TOLERANCE = 0.25
_SIDES = ("left", "right")


@dataclass(frozen=True)
class ClipLabels:
    """Labels of one clip (L labelled frames).

    Attributes:
        frame_idx: `(L,)` int.
        visible: `(L, 2)` bool, left then right hand.
        palm_xy: palm centres as fractions of width and height, `(L, 2, 2)`; NaN where not labelled.
    """

    frame_idx: np.ndarray
    visible: np.ndarray
    palm_xy: np.ndarray


def load_labels(name: str) -> ClipLabels:
    """Read `LABELS/<name>.csv`."""
    with open(LABELS / f"{name}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))

    def num(value: str) -> float:
        return float(value) if value else float("nan")

    return ClipLabels(
        frame_idx=np.array([int(r["frame_idx"]) for r in rows]),
        visible=np.array([[r["left_visible"] == "1", r["right_visible"] == "1"] for r in rows]),
        palm_xy=np.array(
            [[[num(r[f"{s}_x"]), num(r[f"{s}_y"])] for s in _SIDES] for r in rows], np.float64
        ).reshape(-1, 2, 2),
    )


@dataclass(frozen=True)
class ClipRun:
    """What the pipeline's hands and fusion udfs gave for one clip.

    Attributes:
        hands_cam: `hands_cam` rows.
        hands_world: `hands_world` rows (identity poses).
        width, height: size of the frames the estimator saw, pixels.
        frames: frames in the clip.
        cpu_s: CPU seconds of the hands udf.
    """

    hands_cam: pd.DataFrame
    hands_world: pd.DataFrame
    width: int
    height: int
    frames: int
    cpu_s: float


def run_clip(name: str, hands: HandsOptions | None = None, fusion: FusionOptions | None = None) -> ClipRun:
    """Run the hands and fusion udfs on clip `name` (a key of `CLIPS`)."""
    import time  # noqa: PLC0415

    relative, count = CLIPS[name]
    path = SHARED_DATA / relative
    shard = pd.DataFrame([{"episode_id": name, "shard_idx": 0, "source_path": str(path),
                           "own_start": 0, "own_stop": count, "calibration_json": None}])  # fmt: skip
    cpu0 = time.process_time()
    rows = hands_for_shard(shard, hands or HandsOptions(), DecodeOptions())
    cpu = time.process_time() - cpu0
    frames = pd.DataFrame({
        "episode_id": name, "frame_idx": np.arange(count), "ts_s": np.arange(count) / 30.0,
        "world_from_cam_q_wxyz": [[1.0, 0.0, 0.0, 0.0]] * count,
        "world_from_cam_t_m": [[0.0, 0.0, 0.0]] * count,
    })  # fmt: skip
    world = fuse_hands(frames, rows, fusion or FusionOptions())
    width = int(rows["image_width"].iat[0]) if len(rows) else 0
    height = int(rows["image_height"].iat[0]) if len(rows) else 0
    return ClipRun(rows, world, width, height, count, cpu)


def _palm_centres(run: ClipRun, observed: pd.DataFrame) -> np.ndarray:
    """Palm centres (midway wrist - middle-finger base, as labelled) of observed `hands_world` rows.

    Returns:
        `(N, 2)`, fractions of width and height.
    """
    cam = run.hands_cam.set_index(["frame_idx", "hand_slot"])
    keys = list(zip(observed["frame_idx"], observed["hand_slot"].astype(int), strict=True))
    px = np.stack([np.asarray(cam.loc[k, "keypoints_px"], np.float64).reshape(21, 2) for k in keys])
    return (px[:, 0] + px[:, 9]) / 2.0 / [run.width, run.height]


def score(labels: ClipLabels, run: ClipRun) -> dict[str, float | int | str]:
    """Recall and identity figures of one clip (see the module docstring)."""
    world = run.hands_world
    observed = world[~world["filled"].astype(bool)].reset_index(drop=True)
    centres = _palm_centres(run, observed) if len(observed) else np.zeros((0, 2))
    by_frame = {int(f): np.flatnonzero(observed["frame_idx"].to_numpy() == f) for f in labels.frame_idx}
    wearer = observed["identity"].str.startswith("wearer_").to_numpy()
    any_visible = labels.visible.any(axis=1)
    frame_found = np.array([wearer[by_frame[int(f)]].any() for f in labels.frame_idx])
    found = np.zeros_like(labels.visible)
    unmatched = 0
    scale = np.array([run.width, run.height]) / max(run.width, run.height, 1)
    for i, f in enumerate(labels.frame_idx):
        rows = by_frame[int(f)]
        for side_idx, side in enumerate(_SIDES):
            if not labels.visible[i, side_idx]:
                continue
            mine = rows[observed["identity"].to_numpy()[rows] == f"wearer_{side}"]
            if np.isfinite(labels.palm_xy[i, side_idx]).all():
                dist = np.linalg.norm((centres[mine, None] - labels.palm_xy[i][None]) * scale, axis=-1)
                near = dist[:, side_idx] <= POSITION_TOLERANCE
                if labels.visible[i, 1 - side_idx] and np.isfinite(labels.palm_xy[i, 1 - side_idx]).all():
                    near &= dist[:, side_idx] < dist[:, 1 - side_idx]
                mine = mine[near]
            found[i, side_idx] = len(mine) > 0
        if np.isfinite(labels.palm_xy[i]).all():
            targets = labels.palm_xy[i][labels.visible[i]]
            dist = np.linalg.norm((centres[rows][:, None] - targets[None]) * scale, axis=-1)
            unmatched += int((dist.min(axis=1) > POSITION_TOLERANCE).sum()) if len(targets) else len(rows)
    identities = sorted(set(world["identity"]))
    return {
        "labelled_frames": len(labels.frame_idx),
        "frame_recall": round(float(frame_found[any_visible].mean()), 3),
        "left_recall": round(float(found[:, 0][labels.visible[:, 0]].mean()), 3)
        if labels.visible[:, 0].any()
        else "-",
        "right_recall": round(float(found[:, 1][labels.visible[:, 1]].mean()), 3),
        "hand_recall": round(float(found[labels.visible].mean()), 3),
        "identities": " ".join(identities),
        "identity_switches": int(observed["identity_switch"].astype(bool).sum()),
        "unmatched_observations": unmatched,
        "filled_rows": int(world["filled"].astype(bool).sum()),
        "hands_cpu_ms_per_frame": round(1000 * run.cpu_s / run.frames, 1),
    }
