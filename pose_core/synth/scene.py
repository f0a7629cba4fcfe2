"""The synthetic indoor scene: a textured room, a table and a few boxes on it.

Convention:
    World frame: metres, z up, gravity along -z (g = (0, 0, -9.81) m/s^2). The room spans
    `room_min_m`..`room_max_m`; the floor is z = room_min_m[2]. The wearer stands near the
    table's near edge (smaller y) and faces +y. Every surface is a one-sided textured rectangle
    `origin + a * axis_u + b * axis_v` with `0 <= a <= size_u`, `0 <= b <= size_v`; its normal
    `axis_u x axis_v` points towards the side it is seen from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from pose_core.synth.textures import TextureOptions, make_texture

__all__ = ["Scene", "SceneOptions", "TexturedRect", "build_scene"]

logger = logging.getLogger(__name__)

Vec3 = tuple[float, float, float]


@dataclass(frozen=True)
class SceneOptions:
    """Geometry, texture resolution and lighting of the synthetic room."""

    # Room corners (x, y, z), metres, world frame; floor at z = room_min_m[2].
    room_min_m: Vec3 = (-2.5, -2.0, 0.0)
    room_max_m: Vec3 = (2.5, 2.5, 2.6)
    # Centre of the table top (x, y, z), metres; z is the table height.
    table_center_m: Vec3 = (0.0, 0.45, 0.85)
    # Table top size along world x and y, metres.
    table_size_m: tuple[float, float] = (1.8, 0.8)
    # Height of the table's front and side aprons below the top, metres.
    table_apron_m: float = 0.12
    # Boxes on the table: (x, y) centre offsets from the table centre and (sx, sy, sz) sizes, metres.
    boxes: tuple[tuple[float, float, float, float, float], ...] = (
        (-0.35, 0.15, 0.12, 0.10, 0.14),
        (0.40, 0.20, 0.20, 0.08, 0.06),
        (0.05, 0.28, 0.07, 0.07, 0.18),
    )
    # Furniture standing on the floor: (x, y) centre, world frame, and (sx, sy, sz) size, metres.
    floor_boxes: tuple[tuple[float, float, float, float, float], ...] = ()
    # Texel size on room surfaces (floor, walls, ceiling, furniture), metres.
    room_texel_m: float = 0.004
    # Texel size on the table and the boxes, metres.
    table_texel_m: float = 0.0015
    # Point light position (x, y, z), metres, world frame.
    light_m: Vec3 = (0.3, 0.2, 2.45)
    # Procedural texture knobs.
    texture: TextureOptions = field(default_factory=TextureOptions)


@dataclass(frozen=True)
class TexturedRect:
    """One textured one-sided rectangle, world frame.

    Attributes:
        name: short label (`floor`, `wall_+x`, `table_top`, `box0_+z`, ...).
        origin: corner at (a, b) = (0, 0), metres, `(3,)`.
        axis_u: unit vector of the texture's column direction, `(3,)`.
        axis_v: unit vector of the texture's row direction, `(3,)`, orthogonal to `axis_u`.
        size_m: extents along `axis_u` and `axis_v`, metres.
        texel_m: size of one level-0 texel, metres.
        texture: RGB texture, `(H, W, 3)` uint8; column `j` covers `a` in `[j, j + 1) * size_m[0] / W`.
    """

    name: str
    origin: NDArray[np.float64]
    axis_u: NDArray[np.float64]
    axis_v: NDArray[np.float64]
    size_m: tuple[float, float]
    texel_m: float
    texture: NDArray[np.uint8]

    @property
    def normal(self) -> NDArray[np.float64]:
        """Unit normal `axis_u x axis_v`, towards the visible side, `(3,)`."""
        return np.cross(self.axis_u, self.axis_v)

    @property
    def corners(self) -> NDArray[np.float64]:
        """The four corners, metres, world frame, `(4, 3)`."""
        du = self.axis_u * self.size_m[0]
        dv = self.axis_v * self.size_m[1]
        return np.stack([self.origin, self.origin + du, self.origin + du + dv, self.origin + dv])


@dataclass(frozen=True)
class Scene:
    """All surfaces and the light.

    Attributes:
        rects: the surfaces; a pixel's `surface_id` indexes this tuple.
        light_m: point light position, metres, world frame, `(3,)`.
        options: the options the scene was built from.
    """

    rects: tuple[TexturedRect, ...]
    light_m: NDArray[np.float64]
    options: SceneOptions


# Mean colours of the surface families, RGB in [0, 1].
_PALETTE = {
    "floor": (0.45, 0.36, 0.28),
    "wall": (0.72, 0.70, 0.64),
    "ceiling": (0.80, 0.80, 0.78),
    "table": (0.55, 0.42, 0.30),
    "box": (0.35, 0.45, 0.60),
    "furniture": (0.52, 0.40, 0.34),
}


def build_scene(opts: SceneOptions, seed: int) -> Scene:
    """Build the room, table and boxes with procedural textures.

    Args:
        opts: geometry, resolution and lighting.
        seed: texture seed; the same seed gives the same scene bit for bit.

    Returns:
        The scene.

    Raises:
        ValueError: if the room or the table has a non-positive extent, or the table or a piece of
            furniture is not inside the room.
    """
    lo = np.asarray(opts.room_min_m, np.float64)
    hi = np.asarray(opts.room_max_m, np.float64)
    tc = np.asarray(opts.table_center_m, np.float64)
    half = np.asarray(opts.table_size_m, np.float64) / 2.0
    if np.any(hi <= lo) or np.any(half <= 0.0):
        raise ValueError(f"room extent {hi - lo} and table size {2 * half} must be positive")
    if np.any(tc[:2] - half <= lo[:2]) or np.any(tc[:2] + half >= hi[:2]) or not lo[2] < tc[2] < hi[2]:
        raise ValueError(f"table centred at {tc} with size {2 * half} is not inside the room {lo}..{hi}")
    for x, y, sx, sy, sz in opts.floor_boxes:
        footprint = np.array([[x - sx / 2, y - sy / 2], [x + sx / 2, y + sy / 2]])
        if np.any(footprint < lo[:2]) or np.any(footprint > hi[:2]) or not 0.0 < sz < hi[2] - lo[2]:
            raise ValueError(f"floor box at ({x}, {y}) of size ({sx}, {sy}, {sz}) is not inside the room")
    rng = np.random.default_rng(seed)
    rects: list[TexturedRect] = []

    def add(  # noqa: PLR0913, PLR0917 - local helper: one call per surface, positional for brevity
        name: str,
        family: str,
        origin: NDArray[np.float64],
        u: Vec3,
        v: Vec3,
        size: tuple[float, float],
        texel_m: float,
    ) -> None:
        shape = (max(2, int(np.ceil(size[1] / texel_m))), max(2, int(np.ceil(size[0] / texel_m))))
        tex = make_texture(shape, texel_m, _PALETTE[family], rng, opts.texture)
        rects.append(
            TexturedRect(
                name,
                np.asarray(origin, np.float64),
                np.asarray(u, np.float64),
                np.asarray(v, np.float64),
                size,
                texel_m,
                tex,
            )
        )

    ext = hi - lo
    # Room: normals point inwards.
    add("floor", "floor", lo, (1, 0, 0), (0, 1, 0), (ext[0], ext[1]), opts.room_texel_m)
    add(
        "ceiling",
        "ceiling",
        np.array([lo[0], hi[1], hi[2]]),
        (1, 0, 0),
        (0, -1, 0),
        (ext[0], ext[1]),
        opts.room_texel_m,
    )
    add(
        "wall_-y",
        "wall",
        np.array([lo[0], lo[1], hi[2]]),
        (1, 0, 0),
        (0, 0, -1),
        (ext[0], ext[2]),
        opts.room_texel_m,
    )
    add(
        "wall_+y",
        "wall",
        np.array([hi[0], hi[1], hi[2]]),
        (-1, 0, 0),
        (0, 0, -1),
        (ext[0], ext[2]),
        opts.room_texel_m,
    )
    add(
        "wall_-x",
        "wall",
        np.array([lo[0], hi[1], hi[2]]),
        (0, -1, 0),
        (0, 0, -1),
        (ext[1], ext[2]),
        opts.room_texel_m,
    )
    add(
        "wall_+x",
        "wall",
        np.array([hi[0], lo[1], hi[2]]),
        (0, 1, 0),
        (0, 0, -1),
        (ext[1], ext[2]),
        opts.room_texel_m,
    )
    # Table top (normal +z) and its aprons, facing outwards.
    top = tc[2]
    x0, x1, y0, y1 = tc[0] - half[0], tc[0] + half[0], tc[1] - half[1], tc[1] + half[1]
    add(
        "table_top",
        "table",
        np.array([x0, y0, top]),
        (1, 0, 0),
        (0, 1, 0),
        (2 * half[0], 2 * half[1]),
        opts.table_texel_m,
    )
    for name, origin, u, size in _vertical_sides((x0, x1, y0, y1), top, opts.table_apron_m):
        add(f"table_{name}", "table", origin, u, (0, 0, -1), size, opts.table_texel_m)
    # Boxes on the table (fine texture), then furniture on the floor (room texture): top and four sides.
    boxes = [(f"box{i}", "box", tc[0] + dx, tc[1] + dy, top, s) for i, (dx, dy, *s) in enumerate(opts.boxes)]
    boxes += [(f"furniture{i}", "furniture", x, y, lo[2], s) for i, (x, y, *s) in enumerate(opts.floor_boxes)]
    for name, family, x, y, z, (sx, sy, sz) in boxes:
        texel = opts.table_texel_m if family == "box" else opts.room_texel_m
        bx0, bx1, by0, by1 = x - sx / 2, x + sx / 2, y - sy / 2, y + sy / 2
        add(f"{name}_+z", family, np.array([bx0, by0, z + sz]), (1, 0, 0), (0, 1, 0), (sx, sy), texel)
        for side, origin, u, size in _vertical_sides((bx0, bx1, by0, by1), z + sz, sz):
            add(f"{name}_{side}", family, origin, u, (0, 0, -1), size, texel)
    logger.debug("built scene with %d surfaces (seed %d)", len(rects), seed)
    return Scene(tuple(rects), np.asarray(opts.light_m, np.float64), opts)


def _vertical_sides(
    footprint: tuple[float, float, float, float], z_top: float, height: float
) -> list[tuple[str, NDArray[np.float64], Vec3, tuple[float, float]]]:
    """The four outward-facing vertical sides of an axis-aligned box, footprint `(x0, x1, y0, y1)`.

    Each side hangs `height` metres below `z_top`; its `axis_v` is world -z. Returns
    `(name, origin, axis_u, size_m)` per side, named by its outward normal (`-y`, `+y`, `-x`, `+x`).
    """
    x0, x1, y0, y1 = footprint
    return [
        ("-y", np.array([x1, y0, z_top]), (-1, 0, 0), (x1 - x0, height)),
        ("+y", np.array([x0, y1, z_top]), (1, 0, 0), (x1 - x0, height)),
        ("-x", np.array([x0, y0, z_top]), (0, 1, 0), (y1 - y0, height)),
        ("+x", np.array([x1, y1, z_top]), (0, -1, 0), (y1 - y0, height)),
    ]
