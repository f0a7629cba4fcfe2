"""Maps of one episode: similarity fits, map merging, loop correction, the pose graph, FirstSeen."""

import numpy as np
import pytest

from pose_core.camera_poses.joining import JoinOptions, fit_sim3, similarity_from_views
from pose_core.camera_poses.keyframe_map import MERGED, Atlas, FirstSeen, FrameRow, Keyframe
from pose_core.camera_poses.loop_closing import LoopOptions, PlaceMatch, apply_place_match
from pose_core.camera_poses.pose_graph import optimise_sim3_graph, rigid_from_sim3
from pose_core.camera_poses.relocalisation import Localisation
from pose_core.geometry.rigid3 import invert_rigid_matrices, so3_exp, so3_log
from pose_core.geometry.sim3 import (
    cam_from_world_after_sim3,
    sim3_from_parts,
    sim3_inverse,
    sim3_parts,
    transform_points,
)


def project(cam_from_world, x_in_world):
    """Normalised image coordinates ``(N, 2)`` of world points."""
    x_in_cam = x_in_world @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
    return x_in_cam[:, :2] / x_in_cam[:, 2:]


TRUE_SIM = sim3_from_parts(2.5, so3_exp(np.array([0.1, -0.3, 0.2])), np.array([1.0, -2.0, 0.5]))


def _cfw(rotvec, t):
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = so3_exp(np.asarray(rotvec, float)), t
    return m


def test_fit_sim3_recovers_similarity_despite_outliers():
    rng = np.random.default_rng(0)
    src = rng.uniform([-3, -2, 4], [3, 2, 12], (40, 3))
    dst = transform_points(TRUE_SIM, src)
    dst[:4] += rng.normal(size=(4, 3))  # four wrong pairs
    sim, keep = fit_sim3(src, dst, JoinOptions())
    np.testing.assert_allclose(sim, TRUE_SIM, atol=1e-9)
    assert not keep[:4].any() and keep[4:].all()
    assert fit_sim3(src[:10], dst[:10], JoinOptions(min_shared_points=15)) is None


def test_a_scale_jump_is_measured_even_where_few_depths_are_well_determined():
    """A loop over a bridge (or another map) may change the scale 5x; with fewer than min_shared_points
    well-triangulated pairs the agreeing pairs still measure it, where a drift-only loop keeps scale 1."""
    rng = np.random.default_rng(2)
    x_dst = rng.uniform([-1, -1, 3], [1, 1, 6], (30, 3))  # the frame sees them; its pose is the identity
    x_src = x_dst / 5.0 * rng.normal(1.0, 0.02, (30, 1))  # the current map: 5x smaller, noisy depths
    well = np.arange(30) < 10  # too few (< 15) seen with enough parallax
    cfw = np.eye(4)
    jump, keep = similarity_from_views(cfw, cfw, x_src, x_dst, JoinOptions(), well, scale_may_jump=True)
    assert keep.all() and sim3_parts(jump)[0] == pytest.approx(5.0, rel=0.02)
    drift, _ = similarity_from_views(cfw, cfw, x_src, x_dst, JoinOptions(), well)
    assert sim3_parts(drift)[0] == pytest.approx(1.0)


def test_rigid_pose_after_sim3_sees_the_same_image():
    rng = np.random.default_rng(1)
    x_in_a = rng.uniform([-1, -1, 3], [1, 1, 6], (20, 3))
    cfw_a = _cfw([0.05, 0.1, -0.02], [0.2, 0.0, 0.1])
    cfw_b = cam_from_world_after_sim3(cfw_a, TRUE_SIM)
    np.testing.assert_allclose(cfw_b[:3, :3] @ cfw_b[:3, :3].T, np.eye(3), atol=1e-12)  # still rigid
    np.testing.assert_allclose(
        project(cfw_b, transform_points(TRUE_SIM, x_in_a)), project(cfw_a, x_in_a), atol=1e-12
    )
    np.testing.assert_allclose(sim3_inverse(TRUE_SIM) @ TRUE_SIM, np.eye(4), atol=1e-12)


def _atlas_with_two_maps():
    """Map 0 in the true frame, map 1 in a frame x_1 = S^-1 x_0, both seeing 30 shared places."""
    rng = np.random.default_rng(2)
    truth = rng.uniform([-2, -1, 4], [2, 1, 8], (60, 3))
    atlas = Atlas.empty()
    pts = atlas.points
    old = pts.add(truth[:40], np.arange(40), 0, 0)
    new = pts.add(transform_points(sim3_inverse(TRUE_SIM), truth[10:60]), np.arange(100, 150), 1, 2)
    cams = [_cfw([0, 0.02 * i, 0], [-0.3 * i, 0, 0]) for i in range(4)]
    for i, c in enumerate(cams):
        seg, idx = (0, old) if i < 2 else (1, new)
        cfw = c if seg == 0 else cam_from_world_after_sim3(c, sim3_inverse(TRUE_SIM))
        atlas.keyframes.append(Keyframe(i, cfw, idx, project(cfw, pts.points[idx])))
        atlas.keyframe_segment.append(seg)
        atlas.rows.append(FrameRow(cfw, 2, seg, True, len(idx), 0.0))
    return atlas, truth, cams, old, new


