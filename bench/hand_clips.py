"""The wearer's hands on real clips against labels made by looking at the frames.

Labels: `tests/data/ego_clip_labels/*.csv` (see its README). A clip goes through the hands udf
(`hands_for_shard`, one shard of the whole clip, prior intrinsics) and the fusion udf (`fuse_hands`)
with the camera held still (identity poses: identities do not depend on the camera's motion), as
the pipeline runs them. Scores:

- `frame_recall`: labelled frames with a visible wearer hand in which an observed (not gap-filled)
  wearer hand was found (the issue's measure);
- `left_recall`, `right_recall`, `hand_recall`: labelled visible hands found as the right identity
  (`wearer_left` for the left hand ...) and, where the label gives palm centres (coarse, +-0.1),
  nearer to that hand's centre than to the other hand's and within `POSITION_TOLERANCE` of it;
- identities, `other` identities, fusion's new-track marks (`new_tracks`), and observations farther
  than `POSITION_TOLERANCE` from every labelled hand (`unmatched`, on frames with positions);
- the QA checks on hands (`pose_core.qa`, default thresholds): identity switches, wearer-hand
  coverage, hand jitter; the camera checks are left out (the poses here are held still);
- `palm_accel_p95_mps2`, `palm_accel_max_mps2`: the wearer hands' palm acceleration (second difference
  over three consecutive observed frames, camera held still): a hand at a desk rarely passes
  10-20 m/s^2, so the high end measures depth fits that jump from frame to frame.

Hands cut by the frame's bottom edge (`run_cropped`): a clip cut to the top fraction of its rows, as a
camera tilted up would see it; the labels keep the hands whose labelled palm centre stays in view.
"""

from __future__ import annotations

import csv
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from bench.report import SHARED_DATA
from pose_core.hands import FusionOptions
from pose_core.hands.estimator import RIGID_PALM
from pose_core.qa.flags import QAThresholds, evaluate_episode
from udfs.fusion import fuse_hands
from udfs.hands import hands_for_shard
from udfs.options import DecodeOptions, HandsOptions
from udfs.qa_report.episode import episode_signals, episode_view

__all__ = [
    "CLIPS",
    "LABELS",
    "POSITION_TOLERANCE",
    "Clip",
    "ClipLabels",
    "ClipRun",
    "load_labels",
    "run_clip",
    "run_cropped",
    "score",
]

LABELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "ego_clip_labels"
_SIDES = ("left", "right")


@dataclass(frozen=True)
class Clip:
    """A labelled clip: its video relative to the shared data, frame count and frame rate."""

    video: str
    frames: int
    fps: float


