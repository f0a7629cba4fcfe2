"""Camera model: pinhole with optional radial-tangential or equidistant (fisheye) distortion.

Convention:
    Camera frame is OpenCV's: x right, y down, z forward. Pixel ``(0, 0)`` is the centre of the
    top-left pixel. ``img_from_cam`` maps camera points to distorted pixels; ``cam_ray_from_img``
    maps distorted pixels to undistorted normalised coordinates ``(x/z, y/z)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Literal

import cv2
import numpy as np

from pose_core.errors import InputError, ShapeError

__all__ = ["Camera", "CameraModel", "IntrinsicsSource"]

logger = logging.getLogger(__name__)

CameraModel = Literal["pinhole", "radtan", "fisheye"]
# where the intrinsics came from; "estimated": from the footage by global BA (camera_poses.completion)
IntrinsicsSource = Literal["sidecar", "metadata", "prior", "estimated"]

_N_DIST = {"pinhole": 0, "radtan": 4, "fisheye": 4}
_DEFAULT_HFOV_DEG = 70.0  # horizontal field of view assumed when no calibration or metadata exists
_FULL_FRAME_WIDTH_MM = 36.0  # 35 mm equivalent sensor width


@dataclass(frozen=True)
class Camera:
    """Intrinsics of one camera.

    Attributes:
        width: image width in pixels.
        height: image height in pixels.
        fx: focal length along x, pixels.
        fy: focal length along y, pixels.
        cx: principal point x, pixels.
        cy: principal point y, pixels.
        model: ``pinhole`` (no distortion), ``radtan`` (k1, k2, p1, p2) or ``fisheye`` (k1..k4, equidistant).
        dist: distortion coefficients in OpenCV order, length 0 or 4.
        intrinsics_source: where the values came from: ``sidecar``, ``metadata`` or ``prior``, or
            ``estimated`` after global BA estimated the focal (and a radial term) from the footage.
    """

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    model: CameraModel = "pinhole"
    dist: tuple[float, ...] = ()
    intrinsics_source: IntrinsicsSource = "sidecar"

    def __post_init__(self) -> None:
        problems = []
        if self.model not in _N_DIST:
            problems.append(f"unknown camera model {self.model!r}")
        elif len(self.dist) != _N_DIST[self.model]:
            problems.append(
                f"model {self.model} needs {_N_DIST[self.model]} coefficients, got {len(self.dist)}"
            )
        if self.width <= 0 or self.height <= 0:
            problems.append(f"image size must be positive, got {self.width}x{self.height}")
        if self.fx <= 0 or self.fy <= 0:
            problems.append(f"focal lengths must be positive, got fx={self.fx} fy={self.fy}")
        if problems:
            raise InputError("bad_intrinsics", "; ".join(problems))

    @classmethod
    def from_prior(cls, width: int, height: int, focal_35mm: float | None = None) -> Camera:
        """An undistorted camera from the image size and, if known, the 35 mm equivalent focal length.

        Args:
            width: image width, pixels.
            height: image height, pixels.
            focal_35mm: focal length in 35 mm equivalent millimetres from container metadata, or None
                to assume a 70 degree horizontal field of view.

        Returns:
            A pinhole camera with the principal point at the image centre.
        """
        if focal_35mm is not None and focal_35mm > 0:
            f = focal_35mm / _FULL_FRAME_WIDTH_MM * width
            source: IntrinsicsSource = "metadata"
        else:
            f = 0.5 * width / np.tan(np.deg2rad(_DEFAULT_HFOV_DEG) / 2)
            source = "prior"
        return cls(width, height, f, f, (width - 1) / 2, (height - 1) / 2, intrinsics_source=source)

    @property
    def k_matrix(self) -> np.ndarray:
        """Calibration matrix ``img_from_cam`` (without distortion), shape ``(3, 3)``."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    @property
    def focal_px(self) -> float:
        """Mean focal length in pixels: the factor from normalised to pixel residuals."""
        return 0.5 * (self.fx + self.fy)

    def scaled(self, width: int, height: int) -> Camera:
        """The same camera for an image resized to ``width x height`` (distortion is scale free)."""
        sx, sy = width / self.width, height / self.height
        return replace(
            self,
            width=width,
            height=height,
            fx=self.fx * sx,
            fy=self.fy * sy,
            cx=(self.cx + 0.5) * sx - 0.5,
            cy=(self.cy + 0.5) * sy - 0.5,
        )

    def img_from_cam(self, x_in_cam: np.ndarray) -> np.ndarray:
        """Project camera-frame points to distorted pixels.

        Args:
            x_in_cam: points in camera frame, shape ``(N, 3)``.

        Returns:
            Pixels ``(u, v)``, shape ``(N, 2)``; NaN for points with ``z <= 0``.

        Raises:
            ShapeError: if the input is not ``(N, 3)``.
        """
        x_in_cam = np.asarray(x_in_cam, dtype=np.float64)
        if x_in_cam.ndim != 2 or x_in_cam.shape[1] != 3:
            raise ShapeError("x_in_cam", x_in_cam.shape, "(N, 3)")
        z = x_in_cam[:, 2]
        ok = z > 0
        xy = x_in_cam[:, :2] / np.where(ok, z, 1.0)[:, None]
        xy = self._distort(xy)
        uv = np.stack([self.fx * xy[:, 0] + self.cx, self.fy * xy[:, 1] + self.cy], axis=1)
        uv[~ok] = np.nan
        return uv

    def cam_ray_from_img(self, uv: np.ndarray) -> np.ndarray:
        """Undistorted normalised coordinates ``(x/z, y/z)`` of distorted pixels.

        Args:
            uv: pixels, shape ``(N, 2)``.

        Returns:
            Normalised coordinates, shape ``(N, 2)``.

        Raises:
            ShapeError: if the input is not ``(N, 2)``.
        """
        uv = np.asarray(uv, dtype=np.float64)
        if uv.ndim != 2 or uv.shape[1] != 2:
            raise ShapeError("uv", uv.shape, "(N, 2)")
        if len(uv) == 0:
            return uv.copy()
        if self.model == "pinhole":
            return np.stack([(uv[:, 0] - self.cx) / self.fx, (uv[:, 1] - self.cy) / self.fy], axis=1)
        pts = uv.reshape(-1, 1, 2)
        dist = np.asarray(self.dist, dtype=np.float64)
        if self.model == "fisheye":
            out = cv2.fisheye.undistortPoints(pts, self.k_matrix, dist)
        else:
            criteria = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 20, 1e-10)
            out = cv2.undistortPoints(pts, self.k_matrix, dist, None, None, None, criteria)
        return out.reshape(-1, 2)

    def _distort(self, xy: np.ndarray) -> np.ndarray:
        """Apply the distortion model to normalised coordinates ``(N, 2)``."""
        if self.model == "pinhole":
            return xy
        x, y = xy[:, 0], xy[:, 1]
        r2 = x * x + y * y
        if self.model == "radtan":
            k1, k2, p1, p2 = self.dist
            radial = 1 + k1 * r2 + k2 * r2 * r2
            return np.stack(
                [
                    x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x),
                    y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y,
                ],
                axis=1,
            )
        k1, k2, k3, k4 = self.dist
        r = np.sqrt(r2)
        theta = np.arctan(r)
        t2 = theta * theta
        theta_d = theta * (1 + k1 * t2 + k2 * t2**2 + k3 * t2**3 + k4 * t2**4)
        scale = np.where(r > 1e-12, theta_d / np.where(r > 1e-12, r, 1.0), 1.0)
        return xy * scale[:, None]
