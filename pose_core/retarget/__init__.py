"""Cross-embodiment retargeting: URDF kinematics, batched DLS IK, arm and dexterous-hand retargeting."""

from pose_core.retarget.arm import (
    RetargetOptions,
    RetargetResult,
    false_runs,
    retarget_wrist_trajectory,
    world_from_base_at_wrists,
)
from pose_core.retarget.embodiment import ROBOTS_DIR_ENV, Embodiment, load_embodiment
from pose_core.retarget.hand import HandRetargetOptions, HandRetargetResult, retarget_hand_keypoints
from pose_core.retarget.wrist import (
    as_right_hand,
    grip_aperture_from_keypoints,
    keypoints_in_wrist,
    wrist_from_keypoints,
)

__all__ = [
    "ROBOTS_DIR_ENV",
    "Embodiment",
    "HandRetargetOptions",
    "HandRetargetResult",
    "RetargetOptions",
    "RetargetResult",
    "as_right_hand",
    "false_runs",
    "grip_aperture_from_keypoints",
    "keypoints_in_wrist",
    "load_embodiment",
    "retarget_hand_keypoints",
    "retarget_wrist_trajectory",
    "world_from_base_at_wrists",
    "wrist_from_keypoints",
]
