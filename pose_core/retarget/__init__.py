"""Cross-embodiment retargeting: URDF kinematics, batched DLS IK, arm and dexterous-hand retargeting."""

from pose_core.retarget.arm import RetargetOptions, RetargetResult, false_runs, retarget_wrist_trajectory
from pose_core.retarget.embodiment import ROBOTS_DIR_ENV, Embodiment, load_embodiment
from pose_core.retarget.hand import HandRetargetOptions, HandRetargetResult, retarget_hand_keypoints
from pose_core.retarget.wrist import grip_aperture_from_keypoints, wrist_from_keypoints

__all__ = [
    "ROBOTS_DIR_ENV",
    "Embodiment",
    "HandRetargetOptions",
    "HandRetargetResult",
    "RetargetOptions",
    "RetargetResult",
    "false_runs",
    "grip_aperture_from_keypoints",
    "load_embodiment",
    "retarget_hand_keypoints",
    "retarget_wrist_trajectory",
    "wrist_from_keypoints",
]
