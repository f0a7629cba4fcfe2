"""Relocalisation: appearance matching + PnP on synthetic points, and a real handheld clip with a blackout."""

import glob

import cv2
import numpy as np
import pytest

from pose_core.camera_poses.completion import bundle_adjust_keyframes, complete_poses
from pose_core.camera_poses.evaluation import evaluate_trajectory
from pose_core.camera_poses.features import FrameFeatures, extract_features
from pose_core.camera_poses.relocalisation import PlaceOptions, localise, match_by_projection
from pose_core.camera_poses.tracking import TrackingState, track_episode
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import nearest_rotation, so3_exp
from tests.data_paths import SHARED_DATA

SEVEN = str(SHARED_DATA / "sevenscenes_redkitchen_seq01_a")
FOCAL = 500.0


def _scene(seed=0, n=300):
    """Points, their descriptors, a camera pose and the normalised image of the points."""
    rng = np.random.default_rng(seed)
    points = rng.uniform([-2, -1.5, 3], [2, 1.5, 8], (n, 3))
    desc = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    cfw = np.eye(4)
    cfw[:3, :3], cfw[:3, 3] = so3_exp(np.array([0.05, -0.1, 0.02])), [0.3, -0.1, 0.2]
    x_in_cam = points @ cfw[:3, :3].T + cfw[:3, 3]
    return points, desc, cfw, x_in_cam[:, :2] / x_in_cam[:, 2:], rng


def _flip_bits(desc, bits, rng):
    out = desc.copy()
    for row in out:
        for b in rng.choice(256, bits, replace=False):
            row[b // 8] ^= np.uint8(1 << (b % 8))
    return out


def test_localise_recovers_the_pose_among_wrong_candidates():
    points, desc, cfw, xy, rng = _scene()
    seen = rng.choice(len(points), 120, replace=False)
    query_xy = xy[seen] + rng.normal(0, 0.5 / FOCAL, (120, 2))
    query_desc = _flip_bits(desc[seen], 20, rng)  # the same places, 20 of 256 bits changed
    # the frame also has 80 tracks of places the map does not have
    query_xy = np.concatenate([query_xy, rng.uniform(-0.5, 0.5, (80, 2))])
    query_desc = np.concatenate([query_desc, rng.integers(0, 256, (80, 32), dtype=np.uint8)])
    loc = localise(query_xy, query_desc, points, desc, FOCAL, PlaceOptions())
    assert loc is not None
    np.testing.assert_allclose(loc.cam_from_world, cfw, atol=5e-3)  # 0.5 px noise
    assert len(loc.point_idx) >= 100 and np.all(loc.query_idx < 120)
    np.testing.assert_array_equal(loc.point_idx, seen[loc.query_idx])


def test_localise_refuses_a_place_it_does_not_know():
    points, desc, _, _, rng = _scene()
    query_xy = rng.uniform(-0.5, 0.5, (200, 2))
    query_desc = rng.integers(0, 256, (200, 32), dtype=np.uint8)
    assert localise(query_xy, query_desc, points, desc, FOCAL, PlaceOptions()) is None


def test_matching_by_projection_uses_the_predicted_pose():
    points, desc, cfw, xy, rng = _scene(seed=1)
    predicted = cfw.copy()
    predicted[:3, 3] += [0.01, 0.0, 0.0]  # a prediction a few pixels off
    # repeated texture: every place has a twin elsewhere with the same descriptor
    twins = points + rng.uniform(0.5, 1.0, points.shape)
    all_points, all_desc = np.concatenate([points, twins]), np.concatenate([desc, desc])
    qi, pi = match_by_projection(xy, _flip_bits(desc, 10, rng), all_points, all_desc, predicted,
                                 15.0 / FOCAL, PlaceOptions())
    assert len(qi) > 0.9 * len(points)
    np.testing.assert_array_equal(pi, qi)  # the twin far from the projection is never taken


@pytest.fixture(scope="module")
def seven_scenes():
    paths = sorted(glob.glob(f"{SEVEN}/frame-*.color.jpg"))[:200]
    feats = list(extract_features([cv2.imread(p, cv2.IMREAD_GRAYSCALE) for p in paths]))
    gt = np.stack([np.loadtxt(p.replace("color.jpg", "pose.txt")) for p in paths])
    gt[:, :3, :3] = nearest_rotation(gt[:, :3, :3])  # the files hold 8 digits
    return feats, gt, Camera(640, 480, 585.0, 585.0, 320.0, 240.0)


def _run(feats, cam):
    tracked = track_episode(feats, cam)
    bundle_adjust_keyframes(tracked, cam)
    return tracked, complete_poses(tracked, feats, cam)


@pytest.mark.slow
def test_blackout_relocalises_in_the_same_world(seven_scenes):
    """Real handheld kitchen: frames 100-109 see nothing, then every track is new; frame 110 (descriptors)
    finds the map by appearance and the episode stays one world frame."""
    feats, gt, cam = seven_scenes
    dark = [FrameFeatures(i, np.zeros(0, np.int64), np.zeros((0, 2), np.float32)) for i in range(100, 110)]
    blacked = feats[:100] + dark + [f.with_track_ids(f.track_ids + 10**7) for f in feats[110:]]
    tracked, done = _run(blacked, cam)
    assert (tracked.state[100:110] == TrackingState.LOST).all()
    assert tracked.relocalisations == 1 and (tracked.state[110:] == TrackingState.TRACKING).all()
    assert (tracked.segment_id == 0).all() and np.isfinite(done.world_from_cam).all()
    ate = evaluate_trajectory(done.world_from_cam, gt).ate_pct_of_path
    reference = evaluate_trajectory(_run(feats, cam)[1].world_from_cam, gt).ate_pct_of_path
    assert ate <= max(1.3 * reference, 2.0), (ate, reference)
