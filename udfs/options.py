"""Every adapter stage's options, in one light module.

`jobs.config` builds the pipeline's configuration (and `conf/default.yaml`, whose comments are the
comments here) from these dataclasses; keeping them apart from the adapters' code means reading the
configuration loads no Spark, pandas, video decoders or plotting libraries. Each adapter imports its
options from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pose_core.camera_poses.self_calibration import SelfCalibrationOptions
from pose_core.camera_poses.tracking import TrackingOptions
from pose_core.hands.mediapipe_estimator import MediaPipeOptions
from pose_core.hands.metric_fit import FitOptions
from pose_core.identities import WEARER_HANDS
from pose_core.privacy.faces import FaceBlurOptions
from pose_core.qa.flags import QAThresholds
from pose_core.retarget.arm import RetargetOptions
from pose_core.retarget.hand import HandRetargetOptions
from pose_core.retarget.quality import QualityThresholds
from pose_core.training.tensors import TensorOptions
from pose_core.training.timeline import TimelineOptions
from udfs.media.options import DecodeOptions

__all__ = [
    "BASE_PLACEMENTS",
    "ActionsOptions",
    "CameraTrackingOptions",
    "DecodeOptions",
    "EstimatorOptions",
    "ExportOptions",
    "HandsOptions",
    "ProbeOptions",
    "QAOptions",
    "RetargetStageOptions",
]

#: Where an arm's base stands: the profile's pose, at each hand's median wrist, or searched per episode.
BASE_PLACEMENTS = ("profile", "wrist_median", "search")


@dataclass(frozen=True)
class ProbeOptions:
    """Limits and decode-check settings of the probe."""

    # Larger files are rejected `too_large` before anything is read.
    max_size_bytes: int = 50 * 2**30
    # Longer clips are rejected `too_long`, seconds.
    max_duration_s: float = 4 * 3600.0
    # Fewer decodable frames are rejected `too_short`.
    min_frames: int = 2
    # Narrower frames are rejected `too_small`, pixels.
    min_width: int = 64
    # Lower frames are rejected `too_small`, pixels.
    min_height: int = 64
    # Videos with more pixels per frame are rejected `frames_too_large` before any frame is decoded
    # (a 16384x16384 stream would need 0.8 GB per decoded frame); 8K UHD is 33 Mpx.
    max_pixels: int = 8192 * 8192
    # `probe_with_timeout` kills the probe after this many seconds (`decode_timeout`).
    timeout_s: float = 120.0
    # full = decode every frame (finds damage anywhere); sampled = demux-count, decode samples only.
    decode_check: Literal["full", "sampled"] = "full"
    # Frames spread evenly over the clip whose pHashes are kept for near-duplicate detection.
    sample_frames: int = 8
    # (max - min - one tick) / median of frame durations above this = variable frame rate.
    vfr_tolerance: float = 0.05
    # Attach the IMU embedded in a video (GoPro GPMF track) when it has no `.imu.csv` sidecar.
    embedded_imu: bool = True


@dataclass(frozen=True)
class CameraTrackingOptions:
    """Stage tracking: shard linking, hand masking and monocular tracking per episode."""

    # Tracks of two neighbouring shards are one track when, in the overlap frames, they are mutual
    # nearest neighbours within this distance, pixels. 0.5 links too few (synthetic sample, 240 frames
    # in 3 shards: ATE 0.39 % vs 0.26 % of the path at 1.0): fresh FAST corners are pixel-quantised.
    link_max_px: float = 1.0
    # Features inside a hands_cam box grown by this many pixels per side are dropped (when hands_cam exists).
    hand_margin_px: float = 4.0
    # Frame-to-frame tracking, keyframes and local bundle adjustment.
    tracker: TrackingOptions = field(default_factory=TrackingOptions)
    # Without a calibration: estimate the focal and a radial term after a first pass, track again with them.
    self_calibration: SelfCalibrationOptions = field(default_factory=SelfCalibrationOptions)


#: Rows the tracking and completion units read: `features` plus the episode's calibration sidecar,
#: its decoded frame size and the frame's hand boxes (a joined view, not a stored table).


@dataclass(frozen=True)
class EstimatorOptions:
    """Which 2-D hand model runs, on what images."""

    # "mediapipe" (default, models from `python -m conf.models`) or the name of an entry point in
    # the group `egolake.hand_estimators` whose factory takes these options.
    kind: str = "mediapipe"
    # Long side of the frames given to the estimator, pixels (the decoder resizes); 0 keeps the native size.
    max_long_side_px: int = 640
    # Frames decoded and passed to the estimator per call.
    batch_frames: int = 32
    # Shards of a GPU task that go through the estimator together, each tracked on its own: every network
    # call is batched over them (what keeps a GPU busy; memory: this many chunks of `batch_frames` frames
    # at once). A CPU task runs its shards one at a time: LiteRT runs one input per invoke.
    lockstep_shards: int = 8
    # Settings of the MediaPipe estimator.
    mediapipe: MediaPipeOptions = field(default_factory=MediaPipeOptions)

    def __post_init__(self) -> None:
        if self.max_long_side_px < 0 or self.batch_frames < 1 or self.lockstep_shards < 1:
            raise ValueError(
                f"hands.estimator: max_long_side_px must be >= 0, batch_frames and lockstep_shards >= 1, "
                f"got {self.max_long_side_px}, {self.batch_frames}, {self.lockstep_shards}"
            )


@dataclass(frozen=True)
class HandsOptions:
    """Stage `hands`: per-frame 2-D hands and their metric fit in the camera frame."""

    # The hand model and the resolution it sees.
    estimator: EstimatorOptions = field(default_factory=EstimatorOptions)
    # The metric fit (hand-size prior, depth limits).
    fit: FitOptions = field(default_factory=FitOptions)
    # Hand boxes (for tracking's masks) grow by this fraction of their larger side on each side.
    box_margin: float = 0.15


@dataclass(frozen=True)
class ActionsOptions:
    """Stage `actions`: the action timeline per episode and wearer hand, and the episode's task text."""

    # Segmentation thresholds (wrist speed, grip aperture, contact cue, minimum durations).
    timeline: TimelineOptions = field(default_factory=TimelineOptions)
    # Task text of episodes whose input has no task sidecar (`task_source` = conf).
    default_task_text: str = "manipulate objects with the hands"
    # Hand identities (of `hands_world`) that get a timeline; one timeline each, missing where absent.
    identities: tuple[str, ...] = WEARER_HANDS


