"""Retargeting speed and accuracy per embodiment on ideal hands, through the udf an executor runs.

    python -m bench.retarget --out bench/results [--frames 300] [--robots-dir ../shared/data/robots]

On the pipeline's own (estimated) hands: `bench/retarget_pipeline.py` (`retarget.md`).

Each arm gets a synthetic episode: both wearer hands follow reachable robot-made tool trajectories
(`tests/pose_core/retarget_trajectories.py`, base placed by the profile), so errors have ground truth.
The Allegro hand follows a synthetic human hand (`pose_core.synth.hands`). One BLAS thread: the figure
is frames per CPU core (`frames_per_cpu_s` counts process CPU time, robust to a busy machine; the
wall-clock figure is given too). For the wearer's hands, which have no ground truth, the frames flagged
unreachable are described by their tool position and orientation errors (`miss_*`). Writes
`retarget_ideal.{md,json}` with the command, machine and date (`bench.report.provenance`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from bench.report import NOTES_MARKER, kept_notes, provenance
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.ik import pose_errors
from pose_core.retarget.placement import world_from_wrist_for_targets
from pose_core.synth.hands import HandOptions, make_hand_motion
from pose_core.synth.robot_hands import FPS, joint_trajectory, keypoints_at_wrists, tcp_poses
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory
from schemas.tables import ROBOT_ACTIONS
from udfs.multi_output import split_tables
from udfs.options import RetargetStageOptions
from udfs.retarget import load_embodiments, retarget_episode

ARMS = ("so100", "so101", "panda", "xarm7")
IDENTITIES = ("wearer_left", "wearer_right")
METRIC = "user"  # the synthetic hands are in metres: any metric scale source will do


def _inputs(frame_idx: np.ndarray, kp: dict[str, np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame]:
    frames = pd.DataFrame({"episode_id": "bench", "frame_idx": frame_idx, "ts_s": frame_idx / FPS})
    hands = pd.concat([pd.DataFrame({"episode_id": "bench", "frame_idx": frame_idx, "identity": ident,
                                     "keypoints_world_m": list(k.reshape(len(k), -1).astype(np.float32)),
                                     "scale_source": METRIC})
                       for ident, k in kp.items()], ignore_index=True)
    return frames, hands


def arm_episode(emb: Embodiment, frames: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """Both hands on reachable robot-made trajectories: (frames, hands_world rows, true tool poses)."""
    truth = {ident: tcp_poses(emb, joint_trajectory(emb, frames, seed)[1])
             for seed, ident in enumerate(IDENTITIES)}
    kp = {ident: keypoints_at_wrists(world_from_wrist_for_targets(emb, t), ident == "wearer_right",
                                     np.full(frames, 0.05)) for ident, t in truth.items()}
    return (*_inputs(np.arange(frames), kp), truth)


def wearer_episode(frames: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both hands of the synthetic wearer (reach, grasp, carry, release), seen from a level camera.

    The synthetic world (z up, the wearer facing +y) is turned into a camera-like one (y down, z the
    wearer's forward), as hands_world's world is, with gravity along its y.
    """
    rng = np.random.default_rng(0)
    duration = frames / FPS + 0.1
    head = make_head_trajectory(duration, TrajectoryOptions(), rng)
    motion = make_hand_motion(duration, head, SceneOptions(), HandOptions(), rng)
    cam_from_synth = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    kp = motion.keypoints_world(np.arange(frames) / FPS) @ cam_from_synth.T
    frames_df, hands = _inputs(np.arange(frames), {ident: kp[:, i] for i, ident in enumerate(IDENTITIES)})
    return frames_df, hands.assign(gravity_dir_world=[np.array([0.0, 1.0, 0.0])] * len(hands))