def test_place_match_joins_the_younger_map_into_the_older():
    atlas, truth, cams, old, new = _atlas_with_two_maps()
    shared_new, shared_old = new[:30], old[10:40]  # truth[10:40] in both maps
    loc = Localisation(np.eye(4), np.arange(30), shared_old, 30, 0.0)
    match = PlaceMatch(0, loc, shared_new, shared_old, TRUE_SIM, 30)
    done = apply_place_match(atlas, match, segment=1, frame_idx=3, opts=LoopOptions())
    assert (done.segment, done.joined_to, done.inliers) == (1, 0, 30)
    assert done.scale == pytest.approx(2.5)
    assert atlas.keyframe_segment == [0, 0, 0, 0] and all(r.segment == 0 for r in atlas.rows)
    for kf, truth_cfw in zip(atlas.keyframes, cams, strict=True):
        np.testing.assert_allclose(kf.cam_from_world, truth_cfw, atol=1e-9)
    assert (atlas.points.segment[shared_new] == MERGED).all()
    np.testing.assert_allclose(atlas.points.points[new[30:]], truth[40:], atol=1e-9)
    # keyframes of the moved map now observe the kept points, and the merged tracks find them
    assert set(atlas.keyframes[3].point_idx) == set(shared_old) | set(new[30:])
    np.testing.assert_array_equal(atlas.points.lookup(np.arange(100, 130), 0), shared_old)


def _drifted_ring(n: int = 24):
    """A camera circles a ring of points; its map drifted (rotation, scale) by the time it returns.

    Returns the atlas (one keyframe per ring position), the true camera centres, and the loop's place
    match (the last keyframe's points of keyframe 0's places against keyframe 0's own).
    """
    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    centres = np.column_stack([3 * np.cos(angles), 3 * np.sin(angles), np.zeros(n)])
    truth_cfw = []
    for a, c in zip(angles, centres, strict=True):
        wfc = np.eye(4)  # looking outwards
        z, x = np.array([np.cos(a), np.sin(a), 0.0]), np.array([-np.sin(a), np.cos(a), 0.0])
        wfc[:3, :3], wfc[:3, 3] = np.column_stack([x, np.cross(z, x), z]), c
        truth_cfw.append(invert_rigid_matrices(wfc))
    rng = np.random.default_rng(3)
    # drift grows along the loop: keyframe i's world is off by a similarity growing with i
    drift = [
        sim3_from_parts(1.0 + 0.004 * i, so3_exp(np.array([0, 0, 0.004 * i])), np.array([0.01 * i, 0, 0]))
        for i in range(n)
    ]
    atlas = Atlas.empty()
    for i in range(n):
        points_true = (
            centres[i] + 8 * (invert_rigid_matrices(truth_cfw[i])[:3, 2]) + rng.normal(0, 0.5, (30, 3))
        )
        idx = atlas.points.add(transform_points(drift[i], points_true), np.arange(30 * i, 30 * i + 30), 0, i)
        cfw = cam_from_world_after_sim3(truth_cfw[i], drift[i])
        atlas.keyframes.append(Keyframe(i, cfw, idx, project(cfw, atlas.points.points[idx])))
        atlas.keyframe_segment.append(0)
        atlas.rows.append(FrameRow(cfw, 2, 0, True, 30, 0.0))
    again = atlas.points.add(
        transform_points(drift[-1], atlas.points.points[:30]), np.arange(900, 930), 0, n - 1
    )
    atlas.keyframes[-1].point_idx = np.concatenate([atlas.keyframes[-1].point_idx, again])
    atlas.keyframes[-1].xy = project(
        atlas.keyframes[-1].cam_from_world, atlas.points.points[atlas.keyframes[-1].point_idx]
    )
    sim, _ = fit_sim3(atlas.points.points[again], atlas.points.points[:30], JoinOptions())
    loc = Localisation(np.eye(4), np.arange(30), np.arange(30), 30, 0.0)
    return atlas, centres, PlaceMatch(0, loc, again, np.arange(30), sim, 30)


def _centre_errors(atlas: Atlas, centres: np.ndarray) -> np.ndarray:
    return np.array([
        np.linalg.norm(invert_rigid_matrices(k.cam_from_world)[:3, 3] - c)
        for k, c in zip(atlas.keyframes, centres, strict=True)
    ])  # fmt: skip


