"""Hand accuracy in 3-D on real photos with ground truth: `../shared/data/hands_realworld_gt`.

400 crops (256x256) of one hand each, `labels.npz`: `keypoints_cam_mm` `(400, 21, 3)` in the crop
camera's frame (MediaPipe order) and `crop_intrinsics` `(400, 4)` fx, fy, cx, cy. The estimator runs in
image mode on each crop; the found hand with the highest score is fitted with the crop's intrinsics.
Figures over the images where a hand was found:

- `detected`: images with a hand found;
- `err_2d_px`: mean distance of the detected keypoints from the projected ground truth, pixels;
- `pa_mpjpe_mm`: mean joint error after the best similarity (rotation, translation, scale) alignment;
- `root_rel_mpjpe_mm`: mean joint error with both wrists at the origin (no rotation, no scale);
- `cam_mpjpe_mm` / `cam_mpjpe_median_mm`: mean joint error in the camera frame, mean / median over images;
- `wrist_depth_err_pct`: median of |wrist depth error| / true wrist depth, percent;
- `palm_rel_mpjpe_mm`: as `root_rel_mpjpe_mm` with the palm centre (mean of the four finger bases,
  keypoints 5, 9, 13, 17) as the root instead of the wrist;
- `wrist_shift_2d_pct`: mean offset of the detected wrist from the true one along the true wrist ->
  middle-finger-base direction, percent of that length (negative: towards the forearm). The two say
  how much of the root-relative error is where the estimator and the labels put the wrist: a wrist
  placed a tenth of the palm's length apart moves all 20 other joints' root-relative errors with it.

`split` gives the images of one half, `first` (0-199) or `second` (200-399): the photos come in
blocks of one person or session (the true palm size steps between blocks), so halves of contiguous
images are the more independent split. `ArticulatedOptions.direction_sigma_rad` was chosen on the
first half, so the second half is the held-out figure for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from bench.report import SHARED_DATA
from pose_core.hands import FitOptions, HandObservation, MediaPipeOptions, fit_hand
from pose_core.hands.estimator import FINGER_BASES
from udfs.models import hand_estimator

__all__ = ["GT", "GroundTruth", "detect", "evaluate", "load_ground_truth"]

GT = SHARED_DATA / "hands_realworld_gt"


@dataclass(frozen=True)
class GroundTruth:
    """The photos' ground truth (N images).

    Attributes:
        keypoints_cam_m: `(N, 21, 3)` camera frame, metres.
        camera_k: `(N, 3, 3)` crop intrinsics, pixels.
    """

    keypoints_cam_m: np.ndarray
    camera_k: np.ndarray


def load_ground_truth() -> GroundTruth:
    """Read `labels.npz`."""
    labels = np.load(GT / "labels.npz")
    fx, fy, cx, cy = labels["crop_intrinsics"].T
    k = np.zeros((len(fx), 3, 3))
    k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2], k[:, 2, 2] = fx, fy, cx, cy, 1.0
    return GroundTruth(labels["keypoints_cam_mm"].astype(np.float64) / 1000.0, k)


def detect(opts: MediaPipeOptions, count: int) -> list[HandObservation | None]:
    """The highest-scoring hand of each of the first `count` photos (None where none is found)."""
    estimator = hand_estimator(opts)
    found: list[HandObservation | None] = []
    for i in range(count):
        image = np.ascontiguousarray(cv2.imread(str(GT / "images" / f"{i:05d}.jpg"))[:, :, ::-1])
        hands = estimator.estimate(image[None], np.eye(3))[0]
        found.append(max(hands, key=lambda h: h.score) if hands else None)
    return found


def _similarity_aligned(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """`pred` `(21, 3)` after the similarity transform that best fits it to `truth` (Umeyama)."""
    p, t = pred - pred.mean(axis=0), truth - truth.mean(axis=0)
    u, s, vt = np.linalg.svd(p.T @ t)
    d = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    rotation = (u @ d @ vt).T
    scale = float(np.trace(np.diag(s) @ d) / (p**2).sum())
    return scale * p @ rotation.T + truth.mean(axis=0)


def evaluate(
    found: list[HandObservation | None], truth: GroundTruth, fit: FitOptions, split: str | None = None
) -> dict[str, float | str]:
    """The module docstring's figures for `found` (one entry per photo) fitted with `fit`."""
    index = np.arange(len(found))
    if split is not None:
        half = len(found) // 2
        index = index[:half] if split == "first" else index[half:]
    err_2d, pa, root, cam, depth, palm_root, wrist_shift = [], [], [], [], [], [], []
    bases = list(FINGER_BASES)
    for i in index:
        hand = found[i]
        if hand is None:
            continue
        k, gt = truth.camera_k[i], truth.keypoints_cam_m[i]
        projected = gt @ k.T
        true_px = projected[:, :2] / projected[:, 2:]
        err_2d.append(np.linalg.norm(hand.keypoints_px - true_px, axis=1).mean())
        palm_axis = true_px[9] - true_px[0]
        wrist_shift.append((hand.keypoints_px[0] - true_px[0]) @ palm_axis / (palm_axis @ palm_axis))
        pred = fit_hand(hand, k, fit).keypoints_cam
        pa.append(np.linalg.norm(_similarity_aligned(pred, gt) - gt, axis=1).mean())
        root.append(np.linalg.norm((pred - pred[0]) - (gt - gt[0]), axis=1).mean())
        palm_rel = (pred - pred[bases].mean(axis=0)) - (gt - gt[bases].mean(axis=0))
        palm_root.append(np.linalg.norm(palm_rel, axis=1).mean())
        cam.append(np.linalg.norm(pred - gt, axis=1).mean())
        depth.append(abs(pred[0, 2] - gt[0, 2]) / gt[0, 2])
    return {
        "detected": f"{len(err_2d)}/{len(index)}",
        "err_2d_px": round(float(np.mean(err_2d)), 2),
        "pa_mpjpe_mm": round(1000 * float(np.nanmean(pa)), 1),
        "root_rel_mpjpe_mm": round(1000 * float(np.nanmean(root)), 1),
        "cam_mpjpe_mm": round(1000 * float(np.nanmean(cam)), 1),
        "cam_mpjpe_median_mm": round(1000 * float(np.nanmedian(cam)), 1),
        "wrist_depth_err_pct": round(100 * float(np.nanmedian(depth)), 2),
        "palm_rel_mpjpe_mm": round(1000 * float(np.nanmean(palm_root)), 1),
        "wrist_shift_2d_pct": round(100 * float(np.mean(wrist_shift)), 1),
    }
