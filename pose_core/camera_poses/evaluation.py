"""Trajectory accuracy against ground truth with evo: ATE after Sim(3)/SE(3) alignment and RPE.

Only the alignment and the metrics come from evo (``evo.core``); this module turns egolake's
``world_from_cam (F, 4, 4)`` arrays into evo trajectories and evo's statistics into a small
result type.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, dataclass

import numpy as np
from evo.core import metrics
from evo.core.trajectory import PoseTrajectory3D

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import so3_log

__all__ = ["TrajectoryErrors", "evaluate_trajectory", "rotation_drift_deg"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrajectoryErrors:
    """Accuracy of an estimated trajectory.

    Attributes:
        num_frames: frames compared (both poses finite).
        path_length_m: length of the ground-truth path over those frames, metres.
        ate_rmse_m: RMSE of the position error after alignment, metres.
        ate_pct_of_path: ``ate_rmse_m`` as a percentage of ``path_length_m``.
        ate_max_m: the largest position error of any frame after alignment, metres.
        rpe_trans_rmse_m: RMSE of the relative translation error between consecutive frames, metres.
        rpe_rot_rmse_deg: RMSE of the relative rotation error between consecutive frames, degrees.
        scale: scale of the Sim(3) alignment (1.0 for SE(3)).
    """

    num_frames: int
    path_length_m: float
    ate_rmse_m: float
    ate_pct_of_path: float
    ate_max_m: float
    rpe_trans_rmse_m: float
    rpe_rot_rmse_deg: float
    scale: float

    def to_dict(self) -> dict[str, float]:
        """Plain dict for JSON reports."""
        return asdict(self)


def _trajectory(world_from_cam: np.ndarray, ts_s: np.ndarray) -> PoseTrajectory3D:
    return PoseTrajectory3D(poses_se3=list(world_from_cam), timestamps=np.asarray(ts_s, dtype=np.float64))


def evaluate_trajectory(
    world_from_cam_est: np.ndarray,
    world_from_cam_gt: np.ndarray,
    ts_s: np.ndarray | None = None,
    correct_scale: bool = True,
) -> TrajectoryErrors:
    """ATE (after Umeyama alignment) and RPE (consecutive frames, after alignment) with evo.

    Args:
        world_from_cam_est: estimated poses, ``(F, 4, 4)``; frames with NaN are skipped.
        world_from_cam_gt: ground-truth poses of the same frames, ``(F, 4, 4)``, metres.
        ts_s: timestamps, seconds, ``(F,)``; defaults to the frame index.
        correct_scale: Sim(3) alignment (monocular) when True, SE(3) otherwise.

    Returns:
        The errors.

    Raises:
        ShapeError: if the two arrays differ in shape or are not ``(F, 4, 4)``.
    """
    est, gt = np.asarray(world_from_cam_est, float), np.asarray(world_from_cam_gt, float)
    if est.shape != gt.shape or est.ndim != 3 or est.shape[1:] != (4, 4):
        raise ShapeError("estimated vs ground-truth poses", est.shape, f"{gt.shape} and (F, 4, 4)")
    ts = np.arange(len(est), dtype=float) if ts_s is None else np.asarray(ts_s, float)
    ok = np.isfinite(est).all(axis=(1, 2)) & np.isfinite(gt).all(axis=(1, 2))
    traj_est, traj_gt = _trajectory(est[ok], ts[ok]), _trajectory(gt[ok], ts[ok])
    traj_est = copy.deepcopy(traj_est)
    _, _, scale = traj_est.align(traj_gt, correct_scale=correct_scale)
    ape = metrics.APE(metrics.PoseRelation.translation_part)
    ape.process_data((traj_gt, traj_est))
    rpe_t = metrics.RPE(metrics.PoseRelation.translation_part, delta=1, delta_unit=metrics.Unit.frames)
    rpe_t.process_data((traj_gt, traj_est))
    rpe_r = metrics.RPE(metrics.PoseRelation.rotation_angle_deg, delta=1, delta_unit=metrics.Unit.frames)
    rpe_r.process_data((traj_gt, traj_est))
    path = float(traj_gt.path_length)
    ate = float(ape.get_statistic(metrics.StatisticsType.rmse))
    return TrajectoryErrors(
        num_frames=int(ok.sum()),
        path_length_m=path,
        ate_rmse_m=ate,
        ate_pct_of_path=100.0 * ate / path if path > 0 else float("nan"),
        ate_max_m=float(ape.get_statistic(metrics.StatisticsType.max)),
        rpe_trans_rmse_m=float(rpe_t.get_statistic(metrics.StatisticsType.rmse)),
        rpe_rot_rmse_deg=float(rpe_r.get_statistic(metrics.StatisticsType.rmse)),
        scale=float(scale),
    )


def rotation_drift_deg(world_from_cam: np.ndarray) -> float:
    """Largest rotation of any frame relative to the first frame, degrees.

    Args:
        world_from_cam: poses, ``(F, 4, 4)``; NaN frames are skipped.

    Returns:
        The maximum angle, degrees (0 for a camera that does not turn).
    """
    ok = np.isfinite(world_from_cam).all(axis=(1, 2))
    rot = world_from_cam[ok, :3, :3]
    rel = np.swapaxes(rot[:1], 1, 2) @ rot
    return float(np.degrees(np.linalg.norm(so3_log(rel), axis=1)).max())
