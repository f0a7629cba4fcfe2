"""Vectorised ray-casting renderer for the synthetic scene and the hands.

Every pixel's ray (OpenCV pinhole, no distortion) is intersected with each textured rectangle whose
near-clipped image footprint covers it; the nearest hit wins (z-buffer). Textures are sampled
trilinearly from their mip pyramids, so far or grazing surfaces do not alias. Hands are capsules
(one per bone, plus a palm) intersected analytically, drawn over the scene where nearer.

Convention:
    Pixel (u, v) = (column, row); integer coordinates are pixel centres (OpenCV). Depth is the
    camera-frame z of the hit point, metres (not the distance along the ray).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.synth.atlas import build_atlas
from pose_core.synth.hands import FINGER_BONES
from pose_core.synth.scene import Scene, TexturedRect

__all__ = [
    "HAND_SURFACE_IDS",
    "NO_SURFACE",
    "RenderOptions",
    "RenderedFrame",
    "Renderer",
    "project_world_points",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# `surface_id` of a pixel that sees nothing, and of pixels that see the wearer-left / right hand.
NO_SURFACE = -1
HAND_SURFACE_IDS = (-2, -3)

# Palm capsules (keypoint pairs) added to the finger bones: wrist to each MCP and across the knuckles.
_PALM_BONES = ((0, 5), (0, 9), (0, 13), (0, 17), (5, 9), (9, 13), (13, 17), (1, 5))


@dataclass(frozen=True)
class RenderOptions:
    """Shading, hand appearance and sampling knobs."""

    # Ambient light level and diffuse (Lambert) gain of the point light.
    ambient: float = 0.45
    diffuse: float = 0.75
    # Distance at which the point light falls to half its strength, metres.
    light_half_distance_m: float = 3.0
    # Skin colour, RGB in [0, 1].
    skin_rgb: tuple[float, float, float] = (0.87, 0.66, 0.54)
    # Capsule radii, metres: finger bones, thumb bones, palm.
    finger_radius_m: float = 0.0085
    thumb_radius_m: float = 0.0105
    palm_radius_m: float = 0.017
    # Near clipping distance, metres; hand capsules with an end nearer than this + radius are skipped.
    near_m: float = 0.05
    # Added to the mip level (positive: blurrier, less aliasing).
    mip_bias: float = 0.0
    # Coarsest mip level: the last whose shorter side is at least this many texels.
    min_mip_side_px: int = 8
    # Width of the texture atlas, texels (< 32767).
    atlas_width_px: int = 8192


@dataclass(frozen=True)
class RenderedFrame:
    """One rendered view.

    Attributes:
        rgb: colour image, `(H, W, 3)` uint8.
        depth: camera-frame z of the visible surface, metres, `(H, W)` float32; inf where nothing is hit.
        surface_id: index into `Scene.rects`, or one of `HAND_SURFACE_IDS`, or `NO_SURFACE`, `(H, W)` int16.
    """

    rgb: NDArray[np.uint8]
    depth: NDArray[np.float32]
    surface_id: NDArray[np.int16]


def project_world_points(
    world_from_cam: FloatArray, k: FloatArray, x_in_world: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Project world points into a pinhole camera.

    Args:
        world_from_cam: camera pose, `(4, 4)`.
        k: intrinsics, `(3, 3)`.
        x_in_world: points, metres, `(..., 3)`.

    Returns:
        `(px, z)`: pixel coordinates `(..., 2)` (NaN where `z <= 0`) and camera-frame depth `(...)`, metres.
    """
    cam_from_world = np.linalg.inv(world_from_cam)
    x_in_cam = x_in_world @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
    z = x_in_cam[..., 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        uvw = x_in_cam @ k.T
        px = uvw[..., :2] / uvw[..., 2:3]
    px[z <= 0.0] = np.nan
    return px, z


class Renderer:
    """Renders the scene (and optionally hands) from any camera pose.

    Args:
        scene: the textured surfaces and the light.
        k: intrinsics `[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`, pixels, `(3, 3)`.
        width: image width, pixels.
        height: image height, pixels.
        opts: shading and sampling knobs.

    Raises:
        ShapeError: if `k` is not `(3, 3)` or the image size is not positive.
    """

    def __init__(self, scene: Scene, k: FloatArray, width: int, height: int, opts: RenderOptions) -> None:
        k = np.asarray(k, np.float64)
        if k.shape != (3, 3):
            raise ShapeError("intrinsics", k.shape, "(3, 3)")
        if width <= 0 or height <= 0:
            raise ShapeError("image size", (height, width), "(H > 0, W > 0)")
        self.scene, self.k, self.width, self.height, self.opts = scene, k, width, height, opts
        self._x = ((np.arange(width) - k[0, 2]) / k[0, 0]).astype(np.float32)[None, :]  # (1, W)
        self._y = ((np.arange(height) - k[1, 2]) / k[1, 1]).astype(np.float32)[:, None]  # (H, 1)
        self._focal = float(np.sqrt(k[0, 0] * k[1, 1]))
        self._ray_norm = np.sqrt(self._x**2 + self._y**2 + 1.0)  # |(x, y, 1)| per pixel, (H, W)
        # Unit ray direction components, each (H, W).
        self._rays = tuple(
            np.ascontiguousarray(np.broadcast_to(c, (height, width)) / self._ray_norm)
            for c in (self._x, self._y, np.float32(1.0))
        )
        radii = [opts.thumb_radius_m if child <= 4 else opts.finger_radius_m for _, child in FINGER_BONES]
        self._bones = tuple(FINGER_BONES) + _PALM_BONES
        self._atlas = build_atlas(scene.rects, opts.min_mip_side_px, opts.atlas_width_px)
        self._radii = tuple(radii) + (opts.palm_radius_m,) * len(_PALM_BONES)

    def render(self, world_from_cam: FloatArray, hands_world: FloatArray | None = None) -> RenderedFrame:
        """Render one view.

        Args:
            world_from_cam: camera pose, `(4, 4)`.
            hands_world: keypoints of the hands to draw, metres, world frame, `(n_hands, 21, 3)`, or None.

        Returns:
            Colour, depth and surface index per pixel.

        Raises:
            ShapeError: if an input has the wrong shape.
        """
        world_from_cam = np.asarray(world_from_cam, np.float64)
        if world_from_cam.shape != (4, 4):
            raise ShapeError("world_from_cam", world_from_cam.shape, "(4, 4)")
        rot_t = world_from_cam[:3, :3].T
        centre = world_from_cam[:3, 3]
        depth = np.full((self.height, self.width), np.inf, np.float32)
        sid = np.full((self.height, self.width), NO_SURFACE, np.int16)
        coords = np.zeros((self.height, self.width, 2), np.float32)
        for i, rect in enumerate(self.scene.rects):
            self._cast_rect(i, rect, rot_t, centre, depth, sid, coords)
        light_in_cam = (rot_t @ (self.scene.light_m - centre)).astype(np.float32)
        rgb = self._shade_scene(rot_t, depth, sid, coords, light_in_cam)
        if hands_world is not None:
            hands = np.asarray(hands_world, np.float64)
            if hands.ndim != 3 or hands.shape[1:] != (21, 3):
                raise ShapeError("hands_world", hands.shape, "(n_hands, 21, 3)")
            hands_in_cam = (hands - centre) @ rot_t.T
            for hand, kp in enumerate(hands_in_cam):
                self._draw_hand(kp, HAND_SURFACE_IDS[min(hand, 1)], depth, sid, light_in_cam, rgb)
        return RenderedFrame(np.clip(rgb, 0.0, 255.0).astype(np.uint8), depth, sid)

    def _cast_rect(  # noqa: PLR0913, PLR0917 - private: the per-frame buffers it fills
        self,
        index: int,
        rect: TexturedRect,
        rot_t: FloatArray,
        centre: FloatArray,
        depth: NDArray[np.float32],
        sid: NDArray[np.int16],
        coords: NDArray[np.float32],
    ) -> None:
        """Ray-cast one rectangle into the z-buffer (depth, surface index and surface coordinates)."""
        o_c = rot_t @ (rect.origin - centre)
        n_c = rot_t @ rect.normal
        if float(n_c @ o_c) >= 0.0:  # camera behind the one-sided surface
            return
        box = self._image_box(rot_t @ (rect.corners - centre).T)
        if box is None:
            return
        r0, r1, c0, c1 = box
        x, y = self._x[:, c0:c1], self._y[r0:r1]
        nx, ny, nz = (float(v) for v in n_c)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = float(n_c @ o_c) / (nx * x + ny * y + nz)
        u_c, v_c = rot_t @ rect.axis_u, rot_t @ rect.axis_v
        a = t * (float(u_c[0]) * x + float(u_c[1]) * y + float(u_c[2])) - float(u_c @ o_c)
        b = t * (float(v_c[0]) * x + float(v_c[1]) * y + float(v_c[2])) - float(v_c @ o_c)
        zbuf = depth[r0:r1, c0:c1]
        hit = (
            (t > self.opts.near_m)
            & (t < zbuf)
            & (a >= 0)
            & (a <= rect.size_m[0])
            & (b >= 0)
            & (b <= rect.size_m[1])
        )
        np.copyto(zbuf, t, where=hit)
        np.copyto(sid[r0:r1, c0:c1], np.int16(index), where=hit)
        np.copyto(coords[r0:r1, c0:c1, 0], a, where=hit)
        np.copyto(coords[r0:r1, c0:c1, 1], b, where=hit)

    def _image_box(self, corners_in_cam: FloatArray) -> tuple[int, int, int, int] | None:
        """Pixel box `(r0, r1, c0, c1)` of a polygon `(3, n)` clipped at the near plane, or None."""
        near = self.opts.near_m
        pts = corners_in_cam.T
        clipped = []
        for p, q in zip(pts, np.roll(pts, -1, axis=0), strict=True):
            if p[2] > near:
                clipped.append(p)
            if (p[2] > near) != (q[2] > near):
                clipped.append(p + (q - p) * (near - p[2]) / (q[2] - p[2]))
        if not clipped:
            return None
        poly = np.asarray(clipped)
        uv = poly[:, :2] / poly[:, 2:3] * np.diag(self.k)[:2] + self.k[:2, 2]
        c0 = max(0, int(np.floor(uv[:, 0].min())))
        c1 = min(self.width, int(np.ceil(uv[:, 0].max())) + 1)
        r0 = max(0, int(np.floor(uv[:, 1].min())))
        r1 = min(self.height, int(np.ceil(uv[:, 1].max())) + 1)
        return (r0, r1, c0, c1) if r1 > r0 and c1 > c0 else None

    def _shade_scene(
        self,
        rot_t: FloatArray,
        depth: NDArray[np.float32],
        sid: NDArray[np.int16],
        coords: NDArray[np.float32],
        light_in_cam: NDArray[np.float32],
    ) -> NDArray[np.float32]:
        """Texture (trilinear mip lookup) and light every pixel that hit a rectangle; `(H, W, 3)` float."""
        rects = self.scene.rects
        # Per-surface tables; the extra last entry keeps `NO_SURFACE` pixels finite.
        normals = np.array([rot_t @ r.normal for r in rects] + [[0.0, 0.0, -1.0]], np.float32)
        texels_per_m = np.append(self._atlas.texels_per_m, np.float32(1.0))
        index = np.where(sid >= 0, sid, len(rects)).astype(np.int64)
        nx, ny, nz = (np.take(normals[:, k], index) for k in range(3))
        t = np.where(np.isfinite(depth), depth, np.float32(0.0))
        cos_incidence = np.maximum(
            np.abs(nx * self._x + ny * self._y + nz) / self._ray_norm, np.float32(1e-3)
        )
        footprint_m = t * self._ray_norm / (self._focal * np.sqrt(cos_incidence))
        level = np.log2(np.maximum(footprint_m * np.take(texels_per_m, index), np.float32(1e-6)))
        albedo = self._atlas.sample(
            np.minimum(index, len(rects) - 1).reshape(-1),
            coords.reshape(-1, 2),
            level.reshape(-1) + self.opts.mip_bias,
        ).reshape(self.height, self.width, 3)
        albedo[sid < 0] = 0.0
        # Lambert towards the point light: to_light = light - t * (x, y, 1).
        lx = light_in_cam[0] - t * self._x
        ly = light_in_cam[1] - t * self._y
        lz = light_in_cam[2] - t
        dist = np.sqrt(lx * lx + ly * ly + lz * lz)
        lambert = np.maximum(
            (lx * nx + ly * ny + lz * nz) / np.maximum(dist, np.float32(1e-6)), np.float32(0.0)
        )
        albedo *= self._light(lambert, dist)[..., None]
        return albedo

    def _light(self, lambert: NDArray[np.float32], dist_m: NDArray[np.float32]) -> NDArray[np.float32]:
        """Light level from the Lambert term and the distance to the light."""
        falloff = 1.0 / (1.0 + (dist_m / self.opts.light_half_distance_m) ** 2)
        return self.opts.ambient + (self.opts.diffuse * 2.0) * falloff * lambert

    def _draw_hand(  # noqa: PLR0913, PLR0917 - private: the per-frame buffers it fills
        self,
        kp_in_cam: FloatArray,
        surface: int,
        depth: NDArray[np.float32],
        sid: NDArray[np.int16],
        light_in_cam: NDArray[np.float32],
        rgb: NDArray[np.float32],
    ) -> None:
        """Draw one hand's capsules (keypoints `(21, 3)` in the camera frame) where nearer than `depth`."""
        skin = np.asarray(self.opts.skin_rgb, np.float32) * 255.0
        fx, fy, cx, cy = (float(v) for v in (self.k[0, 0], self.k[1, 1], self.k[0, 2], self.k[1, 2]))
        for (i, j), radius in zip(self._bones, self._radii, strict=True):
            pa, pb = kp_in_cam[i], kp_in_cam[j]
            z_min = min(pa[2], pb[2])
            if z_min <= self.opts.near_m + radius:
                continue
            us = (fx * pa[0] / pa[2] + cx, fx * pb[0] / pb[2] + cx)
            vs = (fy * pa[1] / pa[2] + cy, fy * pb[1] / pb[2] + cy)
            pad = radius * self._focal / (z_min - radius) + 2.0
            c0, c1 = max(0, math.floor(min(us) - pad)), min(self.width, math.ceil(max(us) + pad) + 1)
            r0, r1 = max(0, math.floor(min(vs) - pad)), min(self.height, math.ceil(max(vs) + pad) + 1)
            if r1 <= r0 or c1 <= c0:
                continue
            rows, cols, ray_t, normal = _ray_capsule(
                *(comp[r0:r1, c0:c1] for comp in self._rays), pa, pb, radius
            )
            rows += r0
            cols += c0
            z = (ray_t * self._rays[2][rows, cols]).astype(np.float32)
            nearer = z < depth[rows, cols]
            rows, cols, z, ray_t, normal = (
                rows[nearer],
                cols[nearer],
                z[nearer],
                ray_t[nearer],
                normal[nearer],
            )
            depth[rows, cols] = z
            sid[rows, cols] = surface
            p = np.stack([comp[rows, cols] for comp in self._rays], axis=1) * ray_t[:, None]
            to_light = light_in_cam[None, :] - p
            dist = np.linalg.norm(to_light, axis=1)
            lambert = np.maximum(np.sum(to_light * normal, axis=1) / dist, 0.0)
            rgb[rows, cols] = skin[None, :] * self._light(lambert, dist)[:, None]


def _ray_capsule(  # noqa: PLR0913, PLR0917 - ray components and capsule, all arrays
    dx: NDArray[np.float32],
    dy: NDArray[np.float32],
    dz: NDArray[np.float32],
    pa: FloatArray,
    pb: FloatArray,
    radius: float,
) -> tuple[NDArray[np.intp], NDArray[np.intp], FloatArray, FloatArray]:
    """Intersections of rays from the origin with a capsule.

    Args:
        dx: x component of the unit ray directions, `(h, w)`.
        dy: y component, `(h, w)`.
        dz: z component, `(h, w)`.
        pa: capsule axis start, `(3,)`.
        pb: capsule axis end, `(3,)`.
        radius: capsule radius.

    Returns:
        `(rows, cols, t, normal)` for the M rays that hit: their indices `(M,)`, the distance along
        the ray `(M,)` and the outward unit normal at the hit `(M, 3)`.
    """
    ba, oa = pb - pa, -pa
    baba, baoa, oaoa = float(ba @ ba), float(ba @ oa), float(oa @ oa)
    c = baba * oaoa - baoa * baoa - radius * radius * baba
    # Coarse pass in float32 over the box: does the ray meet the infinite cylinder (with margin)?
    bard = dx * float(ba[0]) + dy * float(ba[1]) + dz * float(ba[2])
    b = baba * (dx * float(oa[0]) + dy * float(oa[1]) + dz * float(oa[2])) - baoa * bard
    rows, cols = np.nonzero(b * b - (baba - bard * bard) * c >= -1e-6 * abs(c))
    # Exact pass in float64 on the candidates.
    d = np.stack([dx[rows, cols], dy[rows, cols], dz[rows, cols]], axis=1).astype(np.float64)
    bard_c = d @ ba
    a = baba - bard_c * bard_c
    b_c = baba * (d @ oa) - baoa * bard_c
    h = b_c * b_c - a * c
    with np.errstate(divide="ignore", invalid="ignore"):
        t_body = (-b_c - np.sqrt(np.maximum(h, 0.0))) / a
    y = baoa + t_body * bard_c
    body = (h >= 0.0) & (a > 1e-12) & (y > 0.0) & (y < baba)
    t = np.where(body, t_body, np.inf)
    # Caps: the sphere at the end beyond which the ray met the cylinder.
    oc = -np.where((y <= 0.0)[:, None], pa, pb)
    b2 = np.sum(d * oc, axis=1)
    h2 = b2 * b2 - (np.sum(oc * oc, axis=1) - radius * radius)
    cap = (h >= 0.0) & ~body & (h2 > 0.0)
    t[cap] = -b2[cap] - np.sqrt(h2[cap])
    keep = np.isfinite(t) & (t > 0.0)
    rows, cols, d, t = rows[keep], cols[keep], d[keep], t[keep]
    hit_point = d * t[:, None]
    axis_s = np.clip(((hit_point - pa) @ ba) / baba, 0.0, 1.0)
    normal = (hit_point - (pa + axis_s[:, None] * ba)) / radius
    return rows, cols, t, normal
