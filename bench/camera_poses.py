"""Benchmark camera poses: accuracy (evo ATE/RPE) and CPU throughput per sequence, and pycolmap.

Usage:
    .venv/bin/python -m bench.camera_poses --out bench/results [--colmap | --colmap-from EARLIER.json]
        [--synth-dir DIR] [--only TEXT --stem NAME]

Writes ``camera_poses.json`` and ``camera_poses.md`` (``--stem``) with the command, machine and date
(hand-written notes below the marker are kept); ``--only`` runs the sequences whose name contains TEXT.
Throughput is frames per CPU-second of one process with OpenCV and BLAS limited to one thread, the fastest of
``--repeats`` runs and the median run's rate beside it (priors = KLT
features, tracking incl. local BA and segment joining, global BA, completion; image decoding
excluded). Sequences: KITTI (native and resized to 640x480), EuRoC (static camera) and a synthetic
egocentric clip from ``jobs.sample`` (600 frames, 640x480, fast head turns) and the ``hard`` sample
of issue 14 ("synthetic hard": 20 s, ~205 deg/s head turns, a 2.2 m walk away from the table and
back, a hand raised to the lens covering up to ~30 % of the frame; its committed seed 14, and seeds 3
and 7, used only for evaluation: no setting was chosen on them; seed 14 also encoded with x264
``veryfast`` instead of ``medium``, same crf), "synthetic table 300" (the default
scene's 300-frame clips of seeds 1-8, as the retarget bench renders seeds 1-3; each also with no hand
masks; evaluation only until the first-motion check's ``tie_ratio`` was set with seeds 3 and 8 in
view), all generated into
``--synth-dir`` on first use, with hands masked by boxes around their ground-truth keypoints (standing
in for the hands stage), and 7-Scenes redkitchen (real handheld, 600 frames, with its given
intrinsics and from the 70° prior). ``--colmap`` also runs pycolmap's incremental mapper (SIFT,
sequential matching, initial triangulation angle lowered to 2 degrees, forward motion allowed for
the initial pair) on KITTI's native frames and on 7-Scenes; ``--colmap-from`` takes those rows from
an earlier result of this bench, named in the output. Every frame counts: ATE is over all
frames (the median of the runs' ATE is reported; RANSAC is seeded, so runs differ only by time),
with the largest frame error over the RMSE and the keyframes' ATE beside it. The "70° prior focal"
sequences start from ``Camera.from_prior``
(no calibration): tracking estimates the focal and a radial term and tracks again with them
(``self_calibration``, as the tracking stage does), global BA refines them when the motion determines
them (``ba``'s guard); the "not refined" ones keep the prior throughout.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import glob
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import cv2
import numpy as np
from threadpoolctl import threadpool_limits

from bench.report import SHARED_DATA, write_result
from jobs.sample import SAMPLE_PRESETS, SampleOptions, write_sample
from pose_core.camera_poses.completion import (
    CompletionOptions,
    CompletionResult,
    GlobalBA,
    bundle_adjust_keyframes,
    complete_poses,
)
from pose_core.camera_poses.evaluation import evaluate_trajectory, rotation_drift_deg
from pose_core.camera_poses.features import extract_features
from pose_core.camera_poses.self_calibration import SelfCalibrationOptions, track_self_calibrated
from pose_core.camera_poses.tracking import TrackingOptions, TrackingResult, TrackingState
from pose_core.geometry.camera import Camera
from pose_core.geometry.interop import world_from_cam_from_colmap_params, world_from_cam_from_kitti_rows
from pose_core.geometry.rigid3 import nearest_rotation
from udfs.media.decode import decode_frames
from udfs.options import DecodeOptions

__all__ = ["main"]

logger = logging.getLogger(__name__)

DATA = SHARED_DATA
SEVEN_CAM = Camera(640, 480, 585.0, 585.0, 320.0, 240.0)  # camera-intrinsics.txt of the 7-Scenes copy
KITTI_CAM = Camera(1226, 370, 707.0912, 707.0912, 601.8873, 183.1104)
EUROC_CAM = Camera(752, 480, 458.654, 457.296, 367.215, 248.375, "radtan",
                   (-0.28340811, 0.07395907, 0.00019359, 1.76187114e-05))
SYNTH = SampleOptions(frames=600, seed=0)
SYNTH_HARD = SAMPLE_PRESETS["hard"]
TABLE_SEEDS = range(1, 9)  # "synthetic table 300": seeds of the default scene (see the docstring)
HAND_MARGIN_PX = 25.0  # hand boxes: ground-truth keypoints' bounding box grown by this, pixels


@dataclass
class Sequence:
    """One benchmark sequence: frame loader, camera, ground truth and hand boxes."""

    load: Callable[[], list[np.ndarray]]  # grayscale frames (H, W) uint8
    camera: Camera
    world_from_cam_gt: np.ndarray | None  # (F, 4, 4)
    image_paths: list[Path] | None = None  # for pycolmap
    hand_boxes: list[np.ndarray] | None = None  # per frame (K, 4) pixel boxes
    completion: CompletionOptions = field(default_factory=CompletionOptions)  # global BA and completion
    # intrinsics estimated while tracking (as the tracking stage does) when the camera is a prior
    self_calibration: SelfCalibrationOptions = field(default_factory=SelfCalibrationOptions)


def _images(paths: list[Path], size: tuple[int, int] | None) -> Callable[[], list[np.ndarray]]:
    def load() -> list[np.ndarray]:
        imgs = [cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in paths]
        return imgs if size is None else [cv2.resize(i, size, interpolation=cv2.INTER_AREA) for i in imgs]

    return load


def _synthetic(root: Path, sample: SampleOptions) -> Sequence:
    gt_dir = root / "ground_truth" / sample.stem
    if not (gt_dir / "README.md").exists():
        logger.info("generating the synthetic clip %s into %s (a few minutes)", sample.stem, root)
        write_sample(root, sample)
    hands_px = np.load(gt_dir / "hands_px.npy")  # (F, 2, 21, 2), NaN behind the camera
    finite = np.isfinite(hands_px).all(axis=-1, keepdims=True)
    lo = np.where(finite, hands_px, np.inf).min(axis=2) - HAND_MARGIN_PX
    hi = np.where(finite, hands_px, -np.inf).max(axis=2) + HAND_MARGIN_PX

    def load() -> list[np.ndarray]:
        decoded = decode_frames(str(root / "videos" / f"{sample.stem}.mp4"), 0, None, DecodeOptions())
        return [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in decoded.frames]

    cam = Camera(sample.width, sample.height, sample.focal_px, sample.focal_px, (sample.width - 1) / 2,
                 (sample.height - 1) / 2)
    return Sequence(load, cam, np.load(gt_dir / "world_from_cam.npy"),
                    hand_boxes=[np.concatenate([lo[f], hi[f]], axis=1) for f in range(len(hands_px))])


def _table_seed(synth_dir: Path, seed: int, masked: bool) -> Sequence:
    """The default (table) scene's 300-frame clip of one seed, its hands masked or not."""
    seq = _synthetic(synth_dir, SampleOptions(frames=300, seed=seed))
    return seq if masked else replace(seq, hand_boxes=None)


