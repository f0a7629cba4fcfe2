"""Stereo depth and the metric scale of a monocular map from a calibrated stereo pair.

A stereo pair measures depth in metres: after rectification (both image planes turned parallel to
the baseline, epipolar lines horizontal) a point at rectified depth `Z'` appears `d = f' B / Z'`
pixels further left in the right image (`f'` rectified focal length, `B` baseline). Monocular
tracking measures depth in map units. At keyframes both see the same map points, so

    metres_per_unit = stereo depth (m) / map depth (units)

for every point, up to noise: the median of these ratios is the scale, the MAD their spread.

How (`StereoMatcher`, `stereo_scale`):

1. **Rectify** (`cv2.stereoRectify`, `cv2.fisheye.stereoRectify` for equidistant lenses) from both
   cameras' intrinsics (with distortion) and `right_from_left`; `initUndistortRectifyMap` + `remap`
   give rectified grey images.
2. **Disparity** with semi-global block matching (`cv2.StereoSGBM`: `DisparityOptions`), its
   uniqueness test and left-right consistency check; invalid pixels are NaN.
3. **Depth at a left ray** `r = (x, y, 1)` (undistorted normalised coordinates): the ray in the
   rectified frame is `R1 r`, it meets the rectified image at `P1`'s projection, where the disparity
   is sampled (bilinear, refused across depth edges); `z_left = f' B / (d (R1 r)_z)`.
4. **Scale**: at up to `max_keyframes` keyframes, each observed map point's depth in the keyframe's
   camera (map units) against the stereo depth at its observation; refused with a reason when too
   few points remain or their ratios spread too much.

Convention:
    Camera frames are OpenCV's (x right, y down, z forward). `right_from_left` `(4, 4)` maps
    left-camera coordinates to right-camera coordinates, metres: a rig with the right camera `B`
    metres along the left camera's +x has translation `(-B, 0, 0)`. `world_from_cam` maps camera
    coordinates to world (map) coordinates. Depth is camera-frame z, not ray length.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np
from numpy.typing import NDArray

from pose_core.errors import InputError, ShapeError
from pose_core.geometry.camera import Camera

__all__ = [
    "DisparityOptions",
    "StereoMatcher",
    "StereoRig",
    "StereoScale",
    "StereoScaleOptions",
    "StereoView",
    "right_from_left_of_baseline",
    "scale_from_depths",
    "stereo_scale",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

# 1.4826 * MAD estimates the standard deviation of normally distributed ratios.
_MAD_TO_STD = 1.4826
_SGBM_MODES = {
    "sgbm": cv2.STEREO_SGBM_MODE_SGBM,
    "sgbm_3way": cv2.STEREO_SGBM_MODE_SGBM_3WAY,
    "hh": cv2.STEREO_SGBM_MODE_HH,
}


@dataclass(frozen=True)
class DisparityOptions:
    """Settings of the semi-global block matcher (`cv2.StereoSGBM`)."""

    # Disparity search range, pixels (multiple of 16). The nearest depth seen is f' B / this: at
    # 640 px, f 500 px, B 0.1 m, 128 reaches 0.39 m (the synthetic table is 0.45-0.8 m away).
    num_disparities: int = 128
    # Matched block size, pixels (odd, 3-11).
    block_size: int = 5
    # A match must beat the second best cost by this percentage (0 disables the test).
    uniqueness_ratio: int = 10
    # Left-right check: largest difference between the left and the right disparity, pixels (-1: off).
    lr_max_diff_px: int = 1
    # Speckle filter: blobs of up to this many pixels whose disparity varies by up to
    # `speckle_range_px` inside are removed (0: off).
    speckle_window_px: int = 100
    speckle_range_px: int = 2
    # Matching mode: sgbm (5 directions), sgbm_3way (faster, about as good) or hh (8 directions, slow).
    mode: Literal["sgbm", "sgbm_3way", "hh"] = "sgbm_3way"

    def __post_init__(self) -> None:
        problems = []
        if self.num_disparities < 16 or self.num_disparities % 16:
            problems.append(f"num_disparities must be a positive multiple of 16, got {self.num_disparities}")
        if self.block_size < 1 or self.block_size % 2 == 0:
            problems.append(f"block_size must be odd >= 1, got {self.block_size}")
        if self.uniqueness_ratio < 0 or self.speckle_window_px < 0 or self.speckle_range_px < 0:
            problems.append("uniqueness_ratio, speckle_window_px and speckle_range_px must be >= 0")
        if self.mode not in _SGBM_MODES:
            problems.append(f"mode must be one of {sorted(_SGBM_MODES)}, got {self.mode!r}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class StereoScaleOptions:
    """Settings of the stereo scale estimate."""

    # Use the stereo partner, when an episode has one (and a calibration with a baseline), as a
    # metric scale source; it is trusted before the IMU.
    enabled: bool = True
    # Disparity matching.
    disparity: DisparityOptions = field(default_factory=DisparityOptions)
    # Long side of the decoded stereo images, pixels (matching cost grows with the area).
    max_long_side_px: int = 640
    # Keyframes compared, evenly spread over the episode's keyframes.
    max_keyframes: int = 12
    # Points with a smaller disparity are left out (relative depth error ~ disparity error / d).
    min_disparity_px: float = 4.0
    # A sample whose four neighbouring disparities differ by more than this is at a depth edge: left out.
    max_disparity_step_px: float = 1.0
    # Refuse with fewer compared points than this.
    min_points: int = 50
    # Refuse when the ratios' robust relative spread (1.4826 MAD / median) is larger than this.
    max_rel_spread: float = 0.1

    def __post_init__(self) -> None:
        if self.max_long_side_px < 16 or self.max_keyframes < 1 or self.min_points < 1:
            raise ValueError("max_long_side_px must be >= 16, max_keyframes and min_points >= 1")
        if self.min_disparity_px <= 0 or self.max_disparity_step_px <= 0 or self.max_rel_spread <= 0:
            raise ValueError("min_disparity_px, max_disparity_step_px and max_rel_spread must be > 0")


@dataclass(frozen=True)
class StereoRig:
    """A calibrated stereo pair at one image size.

    Attributes:
        left: left camera (the episode's camera), intrinsics at the decoded size.
        right: right camera, same image size as `left`.
        right_from_left: `(4, 4)` rigid transform, left-camera to right-camera coordinates, metres.
    """

    left: Camera
    right: Camera
    right_from_left: FloatArray

    def __post_init__(self) -> None:
        if (self.left.width, self.left.height) != (self.right.width, self.right.height):
            raise InputError(
                "stereo_mismatch",
                f"left image is {self.left.width}x{self.left.height}, "
                f"right {self.right.width}x{self.right.height}",
            )
        if np.shape(self.right_from_left) != (4, 4):
            raise ShapeError("right_from_left", np.shape(self.right_from_left), "(4, 4)")


@dataclass(frozen=True)
class StereoView:
    """One keyframe seen by both cameras, with the map points it observes.

    Attributes:
        left_rgb: left image, `(H, W, 3)` uint8, at the rig's size.
        right_rgb: right image, `(H, W, 3)` uint8.
        world_from_cam: the keyframe's left-camera pose, translation in map units, `(4, 4)`.
        obs_xy: observed undistorted normalised coordinates `(x/z, y/z)` of the points, `(N, 2)`.
        points_world: the observed map points, map units, `(N, 3)`.
    """

    left_rgb: NDArray[np.uint8]
    right_rgb: NDArray[np.uint8]
    world_from_cam: FloatArray
    obs_xy: FloatArray
    points_world: FloatArray


@dataclass(frozen=True)
class StereoScale:
    """The stereo pair's answer for one episode.

    Attributes:
        metres_per_unit: metres per map unit (median ratio); None when refused (see `reason`).
        rel_spread: robust relative spread of the ratios (1.4826 MAD / median); inf when unknown.
        rel_std: relative standard error of the median (about 1.25 * rel_spread / sqrt(points)).
        points_used: point observations compared.
        keyframes_used: keyframes that gave at least one.
        reason: why the scale was refused; None when it was not.
    """

    metres_per_unit: float | None
    rel_spread: float
    rel_std: float
    points_used: int
    keyframes_used: int
    reason: str | None


def right_from_left_of_baseline(baseline_m: float) -> FloatArray:
    """`right_from_left` `(4, 4)` of parallel cameras with the right one `baseline_m` along the left's +x."""
    if not baseline_m > 0:
        raise ValueError(f"baseline_m must be > 0, got {baseline_m}")
    out = np.eye(4)
    out[0, 3] = -baseline_m
    return out


def _k_and_dist(camera: Camera) -> tuple[FloatArray, FloatArray]:
    return camera.k_matrix, np.asarray(camera.dist, np.float64)


class StereoMatcher:
    """Rectification maps and a block matcher for one rig, built once and used for every image pair.

    Attributes:
        rig: the stereo pair.
        rect_from_left: `(3, 3)` rotation `R1`, left camera to rectified left camera.
        rect_k: `(3, 3)` intrinsics of the rectified images (`P1`'s left block).
        baseline_m: distance between the rectified camera centres, metres.
    """

    def __init__(self, rig: StereoRig, opts: DisparityOptions | None = None) -> None:
        """Rectify `rig` and configure the matcher.

        Raises:
            InputError: `bad_sidecar` when the cameras are not side by side (vertical baseline) or
                the right camera is not to the right of the left one (disparities would be negative);
                `bad_intrinsics` when one camera is fisheye and the other not.
        """
        self.rig, self.opts = rig, opts or DisparityOptions()
        left, right = rig.left, rig.right
        size = (left.width, left.height)
        rot = np.ascontiguousarray(rig.right_from_left[:3, :3], np.float64)
        trans = np.ascontiguousarray(rig.right_from_left[:3, 3], np.float64).reshape(3, 1)
        (k1, d1), (k2, d2) = _k_and_dist(left), _k_and_dist(right)
        if (left.model == "fisheye") != (right.model == "fisheye"):
            raise InputError(
                "bad_intrinsics", f"left camera is {left.model}, right {right.model}: not supported"
            )
        # cv2's two undistort-rectify maps take the same arguments in the same order
        init_map: Callable[..., tuple[np.ndarray, np.ndarray]]
        if left.model == "fisheye":
            r1, r2, p1, p2, _ = cv2.fisheye.stereoRectify(
                k1, d1, k2, d2, size, rot, trans, cv2.CALIB_ZERO_DISPARITY, newImageSize=size, balance=0.0
            )
            init_map = cv2.fisheye.initUndistortRectifyMap
        else:
            r1, r2, p1, p2, *_ = cv2.stereoRectify(
                k1, d1, k2, d2, size, rot, trans, flags=cv2.CALIB_ZERO_DISPARITY, alpha=0
            )
            init_map = cv2.initUndistortRectifyMap
        if abs(p2[1, 3]) > abs(p2[0, 3]):
            raise InputError(
                "bad_sidecar", "right_from_left has a vertical baseline: only side-by-side pairs"
            )
        if p2[0, 3] >= 0:
            raise InputError(
                "bad_sidecar", "right_from_left puts the right camera to the LEFT of the left camera"
            )
        self.rect_from_left = np.asarray(r1, np.float64)
        self.rect_k = np.asarray(p1[:3, :3], np.float64)
        self.baseline_m = float(-p2[0, 3] / p2[0, 0])
        self._maps = (
            init_map(k1, d1, r1, p1, size, cv2.CV_16SC2),
            init_map(k2, d2, r2, p2, size, cv2.CV_16SC2),
        )
        o = self.opts
        self._sgbm = cv2.StereoSGBM.create(
            minDisparity=0, numDisparities=o.num_disparities, blockSize=o.block_size,
            P1=8 * o.block_size**2, P2=32 * o.block_size**2, disp12MaxDiff=o.lr_max_diff_px,
            uniquenessRatio=o.uniqueness_ratio, speckleWindowSize=o.speckle_window_px,
            speckleRange=o.speckle_range_px, mode=_SGBM_MODES[o.mode],
        )  # fmt: skip

    def disparity(self, left_rgb: NDArray[np.uint8], right_rgb: NDArray[np.uint8]) -> NDArray[np.float32]:
        """Disparity of the rectified left image, pixels, `(H, W)` float32; NaN where not matched.

        Args:
            left_rgb: left image, `(H, W, 3)` uint8 (the rig's size).
            right_rgb: right image, `(H, W, 3)` uint8.

        Raises:
            InputError: `stereo_mismatch` when an image does not have the rig's size.
        """
        expected = (self.rig.left.height, self.rig.left.width, 3)
        for name, image in (("left", left_rgb), ("right", right_rgb)):
            if image.shape != expected:
                raise InputError("stereo_mismatch", f"{name} image is {image.shape}, the rig is {expected}")
        grey = [
            cv2.remap(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), m1, m2, cv2.INTER_LINEAR)
            for image, (m1, m2) in zip((left_rgb, right_rgb), self._maps, strict=True)
        ]
        raw = self._sgbm.compute(grey[0], grey[1])
        disp = raw.astype(np.float32) / 16.0
        disp[raw <= 0] = np.nan  # invalid matches are -16; zero disparity is a point at infinity
        return disp

    def depth_at(
        self, disparity: NDArray[np.float32], obs_xy: FloatArray, max_step_px: float = 1.0
    ) -> tuple[FloatArray, FloatArray]:
        """Left-camera depth along undistorted normalised rays, from a `disparity` image.

        Args:
            disparity: output of `disparity`, `(H, W)`.
            obs_xy: undistorted normalised coordinates `(x/z, y/z)` in the left camera, `(N, 2)`.
            max_step_px: a sample whose four neighbouring disparities differ by more is refused
                (the ray falls on a depth edge, where bilinear interpolation mixes two surfaces).

        Returns:
            (depth, metres, `(N,)`; disparity, pixels, `(N,)`), NaN where unmatched, outside the
            rectified image or on an edge.
        """
        obs_xy = np.asarray(obs_xy, np.float64)
        if obs_xy.ndim != 2 or obs_xy.shape[1] != 2:
            raise ShapeError("obs_xy", obs_xy.shape, "(N, 2)")
        rays = self.rect_from_left @ np.column_stack([obs_xy, np.ones(len(obs_xy))]).T  # (3, N)
        in_front = rays[2] > 1e-9
        z_rect = np.where(in_front, rays[2], 1.0)
        k = self.rect_k
        u = k[0, 0] * rays[0] / z_rect + k[0, 2]
        v = k[1, 1] * rays[1] / z_rect + k[1, 2]
        d = _sample_bilinear(disparity, u, v, max_step_px)
        d[~in_front] = np.nan
        depth = k[0, 0] * self.baseline_m / (d * z_rect)
        return depth, d

    def depth_map(self, disparity: NDArray[np.float32], max_step_px: float = 1.0) -> NDArray[np.float32]:
        """Depth of every left (original, distorted) pixel, metres, `(H, W)` float32; NaN where unknown."""
        h, w = self.rig.left.height, self.rig.left.width
        rows, cols = np.mgrid[0:h, 0:w]
        xy = self.rig.left.cam_ray_from_img(np.column_stack([cols.ravel(), rows.ravel()]).astype(np.float64))
        depth, _ = self.depth_at(disparity, xy, max_step_px)
        return depth.reshape(h, w).astype(np.float32)


