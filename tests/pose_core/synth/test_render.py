"""Rendering and the episode: projections, depth against analytic planes, occlusion, stereo, corners."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest

from pose_core.synth import SynthOptions, generate_episode
from pose_core.synth.render import ARM_SURFACE_IDS, HAND_SURFACE_IDS, NO_SURFACE

N_FRAMES = 600  # ground truth for 20 s; only a few frames are rendered


@pytest.fixture(scope="module")
def episode():
    return generate_episode(SynthOptions(num_frames=N_FRAMES, stereo=True, seed=0))


@pytest.fixture(scope="module")
def fast_turn_idx(episode):
    fwd = episode.world_from_cam[:, :3, 2]
    rate = np.abs(np.diff(np.unwrap(np.arctan2(fwd[:, 1], fwd[:, 0]))))
    return int(np.argmax(rate))


@pytest.fixture(scope="module")
def rendered(episode, fast_turn_idx):
    """A few frames: the first, the fastest head turn, and one where both hands are visible."""
    both = int(np.flatnonzero(episode.hand_visible.all(axis=1))[len(episode.hand_visible) // 10])
    idx = sorted({0, fast_turn_idx, both})
    return {i: next(episode.frames(i, i + 1)) for i in idx}


def _rays_in_world(episode, i, rows, cols):
    k_inv = np.linalg.inv(episode.K)
    pix = np.stack([cols, rows, np.ones_like(rows)], axis=1).astype(np.float64)
    return (k_inv @ pix.T).T @ episode.world_from_cam[i, :3, :3].T  # (N, 3), camera z = 1


class TestEpisode:
    def test_shapes_and_times(self, episode):
        f = N_FRAMES
        assert episode.world_from_cam.shape == (f, 4, 4)
        assert episode.hands_world.shape == (f, 2, 21, 3)
        assert episode.hands_px.shape == (f, 2, 21, 2)
        assert episode.hand_visible.shape == (f, 2) and episode.hand_visible.dtype == bool
        np.testing.assert_allclose(episode.ts_s, np.arange(f) / 30.0)
        np.testing.assert_allclose(episode.K, [[500, 0, 319.5], [0, 500, 239.5], [0, 0, 1]])

    def test_hands_px_is_the_projection_of_hands_world(self, episode):
        cam_from_world = np.linalg.inv(episode.world_from_cam)
        x_cam = (
            np.einsum("fij,fhkj->fhki", cam_from_world[:, :3, :3], episode.hands_world)
            + cam_from_world[:, None, None, :3, 3]
        )
        front = x_cam[..., 2] > 0
        uv = (x_cam @ episode.K.T)[..., :2] / x_cam[..., 2:3]
        assert front.mean() > 0.95
        np.testing.assert_allclose(episode.hands_px[front], uv[front], atol=1e-6)
        assert np.isnan(episode.hands_px[~front]).all()

    def test_hands_visible_often_but_not_always(self, episode):
        visible = episode.hand_visible.mean(axis=0)
        assert np.all((visible > 0.4) & (visible < 1.0)), visible

    def test_deterministic(self, episode):
        again = generate_episode(SynthOptions(num_frames=N_FRAMES, stereo=True, seed=0))
        np.testing.assert_array_equal(again.world_from_cam, episode.world_from_cam)
        np.testing.assert_array_equal(again.hands_world, episode.hands_world)
        other = generate_episode(SynthOptions(num_frames=N_FRAMES, seed=1))
        assert np.abs(other.world_from_cam - episode.world_from_cam).max() > 0.05

    def test_rejects_bad_options(self):
        with pytest.raises(ValueError, match="num_frames.*fps"):
            SynthOptions(num_frames=0, fps=-1.0)


class TestRender:
    def test_depth_equals_analytic_plane_distance(self, episode, rendered):
        rng = np.random.default_rng(0)
        rects = episode.renderer.scene.rects
        checked = 0
        for i, frame in rendered.items():
            rows, cols = np.nonzero(frame.surface_id >= 0)
            pick = rng.choice(len(rows), 2000, replace=False)
            rows, cols = rows[pick], cols[pick]
            ids = frame.surface_id[rows, cols]
            rays = _rays_in_world(episode, i, rows, cols)
            centre = episode.world_from_cam[i, :3, 3]
            normals = np.stack([rects[s].normal for s in ids])
            origins = np.stack([rects[s].origin for s in ids])
            depth = np.sum(normals * (origins - centre), axis=1) / np.sum(normals * rays, axis=1)
            np.testing.assert_allclose(frame.depth[rows, cols], depth, atol=1e-4, rtol=1e-5)
            # ... and the hit point lies on the rectangle the pixel claims.
            hit = centre + depth[:, None] * rays - origins
            a = np.sum(hit * np.stack([rects[s].axis_u for s in ids]), axis=1)
            b = np.sum(hit * np.stack([rects[s].axis_v for s in ids]), axis=1)
            size = np.array([rects[s].size_m for s in ids])
            assert np.all((a > -1e-4) & (a < size[:, 0] + 1e-4) & (b > -1e-4) & (b < size[:, 1] + 1e-4))
            checked += len(rows)
            assert not np.any(frame.surface_id == NO_SURFACE)  # the room is closed
        assert checked >= 4000

    def test_hands_occlude_the_scene_by_depth(self, episode, rendered):
        for i, frame in rendered.items():
            hand_px = np.isin(frame.surface_id, HAND_SURFACE_IDS)
            if not hand_px.any():
                continue
            wearer_px = hand_px | np.isin(frame.surface_id, ARM_SURFACE_IDS)
            bare = episode.renderer.render(episode.world_from_cam[i], None)
            assert np.all(frame.depth[wearer_px] < bare.depth[wearer_px])
            assert np.array_equal(frame.depth[~wearer_px], bare.depth[~wearer_px])
            # Hand pixels lie near the hand's keypoints: within the hand's depth range (+- 3 cm).
            z = (
                np.linalg.inv(episode.world_from_cam[i])
                @ np.concatenate([episode.hands_world[i].reshape(-1, 3), np.ones((42, 1))], axis=1).T
            )[2]
            assert frame.depth[hand_px].min() > z.min() - 0.03 and frame.depth[hand_px].max() < z.max() + 0.03

    def test_hands_drawn_where_keypoints_project(self, episode, rendered):
        for i, frame in rendered.items():
            for hand in (0, 1):
                if not episode.hand_visible[i, hand]:
                    continue
                uv = np.round(episode.hands_px[i, hand, 9]).astype(int)  # middle MCP, on the palm
                if 0 <= uv[0] < 640 and 0 <= uv[1] < 480:
                    patch = frame.surface_id[max(uv[1] - 2, 0) : uv[1] + 3, max(uv[0] - 2, 0) : uv[0] + 3]
                    assert np.any(patch == HAND_SURFACE_IDS[hand]), (i, hand)

    def test_solid_palm_and_arm_from_the_image_border(self, episode, rendered):
        """The palm is filled between wrist and knuckles, and the forearm reaches the image border."""
        for i, frame in rendered.items():
            for hand in (0, 1):
                px = episode.hands_px[i, hand]
                if not np.all((px >= 0) & (px < [640, 480])):
                    continue
                centre = np.round(px[[0, 5, 9, 13, 17]].mean(axis=0)).astype(int)
                assert frame.surface_id[centre[1], centre[0]] == HAND_SURFACE_IDS[hand], (i, hand)
                arm = frame.surface_id == ARM_SURFACE_IDS[hand]
                assert arm[-1].any() or arm[:, 0].any() or arm[:, -1].any(), (i, hand)

    def test_stereo_disparity(self, episode, rendered):
        """A left pixel at depth z reappears fx * B / z pixels to the left in the right image."""
        baseline, fx = episode.options.baseline_m, episode.K[0, 0]
        for frame in rendered.values():
            rows, cols = np.mgrid[20:460:37, 40:600:41]
            rows, cols = rows.ravel(), cols.ravel()
            z = frame.depth[rows, cols].astype(np.float64)
            u_right = cols - fx * baseline / z
            ok = (u_right > 1) & (frame.surface_id[rows, cols] >= 0)
            right = frame.depth_right[rows[ok], np.round(u_right[ok]).astype(int)]
            # The wearer's arms are near the camera: skip scene points they hide from the right camera.
            ok[ok] = right > z[ok] - 0.1
            z_right = frame.depth_right[rows[ok], np.round(u_right[ok]).astype(int)]
            # Same point seen from a camera displaced along x: same depth (allow edges/rounding).
            assert np.median(np.abs(z_right - z[ok])) < 2e-3
            assert np.mean(np.abs(z_right - z[ok]) < 0.02) > 0.95

    def test_enough_corners_for_tracking(self, rendered):
        orb = cv2.ORB_create(nfeatures=3000)
        fast = cv2.FastFeatureDetector_create(threshold=20)
        for frame in rendered.values():
            gray = cv2.cvtColor(frame.rgb, cv2.COLOR_RGB2GRAY)
            assert len(orb.detect(gray)) > 300
            assert len(fast.detect(gray)) > 300

    def test_output_types(self, rendered):
        frame = next(iter(rendered.values()))
        assert frame.rgb.shape == (480, 640, 3) and frame.rgb.dtype == np.uint8
        assert frame.depth.shape == (480, 640) and frame.depth.dtype == np.float32
        assert frame.rgb_right.shape == (480, 640, 3)
        assert 20 < frame.rgb.mean() < 235 and frame.rgb.std() > 20  # lit, textured, not saturated

    def test_render_time(self, episode):
        """Budget ~50 ms/frame on an idle core; the bound here is loose for a shared machine."""
        start = time.process_time()
        for i in range(0, 50, 10):
            episode.renderer.render(episode.world_from_cam[i], episode.hands_world[i])
        per_frame = (time.process_time() - start) / 5
        assert per_frame < 0.3, per_frame
