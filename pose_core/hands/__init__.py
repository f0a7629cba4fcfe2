"""Hands: 21-keypoint estimation, metric 3-D fit, world fusion, wearer identity and safe gap filling.

Stages: an estimator (`HandEstimator`; default `MediaPipeHandEstimator`, its networks on LiteRT or,
batched, in torch: `HandNetworks`) finds 2-D keypoints per frame; `fit_hand` places them in metres
in the camera frame with a hand-size prior; `hand_box` / `hand_mask` feed camera tracking; per
episode, `hands_to_world` fuses with `world_from_cam`, `assign_identities` names the wearer's hands,
`hold_hand_size` gives each hand one size, `smooth_hand_track` smooths each hand's track with a
motion model that knows a monocular fit errs in depth, `scale_from_hand_contact` finds the map's
metric scale where the hands rest on its surfaces, and `fill_gaps` fills short, safe misses;
`fuse_episode` runs those per-episode steps in order.
"""

from pose_core.hands.contact_scale import HandScale, HandScaleOptions, scale_from_hand_contact
from pose_core.hands.episode_fusion import (
    EpisodeFrames,
    EpisodeObservations,
    FusedHands,
    FusionOptions,
    fuse_episode,
)
from pose_core.hands.estimator import (
    KEYPOINT_NAMES,
    HandEstimator,
    HandObservation,
    MultiStreamEstimator,
    StreamState,
)
from pose_core.hands.fusion import (
    ScaleCandidate,
    ScaleChoice,
    choose_scale,
    hands_to_world,
    hold_hand_size,
)
from pose_core.hands.gaps import GapFillResult, GapOptions, fill_gaps
from pose_core.hands.masks import hand_box, hand_mask
from pose_core.hands.mediapipe_estimator import MediaPipeHandEstimator, MediaPipeOptions
from pose_core.hands.metric_fit import (
    FitOptions,
    HandFit,
    HandSizePrior,
    fit_hand,
    fit_hands_with_camera,
    fit_keypoints,
)
from pose_core.hands.networks import HandNetworks, LiteRtHandNetworks
from pose_core.hands.temporal import TemporalOptions, smooth_hand_track
from pose_core.hands.wearer import WearerAssignment, WearerOptions, assign_identities

__all__ = [
    "KEYPOINT_NAMES",
    "EpisodeFrames",
    "EpisodeObservations",
    "FitOptions",
    "FusedHands",
    "FusionOptions",
    "GapFillResult",
    "GapOptions",
    "HandEstimator",
    "HandFit",
    "HandNetworks",
    "HandObservation",
    "HandScale",
    "HandScaleOptions",
    "HandSizePrior",
    "LiteRtHandNetworks",
    "MediaPipeHandEstimator",
    "MediaPipeOptions",
    "MultiStreamEstimator",
    "ScaleCandidate",
    "ScaleChoice",
    "StreamState",
    "TemporalOptions",
    "WearerAssignment",
    "WearerOptions",
    "assign_identities",
    "choose_scale",
    "fill_gaps",
    "fit_hand",
    "fit_hands_with_camera",
    "fit_keypoints",
    "fuse_episode",
    "hand_box",
    "hand_mask",
    "hands_to_world",
    "hold_hand_size",
    "smooth_hand_track",
    "scale_from_hand_contact",
]
