"""Geometry value types and conversions: rigid transforms, camera model, foreign layouts."""

from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import Rigid3

__all__ = ["Camera", "Rigid3"]
