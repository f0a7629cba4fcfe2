"""Feature tracks without rendering: scene points projected along the synthetic head trajectory.

Fast ground truth for tracking and BA tests where the image pipeline is not under test: points on
the room's walls, floor, ceiling and table top (`pose_core.synth.scene` geometry), seen by the
camera of `pose_core.synth.trajectory` (head turns, walks, sway) at 30 fps with Gaussian pixel
noise. A point that leaves the image and comes back gets a new track id, as KLT would give it.
"""

from __future__ import annotations

import numpy as np

from pose_core.camera_poses.features import FrameFeatures
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

WIDTH, HEIGHT, FOCAL_PX, FPS = 640, 480, 500.0, 30.0


def scene_points(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points, half on the table top and half on the room's six faces, world frame, ``(n, 3)``."""
    opts = SceneOptions()
    lo, hi = np.asarray(opts.room_min_m), np.asarray(opts.room_max_m)
    centre, half = np.asarray(opts.table_center_m), np.asarray(opts.table_size_m) / 2
    n_table = n // 2
    table = np.column_stack([
        rng.uniform(centre[0] - half[0], centre[0] + half[0], n_table),
        rng.uniform(centre[1] - half[1], centre[1] + half[1], n_table),
        np.full(n_table, centre[2]),
    ])  # fmt: skip
    room = rng.uniform(lo, hi, (n - n_table, 3))
    face = rng.integers(0, 6, len(room))
    axis = face // 2
    room[np.arange(len(room)), axis] = np.where(face % 2 == 0, lo[axis], hi[axis])
    return np.concatenate([table, room])


def synthetic_tracks(frames: int, seed: int, n_points: int = 2000, noise_px: float = 0.3
                     ) -> tuple[list[FrameFeatures], np.ndarray]:
    """Per-frame tracks of a pinhole camera (``FOCAL_PX``, centred principal point) and its true poses.

    Returns:
        The features of frames ``0..frames-1`` and the true ``world_from_cam``, ``(frames, 4, 4)``.
    """
    rng = np.random.default_rng(seed)
    traj = make_head_trajectory(frames / FPS, TrajectoryOptions(), rng)
    world_from_cam = traj.sample(np.arange(frames) / FPS).world_from_cam
    pts = scene_points(n_points, rng)
    rel = pts[None] - world_from_cam[:, None, :3, 3]  # (F, P, 3)
    x_in_cam = np.einsum("fji,fpj->fpi", world_from_cam[:, :3, :3], rel)
    z = x_in_cam[..., 2]
    uv = FOCAL_PX * x_in_cam[..., :2] / np.maximum(z, 1e-6)[..., None] + [(WIDTH - 1) / 2, (HEIGHT - 1) / 2]
    seen = (z > 0.1) & (uv >= 0).all(axis=-1) & (uv[..., 0] <= WIDTH - 1) & (uv[..., 1] <= HEIGHT - 1)
    starts = np.diff(np.vstack([np.zeros((1, len(pts)), bool), seen]).astype(int), axis=0) == 1
    appearances = np.cumsum(starts, axis=0)
    track_id = np.arange(len(pts)) * frames + appearances  # (F, P): new id each time a point reappears
    uv = uv + rng.normal(size=uv.shape) * noise_px
    feats = [
        FrameFeatures(f, track_id[f, seen[f]].astype(np.int64), uv[f, seen[f]].astype(np.float32))
        for f in range(frames)
    ]
    return feats, world_from_cam
