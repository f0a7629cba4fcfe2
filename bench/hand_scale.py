"""Metric scale from the wearer's hands on synthetic table episodes, through the fusion udf.

    python -m bench.hand_scale --out bench/results [--seeds 20] [--frames 600] [--poses truth|tracked]

Each seed is the default `table` episode (`pose_core.synth`, 20 s at 600 frames: the wearer reaches,
grasps on the table top, carries and puts down, with each hand in turn) with no IMU and no stereo, so
the scale can only come from the hands. Its true metres per map unit is drawn per seed (log-uniform,
0.2-5), and the map and camera poses are in those units:

- `--poses truth` (default, seconds a seed): the true camera poses with 2 mm and 0.05 degree noise per
  frame; the map is points spread over the scene's surfaces (`pose_core.synth.observe.surface_points`:
  300 per m^2 on the table and the boxes, 20 on the room), each off by 3 mm plus 0.8 % of its distance
  to the table's middle camera along that ray (monocular depth noise), 5 % of them outliers moved
  +-30 % along the ray; keyframes every 10 frames observe the points in the image, in front, on their
  visible side and outside the hands' boxes (occlusion by the scene itself is not modelled).
- `--poses tracked` (minutes a seed): the episode is rendered and encoded (`jobs.sample`) and the
  camera-pose stage units run on it as the pipeline does (priors KLT features, tracking with the
  hands' boxes masked, global BA, completion): poses, keyframes and `ba_points` are the tracker's;
  the true scale is the Sim(3) fit of the tracked camera path to the true one.

The hands in both modes are the true keypoints seen by a noisy estimator (2 px, 4 mm shape noise, 10 %
dropouts, 15 % handedness flips: `pose_core.synth.observe.noisy_hand_observations`), fitted in metres by
the hands stage's own fit (`udfs.hands.hand_rows`, canonical hand at the prior's size: the synthetic
hands have exactly that size, so the size prior's part of the uncertainty is not exercised here).
Figures: error of metres per unit against the truth, the fit's relative standard error (what the
moments' spread says) and whether +-1.96 of it covers the truth, per seed and summarised. Writes
`hand_scale.{md,json}` with the command, machine and date.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.report import NOTES_MARKER, kept_notes, provenance
from jobs.logs import init_logging
from jobs.sample import SampleOptions, write_sample
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import quat_wxyz_from_matrix
from pose_core.hands import FusionOptions, HandScale
from pose_core.synth import SynthEpisode, SynthOptions, generate_episode
from pose_core.synth.observe import SimulatedMap, noisy_hand_observations, simulated_map
from schemas.tables import BA_POINTS, KEYFRAME_POSES
from udfs.camera_tables import world_from_cam_from_columns
from udfs.episode_units import episode_tables
from udfs.fusion import fuse_hands_detailed
from udfs.hands import hand_rows
from udfs.ingest import calibration_to_json
from udfs.media.sidecars import read_calibration
from udfs.multi_output import TABLE_COLUMN
from udfs.options import HandsOptions

logger = logging.getLogger(__name__)

EPISODE = "bench"


@dataclass(frozen=True)
class SeedResult:
    """One seed's answer against its truth."""

    seed: int
    truth: float
    metres_per_unit: float | None
    error_pct: float | None
    rel_std_fit_pct: float | None
    rel_std_pct: float | None
    covered: bool | None
    moments: int
    in_contact: int
    reason: str | None
    seconds: float


def _hands_cam(episode: SynthEpisode, rng: np.random.Generator) -> pd.DataFrame:
    k = episode.K
    camera = Camera(episode.options.width, episode.options.height, k[0, 0], k[1, 1], k[0, 2], k[1, 2])
    found = noisy_hand_observations(episode, rng)
    return hand_rows(EPISODE, list(range(episode.num_frames)), found, camera, HandsOptions())