def _sequences(synth_dir: Path) -> dict[str, Callable[[], Sequence]]:
    """Each sequence by name, built when called (a synthetic clip is rendered only when it runs)."""
    kitti = sorted(Path(p) for p in glob.glob(str(DATA / "kitti_vo_seq1/image_l/*.png")))
    kitti_gt = world_from_cam_from_kitti_rows(np.loadtxt(DATA / "kitti_vo_seq1/poses.txt"))
    euroc = sorted(Path(p) for p in glob.glob(str(DATA / "euroc_v101_micro/mav0/cam0/data/*.png")))
    synth = functools.cache(lambda: _synthetic(synth_dir, SYNTH))
    prior_cam = Camera.from_prior(KITTI_CAM.width, KITTI_CAM.height)
    kitti_prior = Sequence(_images(kitti, None), prior_cam, kitti_gt)

    def synth_prior() -> Sequence:
        seq = synth()
        return replace(seq, camera=Camera.from_prior(seq.camera.width, seq.camera.height))

    kept = {"completion": CompletionOptions(refine_focal=False),
            "self_calibration": SelfCalibrationOptions(enabled=False)}
    seven = sorted(Path(p) for p in glob.glob(str(DATA / "sevenscenes_redkitchen_seq01_a/frame-*.color.jpg")))
    seven_gt = np.stack([np.loadtxt(str(p).replace("color.jpg", "pose.txt")) for p in seven])
    seven_gt[:, :3, :3] = nearest_rotation(seven_gt[:, :3, :3])  # the files hold 8 digits
    return {
        "kitti_vo_seq1 1226x370": lambda: Sequence(_images(kitti, None), KITTI_CAM, kitti_gt, kitti),
        "kitti_vo_seq1 640x480": lambda: Sequence(_images(kitti, (640, 480)), KITTI_CAM.scaled(640, 480),
                                                  kitti_gt),
        "euroc_v101_micro 752x480": lambda: Sequence(_images(euroc, None), EUROC_CAM, None),
        "synthetic egocentric 600 640x480": synth,
        "kitti_vo_seq1 1226x370, 70° prior focal": lambda: kitti_prior,
        "kitti_vo_seq1 1226x370, 70° prior focal not refined": lambda: replace(kitti_prior, **kept),
        "synthetic egocentric 600 640x480, 70° prior focal": synth_prior,
        "synthetic egocentric 600 640x480, 70° prior focal not refined": lambda: replace(
            synth_prior(), **kept),
        "synthetic hard 600 640x480": lambda: _synthetic(synth_dir, SYNTH_HARD),
        "synthetic hard 600 640x480, seed 3": lambda: _synthetic(synth_dir, replace(SYNTH_HARD, seed=3)),
        "synthetic hard 600 640x480, seed 7": lambda: _synthetic(synth_dir, replace(SYNTH_HARD, seed=7)),
        "synthetic hard 600 640x480, x264 veryfast": lambda: _synthetic(
            synth_dir, replace(SYNTH_HARD, encoder_preset="veryfast", name="synth_hard_014_veryfast")
        ),
        "synthetic hard 600 640x480, 70° prior focal": lambda: replace(
            _synthetic(synth_dir, SYNTH_HARD), camera=Camera.from_prior(640, 480)),
        **{f"synthetic table 300 640x480, seed {seed}{label}": functools.partial(
            _table_seed, synth_dir, seed, masked) for seed in TABLE_SEEDS
           for label, masked in (("", True), (", no hand masks", False))},
        "7-Scenes redkitchen 600 640x480": lambda: Sequence(_images(seven, None), SEVEN_CAM, seven_gt, seven),
        "7-Scenes redkitchen 600 640x480, 70° prior focal": lambda: Sequence(
            _images(seven, None), Camera.from_prior(640, 480), seven_gt),
    }


