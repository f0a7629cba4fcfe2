import numpy as np
import pytest

from pose_core.camera_poses.joining import JoinOptions, join_segments
from pose_core.camera_poses.keyframe_map import FirstSeen, Keyframe
from pose_core.camera_poses.tracking import TrackingResult
from pose_core.geometry.rigid3 import invert_rigid_matrices, so3_exp

OLD_FROM_NEW_SCALE = 2.5


def _cfw(rotvec, t):
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = so3_exp(np.asarray(rotvec, float)), t
    return m


def _two_segments(n_shared=40, n_outliers=4, seed=0):
    """Segment 0 in the true frame; segment 1 in a frame x_new = R^T (x_old - t) / s, sharing tracks."""
    rng = np.random.default_rng(seed)
    rot, t, s = so3_exp(np.array([0.1, -0.3, 0.2])), np.array([1.0, -2.0, 0.5]), OLD_FROM_NEW_SCALE
    pts_old = rng.uniform([-3, -2, 4], [3, 2, 12], (n_shared + 10, 3))
    shared = pts_old[:n_shared]
    pts_new = (shared - t) @ rot / s  # row-wise R^T (x - t) / s
    pts_new[:n_outliers] += rng.normal(size=(n_outliers, 3))  # badly triangulated in the new segment
    cams_old = [_cfw([0, 0.02 * i, 0], [-0.5 * i, 0, 0]) for i in range(4)]
    cams_new = []
    for c in cams_old[2:]:
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = c[:3, :3] @ rot, (c[:3, :3] @ t + c[:3, 3]) / s
        cams_new.append(m)
    points = np.concatenate([pts_old, pts_new])
    track_id = np.concatenate([np.arange(len(pts_old)), np.arange(n_shared)])
    point_segment = np.repeat([0, 1], [len(pts_old), n_shared]).astype(np.int32)
    new_idx = np.arange(len(pts_old), len(points))
    n_old = len(pts_old)
    kfs = [Keyframe(i, c, np.arange(n_old), np.zeros((n_old, 2))) for i, c in enumerate(cams_old[:2])]
    kfs += [Keyframe(3 + i, c, new_idx, np.zeros((n_shared, 2))) for i, c in enumerate(cams_new)]
    frames_cfw = np.stack([cams_old[0], cams_old[1], np.full((4, 4), np.nan), cams_new[0], cams_new[1]])
    result = TrackingResult(
        world_from_cam=invert_rigid_matrices(frames_cfw), state=np.array([2, 2, 0, 2, 2], np.int8),
        segment_id=np.array([0, 0, 1, 1, 1], np.int32), is_keyframe=np.array([1, 1, 0, 1, 1], bool),
        num_inliers=np.zeros(5, np.int32), reproj_error_px=np.full(5, np.nan), points_in_world=points,
        point_track_id=track_id, point_segment=point_segment, keyframes=kfs)
    return result, cams_old, shared


def test_join_recovers_sim3_and_merges_points():
    result, cams_old, shared = _two_segments()
    (join,) = join_segments(result)
    assert join.segment == 1 and join.joined_to == 0
    assert join.shared_points == 40 and join.inliers == 36
    assert join.scale == pytest.approx(OLD_FROM_NEW_SCALE, rel=1e-9)
    np.testing.assert_array_equal(result.segment_id, 0)
    for kf, truth in zip(result.keyframes[2:], cams_old[2:], strict=True):
        np.testing.assert_allclose(kf.cam_from_world, truth, atol=1e-9)
        # observations now point at the old segment's points of the same tracks
        assert kf.point_idx.max() < 50
    np.testing.assert_allclose(invert_rigid_matrices(result.world_from_cam[[3, 4]]), cams_old[2:], atol=1e-9)
    assert np.isnan(result.world_from_cam[2, :3]).all()  # the lost frame stays without a pose
    assert (result.point_segment[50:] == -1).all()
    np.testing.assert_allclose(result.points_in_world[50 + 4:], shared[4:], atol=1e-9)


def test_too_few_shared_points_stays_labelled():
    result, *_ = _two_segments(n_shared=10, n_outliers=0)
    before = result.world_from_cam.copy()
    (join,) = join_segments(result, JoinOptions(min_shared_points=15))
    assert join.joined_to == 1 and np.isnan(join.scale)
    np.testing.assert_array_equal(result.segment_id, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(result.world_from_cam, before)


def test_first_seen_keeps_first_sighting_and_forgets_dead_tracks():
    seen = FirstSeen()
    seen.update(0, np.array([5, 2]), np.array([[0.5, 0.5], [0.2, 0.2]]))
    seen.update(1, np.array([2, 9]), np.array([[0.3, 0.3], [0.9, 0.9]]))
    kf, xy = seen.lookup(np.array([2, 9, 5]))
    np.testing.assert_array_equal(kf, [0, 1, -1])  # track 5 died at keyframe 1
    np.testing.assert_allclose(xy[:2], [[0.2, 0.2], [0.9, 0.9]])