def _sample_bilinear(image: NDArray[np.float32], u: FloatArray, v: FloatArray, max_step: float) -> FloatArray:
    """`image` at sub-pixel `(u, v)` `(N,)`; NaN outside, next to NaN or where neighbours differ > `max_step`.

    Returns:
        `(N,)` float64.
    """
    h, w = image.shape
    u0, v0 = np.floor(u), np.floor(v)
    inside = np.isfinite(u0) & np.isfinite(v0) & (u0 >= 0) & (v0 >= 0) & (u0 < w - 1) & (v0 < h - 1)
    out = np.full(len(u), np.nan)
    if not inside.any():
        return out
    c, r = u0[inside].astype(np.intp), v0[inside].astype(np.intp)
    quad = np.stack([image[r, c], image[r, c + 1], image[r + 1, c], image[r + 1, c + 1]]).astype(np.float64)
    fu, fv = u[inside] - c, v[inside] - r
    weights = np.stack([(1 - fu) * (1 - fv), fu * (1 - fv), (1 - fu) * fv, fu * fv])
    value = (quad * weights).sum(axis=0)
    smooth = np.isfinite(quad).all(axis=0) & (np.ptp(quad, axis=0) <= max_step)
    out[inside] = np.where(smooth, value, np.nan)
    return out