def _timed_pipeline(imgs: list[np.ndarray], seq: Sequence
                    ) -> tuple[dict, TrackingResult, CompletionResult, GlobalBA]:
    """One run of priors -> tracking -> global BA -> completion with CPU seconds per stage."""
    cam = seq.camera
    t0, c0 = time.perf_counter(), time.process_time()
    feats = list(extract_features(imgs, hand_masks=seq.hand_boxes))
    c1 = time.process_time()
    tracked, cam = track_self_calibrated(feats, cam, TrackingOptions(), seq.self_calibration)
    c2 = time.process_time()
    ba = bundle_adjust_keyframes(tracked, cam, seq.completion)
    c3 = time.process_time()
    done = complete_poses(tracked, feats, ba.camera, seq.completion)
    c4, wall = time.process_time(), time.perf_counter() - t0
    times = {"cpu_s": c4 - c0, "wall_s": wall, "priors_s": c1 - c0, "tracking_s": c2 - c1, "ba_s": c3 - c2,
             "completion_s": c4 - c3}
    return times, tracked, done, ba


def _run_egolake(seq: Sequence, repeats: int) -> dict:
    """Accuracy and CPU time of the fastest of ``repeats`` runs, plus every run's ATE.

    The machine is shared, so the fastest run is the least disturbed measurement of CPU time.
    """
    imgs = seq.load()
    runs = [_timed_pipeline(imgs, seq) for _ in range(repeats)]
    times, tracked, done, ba = min(runs, key=lambda r: r[0]["cpu_s"])
    cpu_all = [r[0]["cpu_s"] for r in runs]
    out = {"frames": len(imgs), **times, "frames_per_cpu_s": len(imgs) / times["cpu_s"],
           "frames_per_cpu_s_median_run": len(imgs) / float(np.median(cpu_all)), "repeats": repeats,
           "keyframes": int(tracked.is_keyframe.sum()), "segments": int(len(np.unique(tracked.segment_id))),
           "lost_frames": int((tracked.state == 0).sum()),
           "joined_segments": sum(j.joined_to != j.segment for j in tracked.joins),
           "loops_closed": sum(j.joined_to == j.segment for j in tracked.joins),
           "relocalisations": tracked.relocalisations,
           "rotation_only_frames": int((tracked.state == TrackingState.ROTATION_ONLY).sum()),
           "rotation_drift_deg": rotation_drift_deg(done.world_from_cam),
           "max_translation": float(np.abs(done.world_from_cam[:, :3, 3]).max()),
           "static_frames": int((tracked.state == 1).sum()), "focal_prior_px": seq.camera.focal_px,
           "focal_px": ba.camera.focal_px, "focal_std_px": ba.focal_std_px, "focal_status": ba.focal_status,
           "radial_k1": ba.camera.dist[0] if ba.camera.model == "radtan" else 0.0,
           "radial_status": ba.radial_status}
    if seq.world_from_cam_gt is not None:
        out.update(evaluate_trajectory(done.world_from_cam, seq.world_from_cam_gt).to_dict())
        out["ate_pct_of_path_every_run"] = [
            evaluate_trajectory(r[2].world_from_cam, seq.world_from_cam_gt).ate_pct_of_path for r in runs]
        out["ate_pct_of_path_median_run"] = float(np.median(out["ate_pct_of_path_every_run"]))
        out["ate_max_over_rmse"] = out["ate_max_m"] / out["ate_rmse_m"]
        keyframes_only = np.where(done.is_keyframe[:, None, None], done.world_from_cam, np.nan)
        keyframe_errors = evaluate_trajectory(keyframes_only, seq.world_from_cam_gt)
        out["ate_pct_of_path_keyframes"] = keyframe_errors.ate_pct_of_path
    return out


