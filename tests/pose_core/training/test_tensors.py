"""Training tensors against ground truth from pose_core.synth and hand-checkable cases."""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.geometry.rigid3 import so3_exp
from pose_core.training import (
    TensorOptions,
    action_from_state,
    aggregate_stats,
    episode_tensors,
    feature_stats,
    hand_feature_spec,
    nearest_source,
    rot6d_from_matrix,
    uniform_times,
)


class TestUniformTimes:
    def test_covers_the_span_at_the_rate(self):
        ts = np.array([0.0, 0.033, 0.071, 0.1, 0.5])
        np.testing.assert_allclose(uniform_times(ts, 10), np.arange(6) / 10)

    def test_offset_start(self):
        assert len(uniform_times(np.array([3.0, 4.0]), 30)) == 31

    def test_exception(self):
        with pytest.raises(ShapeError):
            uniform_times(np.zeros(0), 30)


class TestNearestSource:
    def test_variable_rate(self):
        ts = np.array([10.0, 10.05, 10.2, 10.21, 10.4])
        np.testing.assert_array_equal(
            nearest_source(ts, np.array([0.0, 0.1, 0.2, 0.3, 0.4])), [0, 1, 2, 3, 4]
        )

    def test_tie_takes_the_earlier_frame(self):
        np.testing.assert_array_equal(nearest_source(np.array([0.0, 0.2]), np.array([0.1])), [0])

    def test_upsampling_holds_frames(self):
        ts = np.arange(5) / 10
        np.testing.assert_array_equal(nearest_source(ts, uniform_times(ts, 20)), [0, 0, 1, 1, 2, 2, 3, 3, 4])


class TestRot6d:
    def test_recovers_the_rotation(self):
        rng = np.random.default_rng(0)
        rotation = so3_exp(rng.normal(size=(50, 3)))
        r6 = rot6d_from_matrix(rotation)
        x, y = r6[:, :3], r6[:, 3:]
        np.testing.assert_allclose(np.stack([x, y, np.cross(x, y)], axis=-1), rotation, atol=1e-12)

    def test_exception(self):
        with pytest.raises(ShapeError):
            rot6d_from_matrix(np.eye(4))


class TestActionFromState:
    def test_next_and_delta_with_validity(self):
        state = np.array([[1.0], [2.0], [0.0], [4.0]])
        present = np.array([[True], [True], [False], [True]])
        nxt, ok = action_from_state(state, present, "next")
        np.testing.assert_array_equal(ok[:, 0], [True, False, False, True])
        np.testing.assert_array_equal(nxt[:, 0], [2.0, 0.0, 0.0, 4.0])
        delta, _ = action_from_state(state, present, "delta")
        np.testing.assert_array_equal(delta[:, 0], [1.0, 0.0, 0.0, 0.0])


@pytest.fixture(scope="module")
def episode():
    """A 20-frame synthetic episode: ground-truth hands and camera poses."""
    from pose_core.synth import SynthOptions, generate_episode

    return generate_episode(SynthOptions(num_frames=20))


class TestEpisodeTensors:
    def test_matches_ground_truth_with_masks(self, episode):
        f = len(episode.ts_s)
        kp = np.array(episode.hands_world, dtype=np.float64)
        kp[5, 0] = np.nan  # left hand missing in frame 5
        poses = np.array(episode.world_from_cam, dtype=np.float64)
        poses[7] = np.nan  # no camera pose in frame 7
        out = episode_tensors(np.arange(f) + 100, episode.ts_s, kp, poses, 2.0, TensorOptions(fps=30))
        state = out.arrays["observation.state"].reshape(f, 2, 10)
        present = out.arrays["observation.present"]
        assert present[5, 0] == 0 and not state[5, 0].any() and present[5, 1] == 1
        assert present[7, 2] == 0 and not out.arrays["observation.camera_pose"][7].any()
        ok = np.ones(f, bool)
        ok[5] = False
        np.testing.assert_allclose(state[ok, 0, :3], kp[ok, 0, 0], atol=1e-6)
        np.testing.assert_allclose(
            out.arrays["observation.camera_pose"][0, :3], 2.0 * poses[0, :3, 3], atol=1e-5
        )
        np.testing.assert_array_equal(out.arrays["source_frame_idx"][:, 0], np.arange(f) + 100)
        assert out.arrays["action_valid"][4, 0] == 0 and out.arrays["action_valid"][3, 0] == 1

    def test_feature_spec_matches_arrays(self, episode):
        f = len(episode.ts_s)
        opts = TensorOptions(fps=10, include_keypoints=True)
        out = episode_tensors(
            np.arange(f),
            episode.ts_s,
            np.asarray(episode.hands_world, np.float64),
            np.asarray(episode.world_from_cam, np.float64),
            1.0,
            opts,
        )
        spec = hand_feature_spec(("wearer_left", "wearer_right"), (240, 320), True, ())
        for feat in spec.features:
            assert out.arrays[feat.name].shape[1:] == feat.shape, feat.name
            assert feat.names is None or len(feat.names) == feat.shape[0]

    def test_exception(self):
        with pytest.raises(ShapeError):
            episode_tensors(
                np.arange(3),
                np.arange(3) / 30,
                np.zeros((3, 2, 20, 3)),
                np.zeros((3, 4, 4)),
                1.0,
                TensorOptions(),
            )


class TestStats:
    def test_masked_stats_and_aggregation_equal_pooled(self):
        rng = np.random.default_rng(1)
        a, b = rng.normal(size=(30, 2)), rng.normal(3.0, 2.0, size=(50, 2))
        va, vb = rng.random((30, 2)) > 0.3, rng.random((50, 2)) > 0.3
        agg = aggregate_stats([feature_stats(a, va), feature_stats(b, vb)])
        for d in range(2):
            pooled = np.concatenate([a[va[:, d], d], b[vb[:, d], d]])
            assert agg["mean"][d] == pytest.approx(pooled.mean())
            assert agg["std"][d] == pytest.approx(pooled.std())
            assert agg["min"][d] == pooled.min() and agg["max"][d] == pooled.max()
        assert agg["count"].tolist() == [80]

    def test_dimension_valid_nowhere_is_zero(self):
        stats, weights = feature_stats(np.ones((4, 2)), np.array([[True, False]] * 4))
        assert weights.tolist() == [4, 0] and stats["mean"].tolist() == [1.0, 0.0]

    @pytest.mark.parametrize("shape", [(1, 5, 7, 3), (4, 300, 200, 3)])
    def test_image_stats_from_histograms_equal_the_pixel_statistics(self, shape):
        from pose_core.training.stats import image_stats

        frames = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
        frames[..., 1] //= 3  # channels with different ranges
        stats, weights = image_stats(frames)
        step = max(1, max(shape[1:3]) // 150)
        pixels = frames[:, ::step, ::step].reshape(-1, 3).astype(np.float64) / 255.0
        expected, _ = feature_stats(pixels)  # np.quantile & co. on every sampled pixel
        for key in ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99"):
            np.testing.assert_allclose(stats[key].ravel(), expected[key], atol=1e-12, err_msg=key)
        assert stats["mean"].shape == (3, 1, 1) and stats["count"].tolist() == [shape[0]]
        assert weights.shape == (3, 1, 1) and (weights == shape[0]).all()
