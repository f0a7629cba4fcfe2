"""Tracking initialisation on exactly projected tracks (no images): the cases that once stalled it."""

import numpy as np

from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.tracking import TrackingOptions, TrackingState, track_episode
from pose_core.geometry.camera import Camera

CAM = Camera(640, 480, 500.0, 500.0, 319.5, 239.5)


def _sideways_clip(
    first_frame_tracks: int,
    frames: int = 40,
    seed: int = 0,
    step_m: float = 0.02,
    dying: tuple[int, int] = (0, 0),
) -> list[FrameFeatures]:
    """A camera sliding `step_m` per frame along x past points 4-8 m away.

    Frame 0 sees `first_frame_tracks` points; `dying = (count, frame)`: `count` of them vanish at
    `frame`, the others stay in view throughout. 60 new points come into view at every later frame
    and stay. Track id = point index; pixels are exact projections.
    """
    rng = np.random.default_rng(seed)
    n = first_frame_tracks + 60 * (frames - 1)
    z = rng.uniform(4.0, 8.0, n)
    x = rng.uniform(-0.2, 0.2, n) * z + step_m * frames / 2  # in view of every camera position
    y = rng.uniform(-0.15, 0.15, n) * z
    born = np.concatenate([np.zeros(first_frame_tracks, int), 1 + np.arange(n - first_frame_tracks) // 60])
    dies = np.full(n, frames)
    dies[: dying[0]] = dying[1]
    feats = []
    for f in range(frames):
        ids = np.flatnonzero((born <= f) & (f < dies))
        u = CAM.fx * (x[ids] - step_m * f) / z[ids] + CAM.cx
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


def test_slow_start_keeps_its_baseline_and_its_first_frames():
    """A slow camera (1.5 cm a frame past points 4-8 m away) whose first frame loses
    most of its tracks at frame 8. Moving the reference to the current frame (the old rule) threw
    away the baseline accrued so far: it never initialised in these 40 frames. The reference now
    moves to the oldest frame that still shares enough tracks, and the frames before it are posed
    from the map once it exists."""
    opts = TrackingOptions()
    feats = _sideways_clip(first_frame_tracks=300, frames=40, step_m=0.015, dying=(260, 8))
    result = track_episode(feats, CAM, opts)
    tracking = result.state == int(TrackingState.TRACKING)
    assert tracking[:8].all() and tracking.mean() > 0.9
    centres = result.world_from_cam[tracking][:, :3, 3]
    truth = 0.015 * np.flatnonzero(tracking)
    scale = np.dot(centres[:, 0] - centres[0, 0], truth - truth[0]) / np.dot(
        truth - truth[0], truth - truth[0]
    )
    assert np.abs(centres[:, 0] - centres[0, 0] - scale * (truth - truth[0])).max() < 0.02 * scale * truth[-1]
