"""Settings of the qa stage: the quality thresholds and what the evidence pages embed."""

from __future__ import annotations

from dataclasses import dataclass, field

from pose_core.qa import QAThresholds

__all__ = ["QAOptions"]


@dataclass(frozen=True)
class QAOptions:
    """Quality checks and the evidence pages under OUTPUT/qa."""

    # Limits of the quality flags; an episode passes when none is exceeded.
    thresholds: QAThresholds = field(default_factory=QAThresholds)
    # At most this many video frames are embedded in an episode page (evenly spaced; every frame
    # when the episode is shorter); the slider still steps through every frame. The page is
    # plotly.js (~4.6 MB) plus these frames (base64 JPEG).
    max_page_frames: int = 300
    # Long side of the embedded frames and of the overlay video, pixels.
    page_image_px: int = 400
    # JPEG quality of the embedded frames, 1..100 (400 px at 60: ~25-35 KB a frame on textured scenes).
    jpeg_quality: int = 60
    # At most this many sparse scene points in the world view (evenly subsampled).
    max_scene_points: int = 4000
    # A camera frustum is drawn along the trajectory every this many seconds.
    frustum_every_s: float = 0.5
    # Frustum depth as a fraction of the trajectory's extent.
    frustum_size: float = 0.05
    # How far ahead the wrist's future path reaches, seconds.
    wrist_horizon_s: float = 1.0
    # Also write the overlay as OUTPUT/qa/<episode_id>/overlay.mp4 (H.264).
    overlay_video: bool = True

    def __post_init__(self) -> None:
        if self.max_page_frames < 1 or self.page_image_px < 32 or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(
                "qa: max_page_frames >= 1, page_image_px >= 32 and jpeg_quality in 1..100 needed"
            )
        if self.frustum_every_s <= 0 or self.wrist_horizon_s <= 0 or self.max_scene_points < 0:
            raise ValueError("qa: frustum_every_s and wrist_horizon_s must be > 0, max_scene_points >= 0")