def test_loop_correction_spreads_the_drift_over_the_loop():
    atlas, centres, match = _drifted_ring()
    before = _centre_errors(atlas, centres)
    done = apply_place_match(atlas, match, 0, len(centres) - 1, LoopOptions())
    assert done is not None and done.joined_to == done.segment == 0
    after = _centre_errors(atlas, centres)
    assert before[-1] > 0.2 and after[-1] < 0.02  # the loop's end is back where it belongs
    assert max(after) < 0.5 * max(before)  # and the path between was straightened, not torn
    assert (atlas.points.segment[match.current_idx] == MERGED).all()
    assert atlas.loop_anchors == {0: len(centres) - 1}  # a later loop holds what this one placed


def test_a_later_loop_holds_what_the_last_correction_placed_but_frees_the_newest_keyframes():
    """A map corrected for a loop at keyframe 21 of 24 recognises the first keyframe's place again: the
    keyframes up to the last correction stay, but at least the newest `max_corrected_keyframes` (8) move,
    and the loop's end is still brought back."""
    atlas, centres, match = _drifted_ring()
    atlas.loop_anchors[0] = 21
    poses_before = np.stack([k.cam_from_world for k in atlas.keyframes])
    before = _centre_errors(atlas, centres)
    apply_place_match(atlas, match, 0, len(centres) - 1, LoopOptions(max_corrected_keyframes=8))
    poses_after = np.stack([k.cam_from_world for k in atlas.keyframes])
    held = len(centres) - 1 - 8
    np.testing.assert_allclose(poses_after[: held + 1], poses_before[: held + 1], atol=1e-12)
    assert np.all(np.abs(poses_after[held + 1 :] - poses_before[held + 1 :]).max(axis=(1, 2)) > 1e-3)
    after = _centre_errors(atlas, centres)
    assert before[-1] > 0.2 and after[-1] < 0.2 * before[-1]  # 23 keyframes' drift taken up by 8
    assert atlas.loop_anchors[0] == len(centres) - 1


def test_pose_graph_distributes_a_loop_edge():
    # four keyframes on a line, odometry says 1 m steps, the loop edge says the last is 3.3 m from the first
    cfw = np.stack([_cfw([0, 0, 0], [-float(i), 0, 0]) for i in range(4)])
    src, dst = np.array([0, 1, 2, 0]), np.array([1, 2, 3, 3])
    measured = cfw[dst] @ invert_rigid_matrices(cfw[src])
    measured[3] = _cfw([0, 0, 0], [-3.3, 0, 0])
    fixed = np.array([True, False, False, False])
    out, scales = rigid_from_sim3(optimise_sim3_graph(cfw, src, dst, measured, fixed))
    xs = invert_rigid_matrices(out)[:, 0, 3]
    assert xs[0] == pytest.approx(0.0) and 3.0 < xs[3] < 3.3
    assert np.all(np.diff(xs) > 0.95)  # the extra 0.3 m is shared out along the chain
    assert np.abs(so3_log(out[:, :3, :3])).max() < 1e-6
    assert sim3_parts(sim3_from_parts(2.0, np.eye(3), np.zeros(3)))[0] == pytest.approx(2.0)


def test_first_seen_keeps_first_sighting_and_forgets_dead_tracks():
    seen = FirstSeen()
    seen.update(0, np.array([5, 2]), np.array([[0.5, 0.5], [0.2, 0.2]]))
    seen.update(1, np.array([2, 9]), np.array([[0.3, 0.3], [0.9, 0.9]]))
    kf, xy = seen.lookup(np.array([2, 9, 5]))
    np.testing.assert_array_equal(kf, [0, 1, -1])  # track 5 died at keyframe 1
    np.testing.assert_allclose(xy[:2], [[0.2, 0.2], [0.9, 0.9]])


def test_a_point_merged_twice_leaves_no_keyframe_or_track_on_a_merged_point():
    """Merges only visit the keyframes from a point's oldest observer on; a point that took over an older
    map's observers (a join) and is merged again later (a loop) must still reach them."""
    atlas = Atlas.empty()
    pts = atlas.points
    a = pts.add(np.zeros((1, 3)), np.array([10]), 0, ref_keyframe=0)  # seen by keyframes 0 and 1
    b = pts.add(np.ones((1, 3)), np.array([20]), 0, ref_keyframe=2)  # seen by keyframes 2 and 3
    c = pts.add(np.full((1, 3), 2.0), np.array([30]), 0, ref_keyframe=4)  # seen by keyframe 4
    for i, idx in enumerate([a, a, b, b, c]):
        atlas.keyframes.append(Keyframe(i, np.eye(4), idx.copy(), np.zeros((1, 2))))
        atlas.keyframe_segment.append(0)
    pts.alias(np.array([11]), a)  # a relocalised track sees point a
    atlas.merge_points(a, b)  # keyframes 0 and 1 now see b, made at keyframe 2
    atlas.merge_points(b, c)
    assert [int(kf.point_idx[0]) for kf in atlas.keyframes] == [int(c[0])] * 5
    np.testing.assert_array_equal(pts.lookup(np.array([10, 11, 20, 30]), 0), [c[0]] * 4)
    assert pts.aliases == {10: int(c[0]), 11: int(c[0]), 20: int(c[0])}
