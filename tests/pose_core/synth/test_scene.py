"""Scene geometry and procedural textures."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pose_core.synth.scene import SceneOptions, build_scene
from pose_core.synth.textures import TextureOptions, make_texture


@pytest.fixture(scope="module")
def scene():
    return build_scene(SceneOptions(), seed=0)


class TestBuildScene:
    def test_room_surfaces_face_inwards(self, scene):
        opts = SceneOptions()
        centre = (np.asarray(opts.room_min_m) + np.asarray(opts.room_max_m)) / 2
        for rect in scene.rects:
            if rect.name in ("floor", "ceiling") or rect.name.startswith("wall"):
                assert (centre - rect.origin) @ rect.normal > 0.5, rect.name

    def test_table_and_boxes_face_outwards(self, scene):
        for rect in scene.rects:
            if rect.name.startswith(("table", "box")):
                prefix = rect.name.split("_")[0]
                solid = np.concatenate([r.corners for r in scene.rects if r.name.split("_")[0] == prefix])
                centre = solid.mean(axis=0)
                face_centre = rect.corners.mean(axis=0)
                assert (face_centre - centre) @ rect.normal > 0.0, rect.name

    def test_table_top_geometry(self, scene):
        top = next(r for r in scene.rects if r.name == "table_top")
        opts = SceneOptions()
        np.testing.assert_allclose(top.corners.mean(axis=0), opts.table_center_m)
        np.testing.assert_allclose(top.normal, [0.0, 0.0, 1.0])

    def test_textures_match_surface_size(self, scene):
        for rect in scene.rects:
            h, w = rect.texture.shape[:2]
            assert w * rect.texel_m == pytest.approx(rect.size_m[0], abs=rect.texel_m)
            assert h * rect.texel_m == pytest.approx(rect.size_m[1], abs=rect.texel_m)

    def test_deterministic_from_seed(self, scene):
        again = build_scene(SceneOptions(), seed=0)
        other = build_scene(SceneOptions(), seed=1)
        assert all(
            np.array_equal(a.texture, b.texture) for a, b in zip(scene.rects, again.rects, strict=True)
        )
        assert not np.array_equal(scene.rects[0].texture, other.rects[0].texture)

    def test_rejects_table_outside_room(self):
        with pytest.raises(ValueError, match="not inside the room"):
            build_scene(SceneOptions(table_center_m=(3.0, 0.0, 0.85)), seed=0)

    def test_furniture_stands_on_the_floor(self, scene):
        coarse = SceneOptions(
            floor_boxes=((1.0, -1.0, 0.4, 0.6, 0.5),), room_texel_m=0.02, table_texel_m=0.01
        )
        furnished = build_scene(coarse, seed=0)
        added = [r for r in furnished.rects if r.name.startswith("furniture0")]
        assert [r.name for r in furnished.rects[: len(scene.rects)]] == [r.name for r in scene.rects]
        assert sorted(r.name for r in added) == [f"furniture0_{s}" for s in ("+x", "+y", "+z", "-x", "-y")]
        corners = np.concatenate([r.corners for r in added])
        np.testing.assert_allclose(corners.min(axis=0), [0.8, -1.3, 0.0])
        np.testing.assert_allclose(corners.max(axis=0), [1.2, -0.7, 0.5])
        for rect in added:  # faces outwards, textured like the room
            assert (rect.corners.mean(axis=0) - [1.0, -1.0, 0.25]) @ rect.normal > 0.0, rect.name
            assert rect.texel_m == 0.02

    def test_rejects_furniture_outside_room(self):
        with pytest.raises(ValueError, match="floor box"):
            build_scene(SceneOptions(floor_boxes=((2.4, 0.0, 0.4, 0.4, 0.5),)), seed=0)


@pytest.fixture(scope="module")
def texture():
    return make_texture((512, 512), 0.004, (0.6, 0.5, 0.4), np.random.default_rng(2), TextureOptions())


class TestMakeTexture:
    def test_corner_rich(self, texture):
        gray = cv2.cvtColor(texture, cv2.COLOR_RGB2GRAY)
        corners = cv2.goodFeaturesToTrack(gray, 5000, 0.01, 5)
        assert len(corners) > 1500  # about 1 corner per 170 texels^2, everywhere

    def test_not_periodic(self, texture):
        """Normalised autocorrelation has no secondary peak: nothing tiles or repeats."""
        g = cv2.cvtColor(texture, cv2.COLOR_RGB2GRAY).astype(np.float64)
        g -= g.mean()
        spec = np.fft.fft2(g)
        acf = np.fft.fftshift(np.real(np.fft.ifft2(spec * np.conj(spec))))
        acf /= acf.max()
        yy, xx = np.mgrid[-256:256, -256:256]
        far = np.hypot(yy, xx) > 40
        assert acf[far].max() < 0.3, acf[far].max()

    def test_rejects_tiny(self):
        with pytest.raises(ValueError, match="at least 2x2"):
            make_texture((1, 8), 0.01, (0.5, 0.5, 0.5), np.random.default_rng(0), TextureOptions())
