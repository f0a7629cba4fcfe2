"""Benchmark camera poses: accuracy (evo ATE/RPE) and CPU throughput per sequence, and pycolmap.

Usage:
    .venv/bin/python -m bench.camera_poses --out bench/results [--colmap]

Writes ``camera_poses.json`` and ``camera_poses.md`` with the command, machine and date. Throughput
is frames per CPU-second of one process with OpenCV limited to one thread (priors = KLT features,
tracking, global BA, completion; image decoding excluded). ``--colmap`` also runs pycolmap's
incremental mapper (sequential matching, lowered initial triangulation angle) on the same frames.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from pose_core.camera_poses.completion import bundle_adjust_keyframes, complete_poses
from pose_core.camera_poses.evaluation import evaluate_trajectory, rotation_drift_deg
from pose_core.camera_poses.features import extract_features
from pose_core.camera_poses.tracking import track_episode
from pose_core.geometry.camera import Camera
from pose_core.geometry.interop import world_from_cam_from_colmap_params, world_from_cam_from_kitti_rows

__all__ = ["main"]

logger = logging.getLogger(__name__)

DATA = Path(os.environ.get("EGOLAKE_SHARED_DATA", "/work/shared/data"))
KITTI_CAM = Camera(1226, 370, 707.0912, 707.0912, 601.8873, 183.1104)
EUROC_CAM = Camera(752, 480, 458.654, 457.296, 367.215, 248.375, "radtan",
                   (-0.28340811, 0.07395907, 0.00019359, 1.76187114e-05))


def _sequences() -> dict[str, tuple[list[Path], Camera, np.ndarray | None, tuple[int, int] | None]]:
    kitti = sorted(Path(p) for p in glob.glob(str(DATA / "kitti_vo_seq1/image_l/*.png")))
    kitti_gt = world_from_cam_from_kitti_rows(np.loadtxt(DATA / "kitti_vo_seq1/poses.txt"))
    euroc = sorted(Path(p) for p in glob.glob(str(DATA / "euroc_v101_micro/mav0/cam0/data/*.png")))
    return {
        "kitti_vo_seq1 1226x370": (kitti, KITTI_CAM, kitti_gt, None),
        "kitti_vo_seq1 640x480": (kitti, KITTI_CAM.scaled(640, 480), kitti_gt, (640, 480)),
        "euroc_v101_micro 752x480": (euroc, EUROC_CAM, None, None),
    }


def _run_egolake(paths: list[Path], cam: Camera, gt: np.ndarray | None, size: tuple[int, int] | None) -> dict:
    imgs = [cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in paths]
    if size is not None:
        imgs = [cv2.resize(i, size, interpolation=cv2.INTER_AREA) for i in imgs]
    times = {}
    c0 = time.process_time()
    feats = list(extract_features(imgs))
    c1 = time.process_time()
    tracked = track_episode(feats, cam)
    c2 = time.process_time()
    bundle_adjust_keyframes(tracked, cam)
    c3 = time.process_time()
    done = complete_poses(tracked, feats, cam)
    c4 = time.process_time()
    times = {"priors_s": c1 - c0, "tracking_s": c2 - c1, "ba_s": c3 - c2, "completion_s": c4 - c3}
    out = {"frames": len(imgs), "cpu_s": c4 - c0, "frames_per_cpu_s": len(imgs) / (c4 - c0), **times,
           "keyframes": int(tracked.is_keyframe.sum()), "segments": int(tracked.segment_id.max()) + 1,
           "rotation_drift_deg": rotation_drift_deg(done.world_from_cam),
           "max_translation": float(np.abs(done.world_from_cam[:, :3, 3]).max()),
           "static_frames": int((tracked.state == 1).sum())}
    if gt is not None:
        out.update(evaluate_trajectory(done.world_from_cam, gt).to_dict())
    return out


def _run_colmap(paths: list[Path], cam: Camera, gt: np.ndarray | None) -> dict:
    import pycolmap  # noqa: PLC0415 - comparison only

    with tempfile.TemporaryDirectory() as tmp:
        img_dir = Path(tmp) / "images"
        img_dir.mkdir()
        for p in paths:
            (img_dir / p.name).symlink_to(p)
        db = Path(tmp) / "db.db"
        t0 = time.perf_counter()
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = "PINHOLE"
        reader.camera_params = f"{cam.fx},{cam.fy},{cam.cx},{cam.cy}"
        pycolmap.extract_features(db, img_dir, camera_mode=pycolmap.CameraMode.SINGLE, reader_options=reader)
        pycolmap.match_sequential(db)
        opts = pycolmap.IncrementalPipelineOptions()
        opts.mapper.init_min_tri_angle = 2.0
        recs = pycolmap.incremental_mapping(db, img_dir, Path(tmp) / "sparse", options=opts)
        wall = time.perf_counter() - t0
        if not recs:
            return {"registered": 0, "wall_s": wall}
        rec = max(recs.values(), key=lambda r: r.num_reg_images())
        names = [p.name for p in paths]
        wfc = np.full((len(paths), 4, 4), np.nan)
        for image in rec.images.values():
            if image.has_pose:
                wfc[names.index(image.name)] = world_from_cam_from_colmap_params(
                    np.concatenate([image.cam_from_world().rotation.quat, image.cam_from_world().translation])[None])[0]
    out = {"registered": int(rec.num_reg_images()), "wall_s": wall}
    if gt is not None:
        out.update(evaluate_trajectory(wfc, gt).to_dict())
    return out


def main() -> None:
    """Run the benchmark and write JSON + markdown results."""
    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--colmap", action="store_true", help="also run pycolmap's incremental mapper")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    results = {"command": " ".join(sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": f"{platform.node()} {platform.processor() or platform.machine()} "
                          f"{os.cpu_count()} cpus, python {platform.python_version()}, opencv {cv2.__version__}",
               "sequences": {}}
    for name, (paths, cam, gt, size) in _sequences().items():
        entry = {"egolake": _run_egolake(paths, cam, gt, size)}
        if args.colmap and size is None and gt is not None:
            entry["pycolmap"] = _run_colmap(paths, cam, gt)
        results["sequences"][name] = entry
        logger.info("%s: %s", name, json.dumps(entry))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "camera_poses.json").write_text(json.dumps(results, indent=2))
    lines = [f"# camera poses benchmark\n\ncommand: `{results['command']}`  \ndate: {results['date']}  \n"
             f"machine: {results['machine']}\n",
             "| sequence | method | frames | ATE % path | ATE m | RPE rot deg | rot drift deg | frames/CPU-s | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results["sequences"].items():
        for method, r in entry.items():
            lines.append(f"| {name} | {method} | {r.get('frames', r.get('registered'))} | "
                         f"{r.get('ate_pct_of_path', float('nan')):.3f} | {r.get('ate_rmse_m', float('nan')):.3f} | "
                         f"{r.get('rpe_rot_rmse_deg', float('nan')):.3f} | {r.get('rotation_drift_deg', float('nan')):.3f} | "
                         f"{r.get('frames_per_cpu_s', float('nan')):.1f} | {r.get('wall_s', float('nan')):.1f} |")
    (args.out / "camera_poses.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