#: Label file stem -> clip.
CLIPS: dict[str, Clip] = {
    "egoloc_desk_pour": Clip("ego_clips/egoloc_desk_pour.mp4", 298, 30.0),
    "lavila_ego4d_stirring": Clip("ego_clips/lavila_ego4d_stirring.mp4", 60, 30.0),
    "egox_egoexo4d_covidtest": Clip("ego_clips/egox_egoexo4d_covidtest.mp4", 50, 20.0),
    "human_hand_video": Clip("hands_dexretargeting/human_hand_video.mp4", 621, 30.0),
}
#: Largest distance of a found palm centre from the labelled one, fraction of the frame's long side.
POSITION_TOLERANCE = 0.25


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
        frames: the clip's frames with their (still) camera poses, as QA reads them.
        width, height: size of the frames the estimator saw, pixels.
        cpu_s: CPU seconds of the hands udf (decode, estimator, fit).
    """

    hands_cam: pd.DataFrame
    hands_world: pd.DataFrame
    frames: pd.DataFrame
    width: int
    height: int
    cpu_s: float


def run_clip(
    name: str,
    hands: HandsOptions | None = None,
    fusion: FusionOptions | None = None,
    video: Path | None = None,
) -> ClipRun:
    """Run the hands and fusion udfs on clip `name` (a key of `CLIPS`), read from `video` if given."""
    clip = CLIPS[name]
    source = str(video or SHARED_DATA / clip.video)
    shard = pd.DataFrame([{"episode_id": name, "shard_idx": 0, "source_path": source,
                           "own_start": 0, "own_stop": clip.frames, "calibration_json": None}])  # fmt: skip
    cpu0 = time.process_time()
    rows = hands_for_shard(shard, hands or HandsOptions(), DecodeOptions())
    cpu = time.process_time() - cpu0
    n = clip.frames
    frames = pd.DataFrame({
        "episode_id": name, "frame_idx": np.arange(n), "ts_s": np.arange(n) / clip.fps,
        "world_from_cam_q_wxyz": [[1.0, 0.0, 0.0, 0.0]] * n, "world_from_cam_t_mu": [[0.0, 0.0, 0.0]] * n,
        "tracking_state": "tracked", "pose_quality": "keyframe", "is_keyframe": False, "segment_id": 0,
        "num_inliers": np.nan, "reproj_error_px": np.nan,
    })  # fmt: skip
    world = fuse_hands(frames, rows, fusion or FusionOptions())
    width = int(rows["image_width"].iat[0]) if len(rows) else 0
    height = int(rows["image_height"].iat[0]) if len(rows) else 0
    return ClipRun(rows, world, frames, width, height, cpu)


def run_cropped(name: str, keep: float, hands: HandsOptions | None = None) -> tuple[ClipLabels, ClipRun]:
    """Clip `name` cut to the top `keep` of its rows (hands cut by the bottom edge): its labels, its run.

    A labelled hand stays visible where its labelled palm centre stays in view (a hand labelled visible
    without a position is left out: whether it stays in view is not known); palm centres are rescaled
    to the cut frame. The cut clip is written to a temporary MPEG-4 file (one more lossy encode).
    """
    labels = load_labels(name)
    y = labels.palm_xy[..., 1] / keep
    stays = labels.visible & (y < 1.0)  # NaN compares False
    cut_labels = replace(labels, visible=stays, palm_xy=np.stack([labels.palm_xy[..., 0], y], axis=-1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cut.mp4"
        cap = cv2.VideoCapture(str(SHARED_DATA / CLIPS[name].video))
        writer = None
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frame = frame[: int(round(keep * frame.shape[0]))]
            if writer is None:
                size = (frame.shape[1], frame.shape[0])
                writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), CLIPS[name].fps, size)
            writer.write(frame)
        cap.release()
        if writer is not None:
            writer.release()
        return cut_labels, run_clip(name, hands, video=path)


def _palm_centres(run: ClipRun, observed: pd.DataFrame) -> np.ndarray:
    """Palm centres (midway wrist - middle-finger base, as labelled) of observed `hands_world` rows.

    Returns:
        `(N, 2)`, fractions of width and height.
    """
    if observed.empty:
        return np.zeros((0, 2))
    cam = run.hands_cam.set_index(["frame_idx", "hand_slot"])
    keys = list(zip(observed["frame_idx"], observed["hand_slot"].astype(int), strict=True))
    px = np.stack([np.asarray(cam.loc[k, "keypoints_px"], np.float64).reshape(21, 2) for k in keys])
    return (px[:, 0] + px[:, 9]) / 2.0 / [run.width, run.height]


def _found(labels: ClipLabels, observed: pd.DataFrame, centres: np.ndarray, scale: np.ndarray) -> tuple:
    """Per labelled frame: hands found as the right identity `(L, 2)`, and unmatched observations."""
    frames = observed["frame_idx"].to_numpy()
    identity = observed["identity"].to_numpy()
    found = np.zeros_like(labels.visible)
    unmatched = 0
    for i, f in enumerate(labels.frame_idx):
        rows = np.flatnonzero(frames == f)
        positioned = np.isfinite(labels.palm_xy[i]).all(axis=1) & labels.visible[i]
        dist = np.linalg.norm((centres[rows, None] - labels.palm_xy[i][None]) * scale, axis=-1)
        for side_idx, side in enumerate(_SIDES):
            if not labels.visible[i, side_idx]:
                continue
            mine = identity[rows] == f"wearer_{side}"
            if positioned[side_idx]:
                mine &= dist[:, side_idx] <= POSITION_TOLERANCE
                if positioned[1 - side_idx]:
                    mine &= dist[:, side_idx] < dist[:, 1 - side_idx]
            found[i, side_idx] = mine.any()
        if positioned.all():
            unmatched += int((dist.min(axis=1) > POSITION_TOLERANCE).sum())
    return found, unmatched


def _qa_hands(run: ClipRun) -> dict[str, float | str]:
    """The QA checks' hand figures on the clip (camera held still)."""
    poses = run.frames.drop(columns=["episode_id", "ts_s"])
    result = evaluate_episode(
        episode_signals(episode_view(run.frames, poses, run.hands_world)), QAThresholds()
    )
    hand_flags = [f for f in result.flags if f in ("hand_jitter", "identity_switches", "low_hand_coverage")]
    return {
        "qa_identity_switches": int(result.metrics["identity_switches"]),
        "qa_hand_coverage": round(float(result.metrics["hand_coverage"]), 3),
        "qa_hand_jitter_mps2": round(float(result.metrics["hand_jitter_mps2"]), 1),
        "qa_hand_flags": " ".join(hand_flags) or "none",
    }