def _run_colmap(paths: list[Path], cam: Camera, gt: np.ndarray | None) -> dict:
    import pycolmap  # noqa: PLC0415 - comparison only

    with tempfile.TemporaryDirectory() as tmp:
        img_dir = Path(tmp) / "images"
        img_dir.mkdir()
        for p in paths:
            (img_dir / p.name).symlink_to(p)
        db = Path(tmp) / "db.db"
        t0, c0 = time.perf_counter(), time.process_time()
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = "PINHOLE"
        reader.camera_params = f"{cam.fx},{cam.fy},{cam.cx},{cam.cy}"
        pycolmap.extract_features(db, img_dir, camera_mode=pycolmap.CameraMode.SINGLE, reader_options=reader)
        pycolmap.match_sequential(db)
        opts = pycolmap.IncrementalPipelineOptions()
        opts.mapper.init_min_tri_angle = 2.0
        opts.mapper.init_max_forward_motion = 1.0  # KITTI drives forward: the default 0.95 rejects every pair
        recs = pycolmap.incremental_mapping(db, img_dir, Path(tmp) / "sparse", options=opts)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if not recs:
            return {"registered": 0, "wall_s": wall, "cpu_s": cpu}
        rec = max(recs.values(), key=lambda r: r.num_reg_images())
        names = [p.name for p in paths]
        wfc = np.full((len(paths), 4, 4), np.nan)
        for image in rec.images.values():
            if image.has_pose:
                pose = image.cam_from_world()
                wfc[names.index(image.name)] = world_from_cam_from_colmap_params(
                    np.concatenate([pose.rotation.quat, pose.translation])[None])[0]
    out = {"registered": int(rec.num_reg_images()), "frames": len(paths), "wall_s": wall, "cpu_s": cpu,
           "frames_per_cpu_s": len(paths) / cpu}
    if gt is not None:
        out.update(evaluate_trajectory(wfc, gt).to_dict())
    return out