def _pose_rows(world_from_cam: np.ndarray, ts_s: np.ndarray, episode_id: str) -> pd.DataFrame:
    return pd.DataFrame({
        "episode_id": episode_id, "frame_idx": np.arange(len(ts_s)), "ts_s": ts_s,
        "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(world_from_cam[:, :3, :3])),
        "world_from_cam_t_mu": list(world_from_cam[:, :3, 3]), "pose_quality": "keyframe",
    })  # fmt: skip


def map_rows(sim: SimulatedMap, ts_s: np.ndarray, episode_id: str = EPISODE) -> pd.DataFrame:
    """Posed frames, `keyframe_poses` and `ba_points` rows of a simulated map, stacked as fusion gets them."""
    poses = sim.world_from_cam
    keyframes = pd.DataFrame({
        "episode_id": episode_id, "frame_idx": sim.keyframes,
        "obs_point_idx": [o.tolist() for o in sim.observed],
        "world_from_cam_q_wxyz": list(quat_wxyz_from_matrix(poses[sim.keyframes, :3, :3])),
        "world_from_cam_t_mu": list(poses[sim.keyframes, :3, 3]), TABLE_COLUMN: KEYFRAME_POSES.name,
    })  # fmt: skip
    ba_points = pd.DataFrame({
        "episode_id": episode_id, "point_idx": np.arange(len(sim.points)), "x_in_world_mu": list(sim.points),
        TABLE_COLUMN: BA_POINTS.name,
    })  # fmt: skip
    return pd.concat([_pose_rows(poses, ts_s, episode_id), keyframes, ba_points], ignore_index=True)


def _tracked_rows(episode: SynthEpisode, hands: pd.DataFrame, root: Path) -> tuple[pd.DataFrame, float]:
    """Posed frames and map of the rendered episode, tracked by the stage units; the Sim(3)-fitted truth."""
    sample = SampleOptions(frames=episode.num_frames, seed=episode.options.seed)
    paths = write_sample(root, sample)
    calibration = calibration_to_json(read_calibration(paths["calib"]))

    def shard_hands(shard: pd.DataFrame) -> pd.DataFrame:
        start, stop = int(shard["frame_start"].iat[0]), int(shard["frame_stop"].iat[0])
        return hands[(hands["frame_idx"] >= start) & (hands["frame_idx"] < stop)]

    tables = episode_tables(paths["video"], calibration, shard_hands)
    poses = tables["camera_poses"].assign(episode_id=EPISODE)
    wfc = world_from_cam_from_columns(
        poses["world_from_cam_q_wxyz"].where(poses["world_from_cam_q_wxyz"].notna(), None),
        poses["world_from_cam_t_mu"].where(poses["world_from_cam_t_mu"].notna(), None),
    )
    truth = evaluate_trajectory(wfc, episode.world_from_cam[poses["frame_idx"].to_numpy()]).scale
    frames = tables["frames"][["frame_idx", "ts_s"]].merge(
        poses[["episode_id", "frame_idx", "world_from_cam_q_wxyz", "world_from_cam_t_mu", "pose_quality"]],
        on="frame_idx",
    )
    keyframes = tables["keyframe_poses"].assign(episode_id=EPISODE, **{TABLE_COLUMN: KEYFRAME_POSES.name})
    points = tables["ba_points"].assign(episode_id=EPISODE, **{TABLE_COLUMN: BA_POINTS.name})
    return pd.concat([frames, keyframes, points], ignore_index=True), float(truth)


def run_seed(seed: int, frames: int, poses: str) -> SeedResult:
    """One synthetic episode through the fusion udf (module docstring); its scale against the truth."""
    started = time.process_time()
    rng = np.random.default_rng(1000 + seed)
    episode = generate_episode(SynthOptions(num_frames=frames, seed=seed))
    truth = float(np.exp(rng.uniform(np.log(0.2), np.log(5.0))))
    sim = simulated_map(episode, truth, rng)
    hands = _hands_cam(episode, rng)
    if poses == "tracked":
        with tempfile.TemporaryDirectory() as root:
            posed, truth = _tracked_rows(episode, hands, Path(root))
    else:
        posed = map_rows(sim, episode.ts_s)
    out, fused = fuse_hands_detailed(posed, hands, FusionOptions())
    result = _result(seed, truth, out, None if fused is None else fused.hand_scale, started)
    logger.info("seed %d: %s", seed, result)
    return result


