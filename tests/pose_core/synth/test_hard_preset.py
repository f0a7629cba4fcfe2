"""The `hard` synthetic sample of issue 14, checked from its ground truth.

Issue 14 asks for 20 s, head-turn peaks >= 180 deg/s, a walk of 2 m away from the table and back,
and hands covering up to 30 % of the frame. Everything here comes from the episode's ground truth
(no video is rendered), except three single frames rendered to check that the camera still sees the
textured room when it is away and that the coverage measure agrees with the rendered hands.

Coverage measure: `pose_core.synth.coverage.hand_coverage`, the projected silhouette of the hands
drawn from their keypoints (palm hull grown by the palm's half thickness, one 2-D capsule per finger
bone as wide as the bone's projected radius); forearms are not counted.
"""

from __future__ import annotations

import numpy as np
import pytest

from jobs.sample import SAMPLE_PRESETS, SampleOptions
from pose_core.synth import SynthOptions, generate_episode
from pose_core.synth.coverage import hand_coverage
from pose_core.synth.render import ARM_SURFACE_IDS, HAND_SURFACE_IDS, NO_SURFACE

PRESET = SAMPLE_PRESETS["hard"]


@pytest.fixture(scope="module")
def episode():
    return generate_episode(PRESET.synth_options())  # ground truth now; frames only when asked


@pytest.fixture(scope="module")
def coverage(episode):
    cam_from_world = np.linalg.inv(episode.world_from_cam)
    hands_in_cam = (
        np.einsum("fij,fhkj->fhki", cam_from_world[:, :3, :3], episode.hands_world)
        + cam_from_world[:, None, None, :3, 3]
    )
    o = episode.options
    return hand_coverage(hands_in_cam, episode.K, o.width, o.height, o.render)


def _render(episode, frame_idx):
    return next(episode.frames(frame_idx, frame_idx + 1))


def _table_distance_m(episode):
    """Horizontal distance of the camera centre from the table top's rectangle, metres, `(F,)`."""
    scene = episode.options.scene
    centre, half = np.asarray(scene.table_center_m[:2]), np.asarray(scene.table_size_m) / 2
    outside = np.maximum(np.abs(episode.world_from_cam[:, :2, 3] - centre) - half, 0.0)
    return np.linalg.norm(outside, axis=1)


class TestHardPreset:
    def test_twenty_seconds_at_640x480_with_a_fixed_seed(self, episode):
        assert (PRESET.frames, PRESET.fps, PRESET.seed, PRESET.stem) == (600, 30.0, 14, "synth_hard_014")
        assert episode.num_frames / episode.options.fps == pytest.approx(20.0)
        assert (episode.options.width, episode.options.height) == (640, 480)
        np.testing.assert_allclose(episode.K, [[500.0, 0.0, 319.5], [0.0, 500.0, 239.5], [0.0, 0.0, 1.0]])

    def test_head_turns_peak_above_180_deg_per_s(self, episode):
        fwd = episode.world_from_cam[:, :3, 2]
        heading = np.unwrap(np.arctan2(fwd[:, 1], fwd[:, 0]))
        yaw_rate = np.degrees(np.abs(np.diff(heading))) * episode.options.fps  # frame to frame
        assert yaw_rate.max() >= 195.0, yaw_rate.max()
        assert yaw_rate.max() <= 240.0  # a head, not a spinning camera
        # Several separate turns pass 180 deg/s, not one spike.
        fast = np.flatnonzero(yaw_rate >= 180.0)
        assert np.count_nonzero(np.diff(fast) > 5) + 1 >= 3, fast

    def test_walks_two_metres_away_from_the_table_and_back(self, episode):
        centre = episode.world_from_cam[:, :3, 3]
        from_start = np.linalg.norm(centre[:, :2] - centre[0, :2], axis=1)
        from_table = _table_distance_m(episode)
        far = int(np.argmax(from_start))
        assert from_start[far] >= 2.0 and from_table.max() >= 2.0, (from_start[far], from_table.max())
        assert from_table[0] <= 0.3 and from_table[-1] <= 0.3  # starts and ends at the table
        assert from_start[far:].min() <= 0.3  # back where it left
        speed = np.linalg.norm(np.diff(centre, axis=0), axis=1) * episode.options.fps
        assert 0.9 <= speed.max() <= 1.4, speed.max()  # walking pace
        height = centre[:, 2]
        assert np.ptp(height) < 0.1  # the head stays at standing height while walking

    def test_camera_sees_the_textured_room_when_away(self, episode):
        far = int(np.argmax(_table_distance_m(episode)))
        frame = _render(episode, far)
        assert np.all(frame.surface_id != NO_SURFACE)  # no hole in the room
        gray = frame.rgb.astype(np.float64).mean(axis=2)
        assert gray.mean() > 60.0 and gray.std() > 20.0, (gray.mean(), gray.std())
        # Not one flat wall: the floor ahead of the feet (~2 m) to the far walls (~4-5 m).
        assert np.percentile(frame.depth, 5) < 2.5 and np.percentile(frame.depth, 95) > 3.5

    def test_hands_cover_up_to_30_percent(self, coverage):
        assert 0.25 <= coverage.max() <= 0.35, coverage.max()
        # Both hands visit the lens once: two separate stretches above 20 %.
        high = np.flatnonzero(coverage >= 0.2)
        assert np.count_nonzero(np.diff(high) > 30) + 1 == 2, high

    def test_coverage_agrees_with_the_rendered_hands(self, episode, coverage):
        peak = int(np.argmax(coverage))
        world_from_cam = episode.world_from_cam[peak]
        bare = episode.renderer.render(world_from_cam, episode.hands_world[peak])  # no forearms
        rendered = np.isin(bare.surface_id, HAND_SURFACE_IDS).mean()
        assert rendered == pytest.approx(coverage[peak], rel=0.1), (rendered, coverage[peak])

    def test_keypoints_land_on_the_rendered_hand_at_the_lens(self, episode, coverage):
        """`hands_px` and `hand_visible` stay true with a hand 15-30 cm from the lens."""
        peak = int(np.argmax(coverage))
        frame = _render(episode, peak)
        o = episode.options
        cam_from_world = np.linalg.inv(episode.world_from_cam[peak])
        depth = (episode.hands_world[peak] @ cam_from_world[:3, :3].T + cam_from_world[:3, 3])[..., 2]
        lens_hand = int(np.argmin(depth.mean(axis=1)))
        assert depth[lens_hand].min() > 0.12 and depth[lens_hand].max() < 0.35, depth[lens_hand]
        assert episode.hand_visible[peak, lens_hand]
        px = episode.hands_px[peak, lens_hand]
        col, row = np.round(px).astype(int).T
        inside = (col >= 0) & (col < o.width) & (row >= 0) & (row < o.height)
        assert inside.sum() >= 11
        seen = frame.surface_id[row[inside], col[inside]]
        own = (HAND_SURFACE_IDS[lens_hand], ARM_SURFACE_IDS[lens_hand])  # its forearm may hide its wrist
        assert np.isin(seen, own).mean() >= 0.9, seen
        assert np.mean(seen == HAND_SURFACE_IDS[lens_hand]) >= 0.6, seen

    def test_default_sample_is_unchanged(self):
        """The preset is opt-in: the default sample is still the plain `SynthOptions`."""
        assert SAMPLE_PRESETS["table"] == SampleOptions()
        assert SampleOptions().synth_options() == SynthOptions()