@dataclass(frozen=True)
class RetargetStageOptions:
    """Where profiles and URDFs are, how robot bases are placed, which steps are valid, the solvers."""

    # Robots root holding the URDFs (conf/embodiments/README.md); empty: $EGOLAKE_ROBOTS_DIR.
    robots_dir: str = ""
    # Folder of the profiles <name>.yaml; empty: the project's conf/embodiments.
    profiles_dir: str = ""
    # Where each arm's base stands: "profile" (the profile's world_from_base, for a z-up metric world),
    # "wrist_median" (upright against gravity, facing the first camera's forward, turned as the profile
    # says, moved so each hand's median wrist lands on the workspace centre; for a world that is the first
    # camera's frame, as hands_world's is) or "search" (from there, the position and yaw that reach most
    # of each hand's trajectory: retarget.arm.placement).
    base_placement: str = "search"
    # Gravity (down) in the world for "wrist_median" and "search" when hands_world has no gravity_dir_world
    # (no IMU): the first camera's y, i.e. a first frame held level.
    default_gravity_dir_world: tuple[float, float, float] = (0.0, 1.0, 0.0)
    # A hand whose wrist is farther than this from the camera centre is a failed fit, not motion to follow
    # (an adult's arm reaches ~0.75 m from the eyes): its steps are invalid (`beyond_reach`), metres.
    max_hand_distance_m: float = 0.9
    # hands_world identities retargeted, each to its own copy of every embodiment.
    identities: tuple[str, ...] = WEARER_HANDS
    # Arm solver: smoothed targets, base search, chunked DLS IK, the trajectory fit within the limits.
    arm: RetargetOptions = field(default_factory=RetargetOptions)
    # Dexterous-hand solver: keypoint-vector retargeting.
    hand: HandRetargetOptions = field(default_factory=HandRetargetOptions)
    # Which episodes a robot's dataset keeps (robot_quality.passed).
    quality: QualityThresholds = field(default_factory=QualityThresholds)

    def __post_init__(self) -> None:
        if self.base_placement not in BASE_PLACEMENTS:
            raise ValueError(
                f"retarget.base_placement must be one of {BASE_PLACEMENTS}, got {self.base_placement!r}"
            )
        if self.max_hand_distance_m <= 0:
            raise ValueError(f"retarget.max_hand_distance_m must be > 0, got {self.max_hand_distance_m}")


