"""Training tensors from world-frame hands and camera poses: features, resampling, state/action, stats."""

from pose_core.training.features import Feature, FeatureSpec, hand_feature_spec, robot_feature_spec
from pose_core.training.stats import aggregate_stats, feature_stats
from pose_core.training.tensors import (
    HAND_IDENTITIES,
    EpisodeTensors,
    TensorOptions,
    action_from_state,
    episode_tensors,
    nearest_source,
    robot_tensors,
    rot6d_from_matrix,
    uniform_times,
)

__all__ = [
    "HAND_IDENTITIES",
    "EpisodeTensors",
    "Feature",
    "FeatureSpec",
    "TensorOptions",
    "action_from_state",
    "aggregate_stats",
    "episode_tensors",
    "feature_stats",
    "hand_feature_spec",
    "nearest_source",
    "robot_feature_spec",
    "robot_tensors",
    "rot6d_from_matrix",
    "uniform_times",
]