def _markdown(results: dict) -> str:
    lines = [f"# camera poses benchmark\n\ncommand: `{results['command']}`  \ndate: {results['date']}  \n"
             f"machine: {results['machine']}  \nload average at start: {results['load_average']}\n"
             + (f"pycolmap rows from {results['colmap_from']}\n" if "colmap_from" in results else ""),
             "| sequence | method | frames | registered | ATE % path (median run) | ATE m | max / RMSE "
             "| RPE rot deg | rot drift deg | frames/CPU-s | CPU s | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for name, entry in results["sequences"].items():
        for method, r in entry.items():
            lines.append(
                f"| {name} | {method} | {r.get('frames')} | "
                f"{r.get('registered', r.get('num_frames', '-'))} | "
                f"{r.get('ate_pct_of_path_median_run', r.get('ate_pct_of_path', nan)):.3f} | "
                f"{r.get('ate_rmse_m', nan):.3f} | {r.get('ate_max_over_rmse', nan):.2f} | "
                f"{r.get('rpe_rot_rmse_deg', nan):.3f} | {r.get('rotation_drift_deg', nan):.3f} | "
                f"{r.get('frames_per_cpu_s', nan):.1f} | {r.get('cpu_s', nan):.2f} | "
                f"{r.get('wall_s', nan):.1f} |")
    lines.append("\negolake frames/CPU-s is the fastest of the repeated runs; the median run: "
                 + ", ".join(f"{n} {e['egolake']['frames_per_cpu_s_median_run']:.1f}"
                             for n, e in results["sequences"].items()))
    lines.append("\negolake stage CPU seconds (priors / tracking / global BA / completion), keyframes, "
                 "segments:\n")
    for name, entry in results["sequences"].items():
        r = entry["egolake"]
        lines.append(f"- {name}: {r['priors_s']:.2f} / {r['tracking_s']:.2f} / {r['ba_s']:.2f} / "
                     f"{r['completion_s']:.2f}; {r['keyframes']} keyframes, {r['segments']} segment(s), "
                     f"{r['lost_frames']} lost, {r['rotation_only_frames']} rotation-only and "
                     f"{r['static_frames']} static frame(s), {r['relocalisations']} relocalisation(s), "
                     f"{r['joined_segments']} map(s) joined, {r['loops_closed']} loop(s) closed; "
                     f"keyframes alone ATE {r.get('ate_pct_of_path_keyframes', nan):.3f} %; focal "
                     f"{r['focal_prior_px']:.1f} -> {r['focal_px']:.1f} px ({r['focal_status']}, std "
                     f"{r['focal_std_px']:.1f} px), k1 {r['radial_k1']:.3f} ({r['radial_status']})")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the benchmark and write JSON + markdown results."""
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--colmap", action="store_true", help="also run pycolmap's incremental mapper")
    parser.add_argument("--colmap-from", type=Path, default=None,
                        help="take pycolmap's rows from an earlier result JSON of this bench (they do not "
                             "depend on egolake; its 7-Scenes run takes ~50 CPU-minutes)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per sequence; the fastest is reported")
    parser.add_argument("--only", default="", help="run only the sequences whose name contains this")
    parser.add_argument("--stem", default="camera_poses", help="result files: OUT/<stem>.json and .md")
    parser.add_argument("--synth-dir", type=Path, default=Path(tempfile.gettempdir()) / "egolake_bench_synth",
                        help="where the synthetic clip is generated (reused when present)")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    results = {"command": " ".join(sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} "
                          f"cpus, python {platform.python_version()}, opencv {cv2.__version__}",
               "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()), "sequences": {}}
    earlier = json.loads(args.colmap_from.read_text()) if args.colmap_from else None
    if earlier is not None:
        results["colmap_from"] = f"{args.colmap_from.name}: `{earlier['command']}`, {earlier['date']}"
    for name, make in _sequences(args.synth_dir).items():
        if args.only not in name:
            continue
        seq = make()
        with threadpool_limits(1):
            entry = {"egolake": _run_egolake(seq, args.repeats)}
        if args.colmap and seq.image_paths is not None:
            entry["pycolmap"] = _run_colmap(seq.image_paths, seq.camera, seq.world_from_cam_gt)
        elif earlier is not None and "pycolmap" in earlier["sequences"].get(name, {}):
            entry["pycolmap"] = earlier["sequences"][name]["pycolmap"]
        results["sequences"][name] = entry
        logger.info("%s: %s", name, json.dumps(entry))
    write_result(args.out, args.stem, results, _markdown(results))


if __name__ == "__main__":
    main()