def _result(
    seed: int, truth: float, out: pd.DataFrame, logged: HandScale | None, started: float
) -> SeedResult:
    scale = (
        None if out.empty or pd.isna(out["metres_per_unit"].iat[0]) else float(out["metres_per_unit"].iat[0])
    )
    rel_fit = None if logged is None or not np.isfinite(logged.rel_std_fit) else logged.rel_std_fit
    rel = None if scale is None else float(out["metres_per_unit_std"].iat[0]) / scale
    error = None if scale is None else scale / truth - 1.0
    return SeedResult(
        seed=seed, truth=truth, metres_per_unit=scale,
        error_pct=None if error is None else 100 * error,
        rel_std_fit_pct=None if rel_fit is None else 100 * rel_fit,
        rel_std_pct=None if rel is None else 100 * rel,
        covered=None if error is None or rel_fit is None else abs(np.log1p(error)) <= 1.96 * rel_fit,
        moments=0 if logged is None else len(logged.moments),
        in_contact=0 if logged is None else logged.moments_in_contact,
        reason=None if logged is None else logged.reason,
        seconds=time.process_time() - started,
    )  # fmt: skip


def _median(values: list) -> float | None:
    return round(float(np.median(values)), 2) if values else None


def summarise(results: list[SeedResult]) -> dict[str, object]:
    """Counts and error statistics over the seeds (refused seeds count as misses)."""
    answered = [r for r in results if r.error_pct is not None]
    errors = np.array([r.error_pct for r in answered])
    return {
        "seeds": len(results),
        "answered": len(answered),
        "within_5_pct": int(np.sum(np.abs(errors) <= 5.0)),
        "covered_by_1.96_rel_std_fit": int(sum(bool(r.covered) for r in answered)),
        "error_pct_mean": round(float(errors.mean()), 2) if len(errors) else None,
        "error_pct_rms": round(float(np.sqrt(np.mean(errors**2))), 2) if len(errors) else None,
        "error_pct_max_abs": round(float(np.abs(errors).max()), 2) if len(errors) else None,
        "rel_std_fit_pct_median": _median([r.rel_std_fit_pct for r in answered]),
        "rel_std_pct_median": _median([r.rel_std_pct for r in answered]),
        "cpu_s_per_seed": round(float(np.mean([r.seconds for r in results])), 1),
    }  # fmt: skip


def _table(results: list[SeedResult]) -> str:
    keys = list(asdict(results[0]))
    rows = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in results:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in asdict(r).values()]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    """Run the seeds (in parallel with --workers) and write hand_scale.{md,json}."""
    init_logging()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--poses", choices=("truth", "tracked"), default="truth")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits  # noqa: PLC0415 - the bench extra; tests import map_rows

    jobs = [(seed, args.frames, args.poses) for seed in range(args.seeds)]
    with threadpool_limits(1):
        if args.workers > 1:
            with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
                results = pool.starmap(run_seed, jobs)
        else:
            results = [run_seed(*job) for job in jobs]
    summary = summarise(results)
    name = "hand_scale" if args.poses == "truth" else "hand_scale_tracked"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**provenance("bench.hand_scale"), "summary": summary, "seeds": [asdict(r) for r in results]}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
    head = "\n".join(f"- {k}: {record[k]}" for k in ("command", "date", "machine"))
    lines = "\n".join(f"- {k}: {v}" for k, v in summary.items())
    title = f"# hand scale: metres per map unit from the hands, {args.poses} poses"
    notes = kept_notes(out / f"{name}.md")
    seeds = _table(results)
    text = f"{title}\n\n{head}\n\n## Summary\n\n{lines}\n\n## Seeds\n\n{seeds}\n\n{NOTES_MARKER}\n{notes}"
    (out / f"{name}.md").write_text(text)
    logger.info("hand scale bench: %s", summary)


if __name__ == "__main__":
    main()
