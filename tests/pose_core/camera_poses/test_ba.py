import numpy as np
import pytest

from pose_core.camera_poses.ba import BAOptions, BAProblem, bundle_adjust, optimize_pose
from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import so3_exp

FOCAL_PX = 500.0


def _scene(seed=0, n_cam=8, n_pt=400, noise_px=0.5, outlier_frac=0.05, rot_std=0.05):
    rng = np.random.default_rng(seed)
    pts = rng.uniform([-4, -3, 6], [4, 3, 15], (n_pt, 3))
    rot = so3_exp(rng.normal(size=(n_cam, 3)) * rot_std)
    centres = np.column_stack(
        [np.linspace(0, 3, n_cam), 0.2 * np.sin(np.arange(n_cam)), np.linspace(0, 1, n_cam)])
    trans = -np.einsum("cij,cj->ci", rot, centres)
    cam_idx = np.repeat(np.arange(n_cam), n_pt)
    pt_idx = np.tile(np.arange(n_pt), n_cam)
    keep = rng.random(len(cam_idx)) < 0.7
    cam_idx, pt_idx = cam_idx[keep], pt_idx[keep]
    x_in_cam = np.einsum("mij,mj->mi", rot[cam_idx], pts[pt_idx]) + trans[cam_idx]
    xy = x_in_cam[:, :2] / x_in_cam[:, 2:] + rng.normal(size=(len(cam_idx), 2)) * noise_px / FOCAL_PX
    outlier = rng.random(len(cam_idx)) < outlier_frac
    xy[outlier] += rng.normal(size=(outlier.sum(), 2)) * 30 / FOCAL_PX
    return rng, rot, trans, pts, cam_idx, pt_idx, xy, outlier


def _perturbed_problem(seed=0, prior_ratio=1.0, **scene):
    """A perturbed start; observations normalised with the focal ``prior_ratio * FOCAL_PX``.

    The focal is refined when ``prior_ratio != 1``.
    """
    rng, rot, trans, pts, cam_idx, pt_idx, xy, outlier = _scene(seed, **scene)
    fixed = np.zeros((len(rot), 6), bool)
    fixed[0] = True
    fixed[1, 3] = True  # scale gauge: x translation of the second camera
    rot0 = so3_exp(rng.normal(size=(len(rot), 3)) * 0.01) @ rot
    trans0 = trans + rng.normal(size=trans.shape) * 0.05
    rot0[0], trans0[0], trans0[1, 0] = rot[0], trans[0], trans[1, 0]
    pts0 = pts + rng.normal(size=pts.shape) * 0.2
    focal0 = prior_ratio * FOCAL_PX
    prob = BAProblem(rot0, trans0, pts0, cam_idx, pt_idx, xy / prior_ratio, fixed, focal0, prior_ratio != 1.0)
    return prob, rot, trans, pts, outlier


def prior_focal_problem(prior_ratio, seed=0, rot_std=0.05):
    """12 cameras, no outliers, a focal ``prior_ratio`` times the truth; the problem and true centres."""
    prob, rot, trans, *_ = _perturbed_problem(seed, prior_ratio, n_cam=12, outlier_frac=0.0, rot_std=rot_std)
    return prob, -np.einsum("cji,cj->ci", rot, trans)


class TestBundleAdjust:
    @pytest.mark.parametrize("loss", ["huber", "cauchy"])
    def test_recovers_scene(self, loss):
        prob, rot, trans, pts, outlier = _perturbed_problem()
        res = bundle_adjust(prob, BAOptions(loss=loss, max_iterations=30))
        assert res.converged
        assert res.cost < 0.2 * res.initial_cost  # the rest is the 5 % of 30 px outliers
        # inliers end near the noise level (0.5 px per axis -> 0.71 px RMS norm); Huber keeps some
        # pull from the 30 px outliers, Cauchy almost none
        rms_limit = {"huber": 0.9, "cauchy": 0.75}[loss]
        assert np.sqrt(np.mean(res.residual_px[~outlier] ** 2)) < rms_limit
        np.testing.assert_allclose(res.rotation[0], rot[0], atol=1e-12)
        assert res.translation[1, 0] == pytest.approx(trans[1, 0], abs=1e-12)
        # monocular gauge: the scale is pinned by one noisy coordinate, so compare after fitting a
        # scale about the fixed first camera centre
        centres = -np.einsum("cji,cj->ci", res.rotation, res.translation)
        true_centres = -np.einsum("cji,cj->ci", rot, trans)
        est = np.concatenate([centres, res.points]) - true_centres[0]
        ref = np.concatenate([true_centres, pts]) - true_centres[0]
        scale = np.sum(est * ref) / np.sum(est * est)
        assert abs(scale - 1) < 0.05
        assert np.abs(scale * est[: len(rot)] - ref[: len(rot)]).max() < 0.03
        assert np.median(np.linalg.norm(scale * est[len(rot):] - ref[len(rot):], axis=1)) < 0.05

    def test_does_not_modify_input(self):
        prob, *_ = _perturbed_problem(1)
        before = prob.points.copy()
        bundle_adjust(prob, BAOptions(max_iterations=3))
        np.testing.assert_array_equal(prob.points, before)

    def test_exception(self):
        prob, *_ = _perturbed_problem()
        prob.xy = prob.xy[:-1]
        with pytest.raises(ShapeError):
            bundle_adjust(prob)


def test_optimize_pose_with_outliers():
    rng, rot, trans, pts, cam_idx, pt_idx, xy, outlier = _scene(2, outlier_frac=0.2)
    sel = cam_idx == 3
    truth = np.eye(4)
    truth[:3, :3], truth[:3, 3] = rot[3], trans[3]
    start = truth.copy()
    start[:3, :3] = so3_exp(np.array([0.02, -0.01, 0.015])) @ rot[3]
    start[:3, 3] += [0.1, -0.05, 0.2]
    fit = optimize_pose(start, pts[pt_idx[sel]], xy[sel], FOCAL_PX)
    assert np.abs(fit.cam_from_world - truth).max() < 1e-2
    assert fit.rms_px < 1.0
    # the inlier mask finds the injected outliers it can see (30 px sigma: nearly all exceed 3 px)
    assert np.mean(~fit.inliers[outlier[sel]]) > 0.9


@pytest.mark.parametrize("path", [
    {"dense_max_entries": 0},  # observation pairs, dense solve
    {"dense_max_entries": 0, "dense_max_cameras": 0},  # observation pairs, sparse solve
    {"dense_max_entries": 0, "dense_max_cameras": 0, "pair_chunk": 1000},  # ... in small chunks
])
def test_reduced_system_paths_agree(path):
    """The pair-based (dense or sparse) reduced system gives the dense product's answer."""
    prob, *_ = _perturbed_problem(3)
    ref = bundle_adjust(prob, BAOptions(max_iterations=8))
    res = bundle_adjust(prob, BAOptions(max_iterations=8, **path))
    assert res.iterations == ref.iterations and res.cost < 0.2 * res.initial_cost
    assert res.cost == pytest.approx(ref.cost, rel=1e-8)
    np.testing.assert_allclose(res.points, ref.points, atol=1e-7)
    np.testing.assert_allclose(res.translation, ref.translation, atol=1e-9)