@dataclass(frozen=True)
class ExportOptions:
    """The `export` stage: LeRobot v3 datasets, one immutable version per change."""

    # Dataset name: datasets are written to OUTPUT/datasets/<name>/v<N>.
    name: str = "hands"
    # State/action tensors: rate, action mode, keypoints.
    tensors: TensorOptions = field(default_factory=TensorOptions)
    # Video frame width, pixels (the same for every episode; other aspect ratios are letterboxed).
    image_width: int = 320
    # Video frame height, pixels.
    image_height: int = 240
    # Export the egocentric video (observation.images.ego); false writes tensors only.
    video: bool = True
    # Also export observation.images.ego_overlay: the ego video with the exported hand keypoints
    # projected into it and drawn (a check that state and image agree; one more encode per episode).
    # Human-hands dataset only.
    overlay_video: bool = False
    # Video codec: h264 (libx264) or av1 (libsvtav1).
    codec: Literal["h264", "av1"] = "h264"
    # Encoder quality (constant rate factor; lower = better, larger).
    crf: int = 23
    # Frames between key frames: short GOPs make random access (training loaders) cheap.
    gop_size: int = 10
    # Encoder threads per episode (0: the encoder's default, one per core). 1 by default: Spark
    # already runs one task per core, so more threads only contend with the other tasks.
    encoder_threads: int = 1
    # Skip the source's in-loop deblocking filter when the dataset frame is at most this fraction of
    # the source's size (0 = never): 10-35 % less decode CPU, >= 40 dB Y-PSNR against the full decode
    # at 0.5 (bench/results/decode.md), far above the export encoder's own loss.
    skip_deblocking_below: float = 0.5
    # Episodes with a wearer hand in fewer than this fraction of their source frames are left out.
    min_hand_fraction: float = 0.2
    # Task text of episodes without a task sidecar.
    default_task: str = "manipulate objects with the hands"
    # Face blurring of every exported frame.
    privacy: FaceBlurOptions = field(default_factory=FaceBlurOptions)
    # Also export one dataset per robot embodiment from robot_actions (when that table exists).
    robot_datasets: bool = True

    def __post_init__(self) -> None:
        if self.codec not in ("h264", "av1"):
            raise ValueError(f"export.codec must be h264 or av1, got {self.codec!r}")
        if self.image_width % 2 or self.image_height % 2 or min(self.image_width, self.image_height) < 2:
            raise ValueError(
                f"export image size must be even and >= 2, got {self.image_width}x{self.image_height}"
            )
        if self.encoder_threads < 0:
            raise ValueError(f"export.encoder_threads must be >= 0, got {self.encoder_threads}")
        if not 0.0 <= self.min_hand_fraction <= 1.0:
            raise ValueError(f"export.min_hand_fraction must be in [0, 1], got {self.min_hand_fraction}")
        if not self.name or "/" in self.name or self.name.startswith(("_", ".")):
            raise ValueError(f"export.name must be a plain folder name, got {self.name!r}")


@dataclass(frozen=True)
class QAOptions:
    """Quality checks and the evidence pages under OUTPUT/qa."""

    # Limits of the quality flags; an episode passes when none is exceeded.
    thresholds: QAThresholds = field(default_factory=QAThresholds)
    # At most this many video frames are embedded in an episode page (evenly spaced; every frame
    # when the episode is shorter); the slider steps through every frame (up to `max_page_points`). The
    # page is plotly.js (~4.6 MB) plus these frames (base64 JPEG) plus the frames' data.
    max_page_frames: int = 300
    # At most this many frames' data in an episode page: a longer episode's page cursor steps over this
    # many frames spread evenly, its paths go through them and its timelines show each stretch's lowest
    # and highest values, so a page stays a few MB whatever the length (every frame of 10 minutes was
    # 67 MB). At 30 fps the default keeps every frame of episodes up to 100 s.
    max_page_points: int = 3000
    # Long side of the embedded frames and of the overlay video, pixels.
    page_image_px: int = 400
    # JPEG quality of the embedded frames, 1..100 (400 px at 60: ~25-35 KB a frame on textured scenes).
    jpeg_quality: int = 60
    # At most this many sparse scene points in the world view (evenly subsampled).
    max_scene_points: int = 4000
    # Scene points farther than this many times their median distance from the camera path's median
    # centre are left out of the world view: a few badly triangulated points thousands of map units away
    # set its scale and shrank the camera path to a dot. 0 keeps every point.
    scene_points_max_distance: float = 4.0
    # A camera frustum is drawn along the trajectory every this many seconds.
    frustum_every_s: float = 0.5
    # Frustum depth as a fraction of the trajectory's extent.
    frustum_size: float = 0.05
    # How far ahead the wrist's future path reaches, seconds.
    wrist_horizon_s: float = 1.0
    # Also write the overlay as OUTPUT/qa/<episode_id>/overlay.mp4 (H.264).
    overlay_video: bool = True

    def __post_init__(self) -> None:
        if (self.max_page_frames < 1 or self.max_page_points < 20 or self.page_image_px < 32
                or not 1 <= self.jpeg_quality <= 100):
            raise ValueError("qa: max_page_frames >= 1, max_page_points >= 20, page_image_px >= 32 and "
                             "jpeg_quality in 1..100 needed")
        if (self.frustum_every_s <= 0 or self.wrist_horizon_s <= 0 or self.max_scene_points < 0
                or self.scene_points_max_distance < 0):
            raise ValueError("qa: frustum_every_s and wrist_horizon_s must be > 0, max_scene_points and "
                             "scene_points_max_distance >= 0")
