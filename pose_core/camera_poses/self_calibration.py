"""Tracking with intrinsics estimated from the footage when no calibration is given.

Tracking with a wrong camera breaks where it matters most: a 70-degree prior on a wide or
distorted lens bends rays, so fast head turns lose the map (a synthetic clip with k1 = -0.2 tracked
with the pinhole prior: two maps, ATE 4.8 %). Global BA can estimate the focal and a radial term
from the map tracked with the prior (``bundle_adjust_keyframes``, with its observability guard),
but the map itself was made with the wrong camera. So, as a self-calibrating SfM does, tracking
runs once with the prior, BA estimates the camera on that map (``estimate_intrinsics``), and while
the estimate differs enough to matter, tracking runs again with it (``max_passes``); the ba stage
then refines the estimate once more (``intrinsics_source`` ``estimated``). Calibrated cameras are
tracked once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pose_core.camera_poses.ba import BAOptions
from pose_core.camera_poses.completion import CompletionOptions, estimate_intrinsics
from pose_core.camera_poses.features import FrameFeatures
from pose_core.camera_poses.tracking import TrackingOptions, TrackingResult, track_episode
from pose_core.geometry.camera import Camera

__all__ = ["SelfCalibrationOptions", "track_self_calibrated"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelfCalibrationOptions:
    """Knobs of intrinsics estimation during tracking (uncalibrated videos only)."""

    # estimate the camera after a first tracking pass and track again with it
    enabled: bool = True
    # tracking passes at most: each estimate made on a map tracked with a wrong camera is itself off
    # (a 300-frame clip with k1 = -0.2 from the 457 px prior: 578 px after the first pass, 511 after the
    # second), so tracking goes again while the estimate keeps changing
    max_passes: int = 3
    # the estimate replaces the camera tracked with when the focal moved by more than this fraction ...
    min_focal_change: float = 0.02
    # ... or the radial coefficient k1 changed by more than this
    min_radial: float = 0.02
    # also estimate k1 (else the focal only)
    radial: bool = True
    # the estimate uses at most this many keyframes, evenly spread (intrinsics need views, not all of
    # them: 150 keyframes cost a 600-frame clip 25 CPU-s, more than tracking it)
    max_keyframes: int = 40
    # global BA of the first pass's map (an estimate still moving after its iterations is used: the
    # second pass and the ba stage refine it; a 300-frame clip with k1 = -0.2 moved 457 -> 478 px in 80)
    ba: BAOptions = field(
        default_factory=lambda: BAOptions(max_iterations=10, focal_require_convergence=False)
    )


def track_self_calibrated(
    features: Sequence[FrameFeatures], camera: Camera, tracking: TrackingOptions, opts: SelfCalibrationOptions
) -> tuple[TrackingResult, Camera]:
    """Track an episode; with an uncalibrated camera, estimate it and track again while it changes.

    Args:
        features: per-frame tracks in decode order.
        camera: the calibrated camera or the prior.
        tracking: tracking options.
        opts: self-calibration options.

    Returns:
        The tracking result and the camera it was tracked with (``intrinsics_source`` ``estimated``
        when an estimate replaced the prior).
    """
    result = track_episode(features, camera, tracking)
    if not opts.enabled or camera.intrinsics_source not in ("prior", "metadata") or camera.model != "pinhole":
        return result, camera
    estimate = CompletionOptions(
        ba=opts.ba, refine_focal=True, refine_radial=opts.radial, intrinsics_keyframes=opts.max_keyframes
    )
    for _ in range(opts.max_passes - 1):
        estimated = estimate_intrinsics(result, camera, estimate).camera
        if not _differs(estimated, camera, opts):
            break
        logger.info(
            "tracking again with estimated intrinsics: focal %.1f -> %.1f px, k1 %.3f",
            camera.focal_px,
            estimated.focal_px,
            _k1(estimated),
        )
        result, camera = track_episode(features, estimated, tracking), estimated
    return result, camera


def _k1(camera: Camera) -> float:
    return camera.dist[0] if camera.model == "radtan" else 0.0


def _differs(estimated: Camera, used: Camera, opts: SelfCalibrationOptions) -> bool:
    """Whether ``estimated`` differs from the camera tracking ``used`` enough to track again."""
    focal_change = abs(estimated.focal_px / used.focal_px - 1.0)
    return estimated is not used and (
        focal_change > opts.min_focal_change or abs(_k1(estimated) - _k1(used)) > opts.min_radial
    )