def _palm_accelerations(world: pd.DataFrame, fps: float) -> np.ndarray:
    """Palm accelerations of the wearer's observed hands over consecutive frames, m/s^2, `(K,)`."""
    out = [np.zeros(0)]
    observed = world[~world["filled"].astype(bool)].sort_values("frame_idx")
    for identity, rows in observed.groupby("identity"):
        if not str(identity).startswith("wearer_"):
            continue
        frame = rows["frame_idx"].to_numpy()
        palm = np.stack([np.asarray(k, np.float64).reshape(21, 3)[list(RIGID_PALM)].mean(axis=0)
                         for k in rows["keypoints_world_m"]])  # fmt: skip
        triple = np.flatnonzero(frame[2:] - frame[:-2] == 2)
        second = palm[triple + 2] - 2 * palm[triple + 1] + palm[triple]
        out.append(np.linalg.norm(second, axis=1) * fps**2)
    return np.concatenate(out)


def score(labels: ClipLabels, run: ClipRun) -> dict[str, float | int | str]:
    """Recall, identity and QA figures of one clip (see the module docstring)."""
    world = run.hands_world
    observed = world[~world["filled"].astype(bool)].reset_index(drop=True)
    centres = _palm_centres(run, observed)
    scale = np.array([run.width, run.height]) / max(run.width, run.height, 1)
    found, unmatched = _found(labels, observed, centres, scale)
    wearer_frames = set(observed.loc[observed["identity"].str.startswith("wearer_"), "frame_idx"].tolist())
    any_visible = labels.visible.any(axis=1)
    frame_found = np.array([int(f) in wearer_frames for f in labels.frame_idx])
    identities = sorted(set(world["identity"]))

    def recall(mask: np.ndarray) -> float | str:
        return round(float(found[mask].mean()), 3) if mask.any() else "-"

    fps = 1.0 / float(np.median(np.diff(run.frames["ts_s"].to_numpy())))
    accel = _palm_accelerations(world, fps)

    return {
        "labelled_frames": len(labels.frame_idx),
        "frame_recall": round(float(frame_found[any_visible].mean()), 3),
        "left_recall": recall(np.column_stack([labels.visible[:, 0], np.zeros(len(found), bool)])),
        "right_recall": recall(np.column_stack([np.zeros(len(found), bool), labels.visible[:, 1]])),
        "hand_recall": recall(labels.visible),
        "identities": " ".join(identities),
        "other_identities": sum(1 for name in identities if name.startswith("other_")),
        "new_tracks": int(observed["identity_switch"].astype(bool).sum()),
        "unmatched": unmatched,
        "hands_cpu_ms_per_frame": round(1000 * run.cpu_s / len(run.frames), 1),
        "palm_accel_p95_mps2": round(float(np.percentile(accel, 95)), 1) if len(accel) else "-",
        "palm_accel_max_mps2": round(float(accel.max()), 1) if len(accel) else "-",
        **_qa_hands(run),
    }
