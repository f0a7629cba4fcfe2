"""Tracking initialisation on exactly projected tracks (no images): the cases that once stalled it."""

import numpy as np

from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.tracking import TrackingOptions, TrackingState, track_episode
from pose_core.geometry.camera import Camera

CAM = Camera(640, 480, 500.0, 500.0, 319.5, 239.5)


def _sideways_clip(first_frame_tracks: int, frames: int = 40, seed: int = 0) -> list[FrameFeatures]:
    """A camera sliding 2 cm per frame along x past points 4-8 m away.

    Frame 0 sees only `first_frame_tracks` points (they stay in view throughout); 60 new points come
    into view at every later frame and stay. Track id = point index; pixels are exact projections.
    """
    rng = np.random.default_rng(seed)
    n = first_frame_tracks + 60 * (frames - 1)
    z = rng.uniform(4.0, 8.0, n)
    x = rng.uniform(-0.2, 0.2, n) * z + 0.02 * frames / 2  # in view of every camera position
    y = rng.uniform(-0.15, 0.15, n) * z
    born = np.concatenate([np.zeros(first_frame_tracks, int), 1 + np.arange(n - first_frame_tracks) // 60])
    feats = []
    for f in range(frames):
        ids = np.flatnonzero(born <= f)
        u = CAM.fx * (x[ids] - 0.02 * f) / z[ids] + CAM.cx
        v = CAM.fy * y[ids] / z[ids] + CAM.cy
        feats.append(FrameFeatures(f, ids.astype(np.int64), np.column_stack([u, v]).astype(np.float32)))
    return feats


def test_few_tracks_in_the_reference_do_not_stall_initialisation():
    """45 shared tracks (above `min_shared_tracks`, below `init_min_inliers`) once pinned the
    reference to frame 0 forever: it could never initialise and every frame stayed static."""
    opts = TrackingOptions()
    assert opts.min_shared_tracks < 45 < opts.init_min_inliers
    result = track_episode(_sideways_clip(first_frame_tracks=45), CAM, opts)
    tracking = result.state == int(TrackingState.TRACKING)
    assert tracking.mean() > 0.8
    first = int(np.argmax(tracking))
    assert first < 15
    positions = result.world_from_cam[tracking][:, :3, 3]
    path = positions[-1] - positions[0]
    assert abs(path[0]) > 10 * np.hypot(path[1], path[2])  # the motion found is sideways


def test_rich_first_frame_initialises_from_it():
    result = track_episode(_sideways_clip(first_frame_tracks=300), CAM)
    assert result.state[0] == int(TrackingState.TRACKING) or result.is_keyframe[0]
    assert (result.state == int(TrackingState.TRACKING)).mean() > 0.9
