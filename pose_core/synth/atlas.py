"""All surface textures and their mip levels packed into one image, for one-call trilinear sampling.

Mip level `l` of a texture is its level-0 image (padded by reflection to a multiple of `2^L`)
box-filtered by `2^l`, so texel `j` of level `l` covers exactly level-0 texels
`[j 2^l, (j + 1) 2^l)` and the levels stay aligned. Levels are packed into shelves of a single
float32 atlas; a pixel's colour is two `cv2.remap` lookups (levels `floor(level)` and the next one)
blended linearly, with coordinates clamped inside each level's own rectangle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.synth.scene import TexturedRect

__all__ = ["TextureAtlas", "build_atlas"]

logger = logging.getLogger(__name__)

# cv2.remap needs images and maps with sides below 32767: atlas height limit and map width.
_ATLAS_MAX_SIDE = 32766
_REMAP_COLUMNS = 4096
# Replicated border around each packed level, texels (bilinear reads one texel beyond the edge).
_BORDER_PX = 2


@dataclass(frozen=True)
class TextureAtlas:
    """Packed mip levels of every surface.

    Attributes:
        image: the atlas, float32 `(H_a, W_a, 3)` in [0, 255]; each level has a replicated border.
        lookup: per `(surface, level)` row `s * n_levels + l`: `(texels per metre along axis_u,
            along axis_v, atlas x of the level's texel (0, 0) centre minus 0.5, same for y)`,
            `(S * n_levels, 4)` float32.
        n_levels: row stride of `lookup` (the most levels any surface has).
        max_level: highest level of each surface, `(S,)` int64.
        texels_per_m: level-0 texels per metre along `axis_u` of each surface, `(S,)` float32.
    """

    image: NDArray[np.float32]
    lookup: NDArray[np.float32]
    n_levels: int
    max_level: NDArray[np.int64]
    texels_per_m: NDArray[np.float32]

    def sample(
        self, surface: NDArray[np.int64], coords_m: NDArray[np.float32], level: NDArray[np.float32]
    ) -> NDArray[np.float32]:
        """Trilinear texture lookup.

        Args:
            surface: surface index per point, `(N,)`, each in `[0, S)`.
            coords_m: position on the surface along `axis_u`, `axis_v`, metres, `(N, 2)`; points
                outside `[0, size_m]` read the replicated border.
            level: mip level per point (0 = full resolution; clipped to the surface's range), `(N,)`.

        Returns:
            Colour per point, float32 `(N, 3)` in [0, 255].
        """
        top = np.take(self.max_level, surface)
        lvl = np.clip(level, np.float32(0.0), top.astype(np.float32))
        lo = lvl.astype(np.int64)  # floor, as lvl >= 0
        key = surface * self.n_levels + lo
        colour = self._bilinear(key, coords_m)
        frac = (lvl - lo.astype(np.float32))[:, None]
        colour += frac * (self._bilinear(key + (lo < top), coords_m) - colour)
        return colour

    def _bilinear(self, key: NDArray[np.int64], coords_m: NDArray[np.float32]) -> np.ndarray:
        """Bilinear lookup of each point in the level `key` (row of `lookup`) names, `(N, 3)` float32."""
        row = np.take(self.lookup, key, axis=0)
        n = len(key)
        cols = min(max(n, 1), _REMAP_COLUMNS)
        rows = -(-n // cols)
        grid = np.zeros((rows * cols, 2), np.float32)
        np.multiply(coords_m, row[:, :2], out=grid[:n])
        grid[:n] += row[:, 2:]
        out = cv2.remap(  # type: ignore[call-overload]  # opencv 5.0's stubs omit map2=None (documented, used)
            self.image, grid.reshape(rows, cols, 2), None, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        )
        return out.reshape(-1, 3)[:n]


def build_atlas(rects: tuple[TexturedRect, ...], min_side_px: int, shelf_width_px: int) -> TextureAtlas:
    """Build the mip pyramids of all surfaces and pack them into one atlas.

    Args:
        rects: the surfaces, in `surface_id` order.
        min_side_px: the coarsest level of a texture is the last one whose shorter side is at least this.
        shelf_width_px: width of the atlas, texels (< 32767); levels are packed in shelves this wide.

    Returns:
        The atlas.

    Raises:
        ShapeError: if a texture level is wider than `shelf_width_px` or the atlas grows past 32766 rows.
    """
    pyramids = [_mip_pyramid(r.texture, min_side_px) for r in rects]
    n_levels = max(len(p) for p in pyramids)
    items = sorted(
        ((lvl.shape[0], s, lv) for s, p in enumerate(pyramids) for lv, lvl in enumerate(p)), reverse=True
    )
    origin = np.zeros((len(rects), n_levels, 2), np.int64)
    x = y = shelf_h = 0
    for h, s, lv in items:
        w = pyramids[s][lv].shape[1] + 2 * _BORDER_PX
        if w > shelf_width_px:
            raise ShapeError("texture level wider than the atlas", (h, w), f"(*, <= {shelf_width_px})")
        if x + w > shelf_width_px:
            x, y, shelf_h = 0, y + shelf_h, 0
        origin[s, lv] = (x + _BORDER_PX, y + _BORDER_PX)
        x += w
        shelf_h = max(shelf_h, h + 2 * _BORDER_PX)
    height = y + shelf_h
    if height > _ATLAS_MAX_SIDE:
        raise ShapeError(
            "texture atlas too tall; raise the shelf width", (height, shelf_width_px), "(< 32767, *)"
        )
    image = np.zeros((height, shelf_width_px, 3), np.float32)
    lookup = np.zeros((len(rects), n_levels, 4), np.float32)
    for _, s, lv in items:
        lvl, (ox, oy), b = pyramids[s][lv], origin[s, lv], _BORDER_PX
        h, w = lvl.shape[:2]
        image[oy - b : oy + h + b, ox - b : ox + w + b] = cv2.copyMakeBorder(
            lvl, b, b, b, b, cv2.BORDER_REPLICATE
        )
        scale = 2.0**-lv
        tex = rects[s].texture
        lookup[s, lv] = (
            tex.shape[1] / rects[s].size_m[0] * scale,
            tex.shape[0] / rects[s].size_m[1] * scale,
            ox - 0.5,
            oy - 0.5,
        )
    logger.debug("texture atlas %dx%d for %d surfaces", shelf_width_px, height, len(rects))
    return TextureAtlas(
        image,
        lookup.reshape(-1, 4),
        n_levels,
        np.array([len(p) - 1 for p in pyramids]),
        lookup[:, 0, 0].copy(),
    )


def _mip_pyramid(texture: NDArray[np.uint8], min_side_px: int) -> list[np.ndarray]:
    """Aligned box-filtered mip levels of `texture` `(H, W, 3)`, level 0 first, float32."""
    h, w = texture.shape[:2]
    top = 0
    while min(h, w) >> (top + 1) >= min_side_px:
        top += 1
    block = 1 << top
    padded = cv2.copyMakeBorder(texture, 0, -h % block, 0, -w % block, cv2.BORDER_REFLECT).astype(np.float32)
    levels: list[np.ndarray] = [padded]
    for _ in range(top):
        prev = levels[-1]
        levels.append(
            cv2.resize(prev, (prev.shape[1] // 2, prev.shape[0] // 2), interpolation=cv2.INTER_AREA)
        )
    return levels