def scale_from_depths(
    stereo_depth_m: FloatArray, map_depth_units: FloatArray, opts: StereoScaleOptions, keyframes_used: int = 0
) -> StereoScale:
    """Metres per map unit from paired depths of the same points: the median ratio and its spread.

    Args:
        stereo_depth_m: metric depths from stereo, `(N,)`; NaN where unknown.
        map_depth_units: the same points' depths in the map, map units, `(N,)`.
        opts: `min_points`, `max_rel_spread`.
        keyframes_used: reported as given.

    Returns:
        The estimate; `metres_per_unit` is None with a `reason` when refused.
    """
    stereo_depth_m, map_depth_units = np.asarray(stereo_depth_m, float), np.asarray(map_depth_units, float)
    if stereo_depth_m.shape != map_depth_units.shape or stereo_depth_m.ndim != 1:
        raise ShapeError("stereo_depth_m / map_depth_units", stereo_depth_m.shape, "(N,) both")
    ok = (
        np.isfinite(stereo_depth_m)
        & np.isfinite(map_depth_units)
        & (stereo_depth_m > 0)
        & (map_depth_units > 0)
    )
    n = int(ok.sum())
    if n < opts.min_points:
        reason = f"{n} points with a stereo and a map depth are too few (need {opts.min_points})"
        logger.info("stereo scale refused: %s", reason)
        return StereoScale(None, float("inf"), float("inf"), n, keyframes_used, reason)
    ratio = stereo_depth_m[ok] / map_depth_units[ok]
    median = float(np.median(ratio))
    spread = _MAD_TO_STD * float(np.median(np.abs(ratio - median))) / median
    # The median's standard error is sqrt(pi / 2) ~ 1.25 times the mean's for normal errors.
    rel_std = 1.25 * spread / np.sqrt(n)
    if spread > opts.max_rel_spread:
        reason = f"the depth ratios spread {spread:.3f} (relative), more than {opts.max_rel_spread}"
        logger.info("stereo scale refused: %s", reason)
        return StereoScale(None, spread, rel_std, n, keyframes_used, reason)
    return StereoScale(median, spread, rel_std, n, keyframes_used, None)