def _timed(frames: pd.DataFrame, hands: pd.DataFrame, emb: Embodiment,
           opts: RetargetStageOptions) -> tuple[pd.DataFrame, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = split_tables(retarget_episode(frames, hands, [emb], opts), [ROBOT_ACTIONS])[ROBOT_ACTIONS.name]
    return out, time.perf_counter() - wall, time.process_time() - cpu


def measure(name: str, frames: int, opts: RetargetStageOptions, robot_made: bool) -> dict[str, object]:
    """One embodiment: speed; for robot-made arm trajectories, errors against ground truth."""
    (emb,) = load_embodiments([name], opts)
    if robot_made:
        inputs, hands, truth = arm_episode(emb, frames)
    else:
        inputs, hands = wearer_episode(frames)
        opts = replace(opts, base_placement="wrist_median")
    out, wall_s, cpu_s = _timed(inputs, hands, emb, opts)
    solved = len(IDENTITIES) * frames
    row: dict[str, object] = {"embodiment": name, "hands": "robot-made" if robot_made else "wearer",
                              "kind": emb.kind, "joints": emb.model.num_joints,
                              "hand_frames": solved, "wall_s": round(wall_s, 3), "cpu_s": round(cpu_s, 3),
                              "frames_per_wall_s": round(solved / wall_s, 1),
                              "frames_per_cpu_s": round(solved / cpu_s, 1),
                              "reachable_fraction": round(float(out["reachable"].mean()), 4)}
    if robot_made:
        pos, rot, limit, speed = [], [], 0, 0
        for ident, target in truth.items():
            rows = out[out["identity"] == ident].sort_values("frame_idx")
            q = np.stack(rows["joint_positions"].to_list())
            e_p, e_r = pose_errors(tcp_poses(emb, q), target)
            pos.append(np.linalg.norm(e_p, axis=1))
            rot.append(np.linalg.norm(e_r, axis=1))
            limit += int(np.sum((q < emb.lower) | (q > emb.upper)))
            speed += int(np.sum(np.abs(np.diff(q, axis=0)) * FPS > emb.velocity * (1 + 1e-9)))
        pos_all, rot_all = np.concatenate(pos), np.concatenate(rot)
        row.update({"pos_err_mean_mm": round(1e3 * float(pos_all.mean()), 4),
                    "pos_err_max_mm": round(1e3 * float(pos_all.max()), 4),
                    "rot_err_mean_deg": round(float(np.degrees(rot_all.mean())), 4),
                    "limit_violations": limit, "speed_violations": speed})
    elif emb.kind == "hand":
        row["vector_err_mean_mm"] = round(1e3 * float(out["ee_error_m"].mean()), 2)
    else:
        missed = out[~out["reachable"].astype(bool)]  # an object column: `~` alone is bitwise
        if len(missed):
            pos_mm, rot_deg = 1e3 * missed["ee_error_m"], np.degrees(missed["ee_error_rad"])
            row.update({"miss_pos_err_median_mm": round(float(pos_mm.median()), 1),
                        "miss_pos_err_max_mm": round(float(pos_mm.max()), 1),
                        "miss_rot_err_median_deg": round(float(rot_deg.median()), 1),
                        "miss_rot_err_max_deg": round(float(rot_deg.max()), 1)})
    return row


def main() -> None:
    """Measure every shipped profile and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--frames", type=int, default=300, help="frames per hand (two hands per episode)")
    parser.add_argument("--robots-dir", default=os.environ.get("EGOLAKE_ROBOTS_DIR", "../shared/data/robots"))
    args = parser.parse_args()
    opts = RetargetStageOptions(robots_dir=str(Path(args.robots_dir).resolve()), base_placement="profile")
    with threadpool_limits(1):
        rows = [measure(name, args.frames, opts, True) for name in ARMS]
        rows += [measure(name, args.frames, opts, False) for name in (*ARMS, "allegro")]
    meta = {**provenance("bench.retarget"), "load_average_1min": round(os.getloadavg()[0], 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = json.dumps({**meta, "rows": rows}, indent=2) + "\n"
    (out / "retarget_ideal.json").write_text(result, encoding="utf-8")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    lines = ["# retargeting speed and accuracy (one BLAS thread)", "",
             *(f"- {k}: {v}" for k, v in meta.items()),
             f"- episode: {args.frames} frames at {FPS:g} fps, both hands. robot-made: hands on reachable "
             "tool trajectories of the arm itself, base from the profile (errors against them). wearer: the "
             "synthetic wearer's hands (pose_core.synth.hands, seen from a level camera), base_placement "
             "wrist_median (no ground truth: speed and the reachable fraction)", "", *table, "",
             NOTES_MARKER, kept_notes(out / "retarget_ideal.md")]
    (out / "retarget_ideal.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
