"""Cross-embodiment retargeting: URDF kinematics, batched DLS IK, arm and dexterous-hand retargeting."""

from pose_core.retarget.arm import (
    RetargetOptions,
    RetargetResult,
    false_runs,
    margins_from_home,
    retarget_wrist_trajectory,
    smoothed_world_targets,
)
from pose_core.retarget.embodiment import Embodiment, embodiment_from_profile
from pose_core.retarget.hand import HandRetargetOptions, HandRetargetResult, retarget_hand_keypoints
from pose_core.retarget.orientation import OrientationSpec
from pose_core.retarget.placement import (
    PlacementOptions,
    search_base,
    world_from_base_at_wrists,
)
from pose_core.retarget.smoothing import SmoothingOptions
from pose_core.retarget.wrist import (
    as_right_hand,
    grip_aperture_from_keypoints,
    keypoints_in_wrist,
    wrist_from_keypoints,
)

__all__ = [
    "Embodiment",
    "HandRetargetOptions",
    "HandRetargetResult",
    "OrientationSpec",
    "PlacementOptions",
    "RetargetOptions",
    "RetargetResult",
    "SmoothingOptions",
    "as_right_hand",
    "embodiment_from_profile",
    "false_runs",
    "grip_aperture_from_keypoints",
    "keypoints_in_wrist",
    "margins_from_home",
    "retarget_hand_keypoints",
    "retarget_wrist_trajectory",
    "search_base",
    "smoothed_world_targets",
    "world_from_base_at_wrists",
    "wrist_from_keypoints",
]