def stereo_scale(
    matcher: StereoMatcher, views: Sequence[StereoView], opts: StereoScaleOptions
) -> StereoScale:
    """Metres per map unit of a monocular map from keyframes seen by a calibrated stereo pair.

    Each view's observed map points are moved into its camera (`cam_from_world`) for their map
    depth; their stereo depth is read along the observed ray (`StereoMatcher.depth_at`), keeping
    disparities of at least `opts.min_disparity_px`.

    Args:
        matcher: the rig's matcher (rectification at the views' image size).
        views: keyframes with both images and their observed map points.
        opts: settings.

    Returns:
        The estimate (see `scale_from_depths`).

    Raises:
        ShapeError: a view's arrays do not have the documented shapes.

    Example:
        >>> rig = StereoRig(Camera(64, 48, 50.0, 50.0, 31.5, 23.5), Camera(64, 48, 50.0, 50.0, 31.5, 23.5),
        ...                 right_from_left_of_baseline(0.1))
        >>> stereo_scale(StereoMatcher(rig), [], StereoScaleOptions()).metres_per_unit is None
        True
    """
    stereo, mapped, keyframes = [], [], 0
    for view in views:
        n = len(view.obs_xy)
        if (
            view.obs_xy.shape != (n, 2)
            or view.points_world.shape != (n, 3)
            or view.world_from_cam.shape != (4, 4)
        ):
            raise ShapeError(
                "obs_xy / points_world / world_from_cam",
                view.points_world.shape,
                f"({n}, 2), ({n}, 3), (4, 4)",
            )
        rot, t = view.world_from_cam[:3, :3], view.world_from_cam[:3, 3]
        map_depth = ((view.points_world - t) @ rot)[:, 2]  # z of R^T (X - t)
        depth, disp = matcher.depth_at(
            matcher.disparity(view.left_rgb, view.right_rgb), view.obs_xy, opts.max_disparity_step_px
        )
        depth[~(disp >= opts.min_disparity_px)] = np.nan
        keyframes += bool(np.isfinite(depth).any())
        stereo.append(depth)
        mapped.append(map_depth)
    if not views:
        return scale_from_depths(np.zeros(0), np.zeros(0), opts)
    return scale_from_depths(np.concatenate(stereo), np.concatenate(mapped), opts, keyframes)
