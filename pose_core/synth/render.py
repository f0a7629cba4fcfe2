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

import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError
from pose_core.synth.atlas import build_atlas
from pose_core.synth.scene import Scene, TexturedRect

__all__ = [
    "ARM_SURFACE_IDS",
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
# `surface_id` of pixels that see the wearer-left / right forearm (bare wrist and sleeve).
ARM_SURFACE_IDS = (-4, -5)


@dataclass(frozen=True)
class RenderOptions:
    """Shading, hand appearance and sampling knobs."""

    # Ambient light level and diffuse (Lambert) gain of the point light.
    ambient: float = 0.45
    diffuse: float = 0.75
    # Distance at which the point light falls to half its strength, metres.
    light_half_distance_m: float = 3.0
    # Skin and sleeve colours, RGB in [0, 1].
    skin_rgb: tuple[float, float, float] = (0.87, 0.66, 0.54)
    sleeve_rgb: tuple[float, float, float] = (0.22, 0.28, 0.42)
    # Finger radius at the knuckle (MCP) and at the tip, metres; it tapers linearly joint by joint.
    # The pinky is `pinky_scale` times thinner.
    finger_radii_m: tuple[float, float] = (0.0098, 0.0072)
    pinky_scale: float = 0.88
    # Thumb radius at its base (CMC) and at the tip, metres.
    thumb_radii_m: tuple[float, float] = (0.0125, 0.0085)
    # The palm is a slab with rounded rims: half its thickness, metres (also the rim radius), and the
    # half-width of its flat part at the wrist, metres (the knuckle end spans index to pinky MCP).
    palm_half_thickness_m: float = 0.0125
    wrist_half_width_m: float = 0.016
    # Forearm radius at the wrist and at the elbow, metres; bare skin for `cuff_m` from the wrist,
    # then sleeve.
    forearm_radii_m: tuple[float, float] = (0.024, 0.036)
    cuff_m: float = 0.07
    # Darkening at silhouette edges of hands and arms (0 none, 1 black at a grazing view).
    outline_darkening: float = 0.55
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
        self._atlas = build_atlas(scene.rects, opts.min_mip_side_px, opts.atlas_width_px)

    def render(
        self,
        world_from_cam: FloatArray,
        hands_world: FloatArray | None = None,
        elbows_world: FloatArray | None = None,
    ) -> RenderedFrame:
        """Render one view.

        Args:
            world_from_cam: camera pose, `(4, 4)`.
            hands_world: keypoints of the hands to draw, metres, world frame, `(n_hands, 21, 3)`, or None.
            elbows_world: where each hand's forearm ends, metres, world frame, `(n_hands, 3)`, or None
                for hands without forearms.

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
            if elbows_world is not None and np.shape(elbows_world) != (len(hands), 3):
                raise ShapeError("elbows_world", np.shape(elbows_world), f"({len(hands)}, 3)")
            hands_in_cam = (hands - centre) @ rot_t.T
            elbows_in_cam = None if elbows_world is None else (np.asarray(elbows_world) - centre) @ rot_t.T
            for hand, kp in enumerate(hands_in_cam):
                elbow = None if elbows_in_cam is None else elbows_in_cam[hand]
                self._draw_hand(hand, kp, elbow, depth, sid, light_in_cam, rgb)
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
        hand: int,
        kp_in_cam: FloatArray,
        elbow_in_cam: FloatArray | None,
        depth: NDArray[np.float32],
        sid: NDArray[np.int16],
        light_in_cam: NDArray[np.float32],
        rgb: NDArray[np.float32],
    ) -> None:
        """Draw one hand (keypoints `(21, 3)`, camera frame) and its forearm where nearer than `depth`."""
        opts = self.opts
        colours = (
            np.asarray(opts.skin_rgb, np.float32) * 255.0,
            np.asarray(opts.sleeve_rgb, np.float32) * 255.0,
        )
        surfaces = (HAND_SURFACE_IDS[min(hand, 1)], ARM_SURFACE_IDS[min(hand, 1)])
        for part in _hand_parts(kp_in_cam, elbow_in_cam, opts):
            box = self._pixel_box(part.points, part.radius)
            if box is None:
                continue
            r0, r1, c0, c1 = box
            dx, dy, dz = (comp[r0:r1, c0:c1] for comp in self._rays)
            if part.slab is None:
                axis_start, axis_end = part.points
                rows, cols, ray_t, normal = _ray_round_cone(dx, dy, dz, axis_start, axis_end, *part.radii)
            else:
                rows, cols, ray_t, normal = _ray_slab(dx, dy, dz, part.points, part.slab, part.radius)
            rows += r0
            cols += c0
            d = np.stack([comp[rows, cols] for comp in self._rays], axis=1).astype(np.float64)
            z = (ray_t * d[:, 2]).astype(np.float32)
            nearer = z < depth[rows, cols]
            rows, cols, z, d, normal = rows[nearer], cols[nearer], z[nearer], d[nearer], normal[nearer]
            depth[rows, cols] = z
            sid[rows, cols] = surfaces[part.arm]
            to_light = light_in_cam[None, :] - d * ray_t[nearer, None]
            dist = np.linalg.norm(to_light, axis=1)
            lambert = np.maximum(np.sum(to_light * normal, axis=1) / dist, 0.0)
            facing = np.clip(-np.sum(normal * d, axis=1), 0.0, 1.0)
            outline = 1.0 - opts.outline_darkening * (1.0 - facing) ** 2
            colour = colours[part.sleeve]
            rgb[rows, cols] = colour[None, :] * (self._light(lambert, dist) * outline)[:, None]

    def _pixel_box(self, points: FloatArray, radius: float) -> tuple[int, int, int, int] | None:
        """Pixel box `(r0, r1, c0, c1)` of balls of `radius` around camera-frame `points` `(k, 3)`.

        None when the box is empty or a ball reaches the near plane.
        """
        z_min = float(points[:, 2].min())
        if z_min <= self.opts.near_m + radius:
            return None
        u = self.k[0, 0] * points[:, 0] / points[:, 2] + self.k[0, 2]
        v = self.k[1, 1] * points[:, 1] / points[:, 2] + self.k[1, 2]
        pad = radius * self._focal / (z_min - radius) + 2.0
        c0, c1 = max(0, math.floor(u.min() - pad)), min(self.width, math.ceil(u.max() + pad) + 1)
        r0, r1 = max(0, math.floor(v.min() - pad)), min(self.height, math.ceil(v.max() + pad) + 1)
        return (r0, r1, c0, c1) if r1 > r0 and c1 > c0 else None


@dataclass(frozen=True)
class _Part:
    """One solid of a hand or arm, camera frame.

    Attributes:
        points: a round cone's axis ends `(2, 3)`, or a slab's convex polygon `(k, 3)`.
        radii: the round cone's radii at its two ends, metres (for a slab, its half-thickness twice).
        slab: the slab's unit normal `(3,)`; None for a round cone.
        sleeve: drawn in the sleeve colour (else skin).
        arm: part of the forearm (its own surface id), else of the hand.
    """

    points: FloatArray
    radii: tuple[float, float]
    slab: FloatArray | None = None
    sleeve: bool = False
    arm: bool = False

    @property
    def radius(self) -> float:
        """Largest radius (the pixel box pad)."""
        return max(self.radii)


def _hand_parts(kp: FloatArray, elbow: FloatArray | None, opts: RenderOptions) -> list[_Part]:
    """The solids of one hand: palm slab and rims, tapered fingers and thumb, forearm and sleeve.

    Args:
        kp: keypoints, camera frame, `(21, 3)`.
        elbow: where the forearm ends, camera frame, `(3,)`, or None for no forearm.
        opts: sizes.

    Returns:
        Round cones centred on the bones (joint balls centred on the keypoints, except the fingertip
        balls, pulled back by half their radius so the finger ends just past the tip keypoint) and
        the palm: a slab through the wrist and the four MCPs, rounded by rims of its half-thickness.
    """
    half = opts.palm_half_thickness_m
    normal = np.cross(kp[5] - kp[0], kp[17] - kp[0])
    normal /= np.linalg.norm(normal)
    across = kp[5] - kp[17]
    across -= (across @ normal) * normal
    across /= np.linalg.norm(across)
    along = np.cross(normal, across)
    # Palm outline: the wrist's two sides, the MCPs and the thumb's CMC and MCP (the web of the thumb),
    # flattened onto the plane through the wrist; its convex hull is the slab's polygon.
    outline = np.concatenate(
        [kp[0] + np.outer([-1.0, 1.0], opts.wrist_half_width_m * across), kp[[17, 13, 9, 5, 2, 1]]]
    )
    flat = np.stack([(outline - kp[0]) @ across, (outline - kp[0]) @ along], axis=1)
    hull = cv2.convexHull(flat.astype(np.float32), returnPoints=False)[:, 0]
    palm = kp[0] + flat[hull, :1] * across + flat[hull, 1:] * along
    parts = [_Part(palm, (half, half), slab=normal)]
    parts += [
        _Part(np.stack([a, b]), (half, half)) for a, b in zip(palm, np.roll(palm, -1, axis=0), strict=True)
    ]
    for base in (1, 5, 9, 13, 17):
        r_base, r_tip = opts.thumb_radii_m if base == 1 else opts.finger_radii_m
        scale = opts.pinky_scale if base == 17 else 1.0
        radii = scale * np.linspace(r_base, r_tip, 4)
        chain = kp[base : base + 4].copy()
        tip_dir = chain[3] - chain[2]
        chain[3] -= 0.5 * radii[3] * tip_dir / np.linalg.norm(tip_dir)
        parts += [_Part(chain[j : j + 2], (float(radii[j]), float(radii[j + 1]))) for j in range(3)]
    if elbow is not None:
        r_wrist, r_elbow = opts.forearm_radii_m
        axis = elbow - kp[0]
        length = float(np.linalg.norm(axis))
        # Stop the arm short of the near plane (the elbow can be beside or behind the camera).
        z_stop = opts.near_m + r_elbow + 0.01
        if elbow[2] < z_stop < kp[0, 2]:
            length *= (kp[0, 2] - z_stop) / (kp[0, 2] - elbow[2])
        frac = min(opts.cuff_m / length, 1.0)
        cuff = kp[0] + frac * axis / np.linalg.norm(axis) * length
        end = kp[0] + axis / np.linalg.norm(axis) * length
        r_cuff = r_wrist + frac * (r_elbow - r_wrist)
        parts.append(_Part(np.stack([kp[0], cuff]), (r_wrist, r_cuff), arm=True))
        parts.append(_Part(np.stack([cuff, end]), (r_cuff + 0.003, r_elbow), sleeve=True, arm=True))
    return parts


def _ray_slab(  # noqa: PLR0913, PLR0917 - ray components and slab, all arrays
    dx: NDArray[np.float32],
    dy: NDArray[np.float32],
    dz: NDArray[np.float32],
    polygon: FloatArray,
    normal: FloatArray,
    half: float,
) -> tuple[NDArray[np.intp], NDArray[np.intp], FloatArray, FloatArray]:
    """Intersections of rays from the origin with the flat faces of a slab (its rims are separate).

    Args:
        dx: x component of the unit ray directions, `(h, w)`.
        dy: y component, `(h, w)`.
        dz: z component, `(h, w)`.
        polygon: the slab's mid-plane, a convex polygon, `(k, 3)`.
        normal: unit normal of the mid-plane, `(3,)`.
        half: half the thickness.

    Returns:
        `(rows, cols, t, normal)` for the M rays that hit the face nearer to the origin within the
        polygon: their indices `(M,)`, the distance along the ray `(M,)` and the outward normal `(M, 3)`.
    """
    offset = float(normal @ polygon[0])
    face = offset - math.copysign(half, offset)  # the face towards the origin
    nd = dx * float(normal[0]) + dy * float(normal[1]) + dz * float(normal[2])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = face / nd
    inside = t > 0.0
    edges = np.roll(polygon, -1, axis=0) - polygon
    turn = math.copysign(1.0, float(np.cross(edges[0], edges[1]) @ normal))
    for vertex, edge in zip(polygon, edges, strict=True):
        m = turn * np.cross(normal, edge)
        inside &= t * (dx * float(m[0]) + dy * float(m[1]) + dz * float(m[2])) >= float(m @ vertex)
    rows, cols = np.nonzero(inside)
    t_hit = t[rows, cols].astype(np.float64)
    out = -math.copysign(1.0, offset) * normal
    return rows, cols, t_hit, np.broadcast_to(out, (len(rows), 3))


def _ray_round_cone(  # noqa: PLR0913, PLR0917 - ray components and cone, all arrays
    dx: NDArray[np.float32],
    dy: NDArray[np.float32],
    dz: NDArray[np.float32],
    pa: FloatArray,
    pb: FloatArray,
    ra: float,
    rb: float,
) -> tuple[NDArray[np.intp], NDArray[np.intp], FloatArray, FloatArray]:
    """Intersections of rays from the origin with a round cone (two balls and the cone tangent to both).

    Inigo Quilez's closed form (iquilezles.org/articles/intersectors); a capsule when `ra == rb`.

    Args:
        dx: x component of the unit ray directions, `(h, w)`.
        dy: y component, `(h, w)`.
        dz: z component, `(h, w)`.
        pa: axis start (centre of the first ball), `(3,)`.
        pb: axis end, `(3,)`.
        ra: radius at `pa`.
        rb: radius at `pb`.

    Returns:
        `(rows, cols, t, normal)` for the M rays that hit: their indices `(M,)`, the distance along
        the ray `(M,)` and the outward unit normal at the hit `(M, 3)`.
    """
    ba, oa = pb - pa, -pa
    baba, baoa, oaoa = float(ba @ ba), float(ba @ oa), float(oa @ oa)
    # Coarse pass in float32 over the box: does the ray meet the infinite cylinder of the larger radius?
    c = baba * oaoa - baoa * baoa - max(ra, rb) ** 2 * baba
    bard = dx * float(ba[0]) + dy * float(ba[1]) + dz * float(ba[2])
    b = baba * (dx * float(oa[0]) + dy * float(oa[1]) + dz * float(oa[2])) - baoa * bard
    rows, cols = np.nonzero(b * b - (baba - bard * bard) * c >= -1e-6 * abs(c))
    # Exact pass in float64 on the candidates.
    d = np.stack([dx[rows, cols], dy[rows, cols], dz[rows, cols]], axis=1).astype(np.float64)
    rr = ra - rb
    m2, m3, m6 = d @ ba, d @ oa, -(d @ pb)
    d2 = baba - rr * rr
    k2 = d2 - m2 * m2
    k1 = d2 * m3 - baoa * m2 + m2 * rr * ra
    k0 = d2 * oaoa - baoa * baoa + 2.0 * baoa * rr * ra - baba * ra * ra
    h = k1 * k1 - k0 * k2
    with np.errstate(divide="ignore", invalid="ignore"):
        t_body = (-np.sqrt(np.maximum(h, 0.0)) - k1) / k2
    y = baoa - ra * rr + t_body * m2
    body = (h >= 0.0) & (y > 0.0) & (y < d2)
    h1 = m3 * m3 - oaoa + ra * ra
    h2 = m6 * m6 - float(pb @ pb) + rb * rb
    t_a = np.where(h1 > 0.0, -m3 - np.sqrt(np.maximum(h1, 0.0)), np.inf)
    t_b = np.where(h2 > 0.0, -m6 - np.sqrt(np.maximum(h2, 0.0)), np.inf)
    t = np.where(body, t_body, np.minimum(t_a, t_b))
    keep = np.isfinite(t) & (t > 0.0)
    rows, cols, d, t, body, at_a = rows[keep], cols[keep], d[keep], t[keep], body[keep], (t_a <= t_b)[keep]
    hit = d * t[:, None]
    length = math.sqrt(baba)
    radial = hit - pa - (((hit - pa) @ ba) / baba)[:, None] * ba
    radial /= np.maximum(np.linalg.norm(radial, axis=1, keepdims=True), 1e-12)
    sin_a = rr / length
    body_normal = radial * math.sqrt(max(1.0 - sin_a * sin_a, 0.0)) + (sin_a / length) * ba
    cap_normal = np.where(at_a[:, None], (hit - pa) / ra, (hit - pb) / rb)
    return rows, cols, t, np.where(body[:, None], body_normal, cap_normal)
