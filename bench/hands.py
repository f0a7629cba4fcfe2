"""Hands: speed of the hands stage, 3-D accuracy on real photos, the wearer's hands on labelled real clips.

    python -m bench.hands --out bench/results [--frames 120] [--gt-images 400]

Each section runs "before" (MediaPipe's own pipeline: no detection windows, one presence threshold,
no second landmark pass; the model's 3-D shape rescaled to the hand-size prior and posed rigidly) and
"now" (the defaults) in the same run, so their figures share the machine's load.

1. Speed: frames per CPU-second of the hands stage's work at 640x480, one interpreter thread, video
   mode: estimator plus the metric fit of every hand (`udfs.hands.hand_rows`), decoding excluded;
   on the real hand video (one hand, resized) and on `egoloc_desk_pour` (two hands, native 640x480).
2. 3-D accuracy on `hands_realworld_gt` (`bench/hand_gt.py`), with the held-out half for the one
   setting chosen on data.
3. Labelled real clips (`bench/hand_clips.py`): recall, identities, QA's hand checks; the "before"
   rows come from the base commit (see the notes below the tables).

Writes `hands.{md,json}` with the command, machine and date; the notes below the tables' marker in an
existing `hands.md` are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from bench import hand_clips, hand_gt
from bench.report import NOTES_MARKER, SHARED_DATA, kept_notes, provenance
from pose_core.geometry.camera import Camera
from pose_core.hands import FitOptions, MediaPipeOptions
from pose_core.hands.articulated import ArticulatedOptions
from udfs.hands import hand_rows
from udfs.media.decode import decode_frames
from udfs.models import hand_estimator
from udfs.options import DecodeOptions, EstimatorOptions, HandsOptions

VIDEO = SHARED_DATA / "hands_dexretargeting" / "human_hand_video.mp4"
EGO = SHARED_DATA / "ego_clips" / "egoloc_desk_pour.mp4"

#: MediaPipe's own pipeline: whole-frame palm detection only, one presence threshold, one landmark pass.
BEFORE_ESTIMATOR = MediaPipeOptions(
    window_fraction=0.0,
    min_tracking_presence=0.5,
    strong_palm_score=1.0,
    refine_presence=1.0,
    predict_motion=False,
    edge_region_count=0,
)
#: The fit before: the model's own 3-D shape rescaled to the prior, posed rigidly.
BEFORE_FIT = FitOptions(skeleton="model", articulated=ArticulatedOptions(enabled=False))
SETTINGS = {"before": (BEFORE_ESTIMATOR, BEFORE_FIT), "now": (MediaPipeOptions(), FitOptions())}


def _frames_640x480(path: Path, count: int) -> np.ndarray:
    decoded = decode_frames(str(path), 0, count, DecodeOptions(max_long_side_px=0))
    return np.ascontiguousarray(np.stack([cv2.resize(f, (640, 480)) for f in decoded.frames]))


def speed(count: int) -> list[dict]:
    """Frames per CPU-second of estimator + fit, before and now, on two inputs."""
    rows = []
    camera = Camera.from_prior(640, 480)
    for name, path in (("hand video (1 hand)", VIDEO), ("egoloc_desk_pour (2 hands)", EGO)):
        frames = _frames_640x480(path, count)
        for setting, (est_opts, fit_opts) in SETTINGS.items():
            estimator = hand_estimator(replace(est_opts, mode="video", num_threads=1))
            estimator.estimate(frames[:2], camera.k_matrix)  # warm-up
            estimator.reset()
            opts = HandsOptions(EstimatorOptions(mediapipe=est_opts), fit_opts)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            hands = estimator.estimate(frames, camera.k_matrix)
            fitted = hand_rows("bench", range(len(frames)), hands, camera, opts)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            rows.append({
                "input": name, "setting": setting, "frames": len(frames),
                "frames_with_hand": sum(1 for h in hands if h), "hands": len(fitted),
                "frames_per_wall_s": round(len(frames) / wall, 1),
                "frames_per_cpu_s": round(len(frames) / cpu, 1),
            })  # fmt: skip
    return rows


def accuracy(count: int) -> list[dict]:
    """`hand_gt.evaluate` before and now (and the now setting's halves)."""
    truth = hand_gt.load_ground_truth()
    found = {
        setting: hand_gt.detect(replace(est, mode="image"), count) for setting, (est, _) in SETTINGS.items()
    }
    rigid = FitOptions(articulated=ArticulatedOptions(enabled=False))
    cases = [
        ("before", "model shape, rigid", BEFORE_FIT, None),
        ("now", "model shape, rigid", BEFORE_FIT, None),
        ("now", "canonical skeleton, rigid", rigid, None),
        ("now", "canonical + articulated (default)", FitOptions(), None),
        ("now", "default, images 0-199 (sigma chosen here)", FitOptions(), "first"),
        ("now", "default, images 200-399 (held out)", FitOptions(), "second"),
    ]
    return [
        {"estimator": est, "fit": fit_name, **hand_gt.evaluate(found[est], truth, fit, split)}
        for est, fit_name, fit, split in cases
    ]


def clips() -> list[dict]:
    """`hand_clips.score` of every labelled clip with the defaults."""
    return [
        {"clip": name, **hand_clips.score(hand_clips.load_labels(name), hand_clips.run_clip(name))}
        for name in hand_clips.CLIPS
    ]


#: Fractions of egoloc's rows kept for the bottom-edge rows (`hand_clips.run_cropped`).
CUT_KEEP = (0.62, 0.5)


def cut_clips() -> list[dict]:
    """The egoloc clip cut to its top rows (hands cut by the bottom edge), the edge regions off and on."""
    off = HandsOptions(estimator=EstimatorOptions(mediapipe=MediaPipeOptions(edge_region_count=0)))
    rows = []
    for keep in CUT_KEEP:
        for setting, hands in (("edge regions off", off), ("default", HandsOptions())):
            labels, run = hand_clips.run_cropped("egoloc_desk_pour", keep, hands)
            scored = hand_clips.score(labels, run)
            rows.append({
                "rows_kept": keep, "setting": setting,
                "visible_left_right": f"{int(labels.visible[:, 0].sum())} {int(labels.visible[:, 1].sum())}",
                **{k: scored[k] for k in ("left_recall", "right_recall", "identities", "other_identities",
                                          "hands_cpu_ms_per_frame", "qa_identity_switches")},
            })  # fmt: skip
    return rows


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def _markdown(meta: dict, result: dict, notes: str) -> str:
    sections = [
        "# hands: speed, 3-D accuracy on real photos, the wearer's hands on labelled real clips",
        "\n".join(f"- {key}: {value}" for key, value in meta.items()),
        "## Speed: hands stage at 640x480 (estimator + metric fit, one thread, video mode)",
        _table(result["speed"]),
        "## 3-D accuracy: hands_realworld_gt (400 real photos, one hand each)",
        _table(result["accuracy"]),
        "## Labelled real clips (tests/data/ego_clip_labels; camera held still)",
        _table(result["clips"]),
        "## Hands cut by the bottom edge (egoloc_desk_pour cut to its top rows, labelled palms in view)",
        _table(result["cut_clips"]),
        f"{NOTES_MARKER}\n{notes}",
    ]
    return "\n\n".join(sections)


def main() -> None:
    """Run the three sections and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--gt-images", type=int, default=400)
    args = parser.parse_args()
    meta = {**provenance("bench.hands"), "load_average_before": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    result = {
        "speed": speed(args.frames),
        "accuracy": accuracy(args.gt_images),
        "clips": clips(),
        "cut_clips": cut_clips(),
    }
    meta["load_average_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "hands.md"
    notes = kept_notes(previous)
    (out / "hands.json").write_text(json.dumps({**meta, **result}, indent=1))
    previous.write_text(_markdown(meta, result, notes))


if __name__ == "__main__":
    main()
