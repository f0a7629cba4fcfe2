"""The features of an exported dataset: name, dtype, shape, per-dimension names and meaning.

A `FeatureSpec` is the one description of a dataset's per-frame tensors. The LeRobot writer turns
it into `meta/info.json` `features`, the dataset card documents it, and the statistics use its
masks: a dimension whose `mask_index` is set is only counted in frames where that column of the
mask feature is 1 (a missing hand is zero-filled in the data and masked, never averaged in).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Feature", "FeatureSpec", "hand_feature_spec", "robot_feature_spec"]

_HAND_BLOCK = (
    "wrist_x_m",
    "wrist_y_m",
    "wrist_z_m",
    "rot_r00",
    "rot_r10",
    "rot_r20",
    "rot_r01",
    "rot_r11",
    "rot_r21",
    "grip_aperture_m",
)
_CAMERA_BLOCK = (
    "cam_x_m",
    "cam_y_m",
    "cam_z_m",
    "rot_r00",
    "rot_r10",
    "rot_r20",
    "rot_r01",
    "rot_r11",
    "rot_r21",
)
#: Dimensions of one hand's state: wrist position (3), 6-D rotation (first two columns of R), grip (1).
HAND_STATE_DIM = len(_HAND_BLOCK)
CAMERA_DIM = len(_CAMERA_BLOCK)


@dataclass(frozen=True)
class Feature:
    """One per-frame tensor.

    Attributes:
        name: LeRobot key (`observation.state`, `action`, ...).
        dtype: `float32`, `int64` or `video`.
        shape: per-frame shape; `(H, W, 3)` for videos.
        names: one name per dimension (vectors) or `height, width, channels` (videos).
        description: what it holds, units and frame; rendered in the dataset card.
        mask: name of the mask feature whose columns say which dimensions are valid, or None.
        mask_index: per dimension, the mask column that validates it (-1: always valid).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: tuple[str, ...] | None
    description: str
    mask: str | None = None
    mask_index: tuple[int, ...] | None = None

    def info(self) -> dict[str, object]:
        """This feature as a LeRobot `info.json` entry (without the video `info` block)."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "names": list(self.names) if self.names else None,
        }


@dataclass(frozen=True)
class FeatureSpec:
    """The features of one dataset, in column order, plus what the dataset is."""

    features: tuple[Feature, ...]
    robot_type: str | None = None

    def __getitem__(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"no feature {name!r}; features: {', '.join(f.name for f in self.features)}")

    @property
    def video_keys(self) -> list[str]:
        """Names of the video features."""
        return [f.name for f in self.features if f.dtype == "video"]

    @property
    def vector_keys(self) -> list[str]:
        """Names of the non-video features."""
        return [f.name for f in self.features if f.dtype != "video"]


def _per_hand(identities: tuple[str, ...], block: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    names = tuple(f"{side}.{n}" for side in identities for n in block)
    return names, tuple(i for i in range(len(identities)) for _ in block)


def hand_feature_spec(
    identities: tuple[str, ...],
    image_hw: tuple[int, int],
    include_keypoints: bool,
    video_keys: tuple[str, ...],
) -> FeatureSpec:
    """The features of a human-hands dataset (see the dataset card for their meaning).

    Args:
        identities: hand identities, in state order (`wearer_left`, `wearer_right`).
        image_hw: video frame height and width, pixels.
        include_keypoints: add all 21 keypoints per hand as `observation.hand_keypoints`.
        video_keys: video feature names (`observation.images.ego`, optionally an overlay).
    """
    state_names, state_mask = _per_hand(identities, _HAND_BLOCK)
    present = "observation.present"
    mask_names = (*identities, "camera")
    feats = [
        Feature(
            "observation.state",
            "float32",
            (len(state_names),),
            state_names,
            "Per hand: wrist position in the world frame (m), wrist rotation as the first two columns of "
            "world_from_wrist (6-D), grip aperture thumb tip to index tip (m). 0 where absent.",
            present,
            state_mask,
        ),
        Feature(
            present,
            "float32",
            (len(mask_names),),
            mask_names,
            "1 when the hand (or camera pose) exists in this frame, else 0: masks zero-filled values.",
        ),
        Feature(
            "observation.camera_pose",
            "float32",
            (CAMERA_DIM,),
            _CAMERA_BLOCK,
            "world_from_cam: camera centre in the world frame (m when the episode has a metric scale, "
            "else map units; see the card) and the first two columns of its rotation.",
            present,
            (len(identities),) * CAMERA_DIM,
        ),
    ]
    if include_keypoints:
        kp_names, kp_mask = _per_hand(identities, tuple(f"kp{k:02d}_{a}_m" for k in range(21) for a in "xyz"))
        feats.append(
            Feature(
                "observation.hand_keypoints",
                "float32",
                (len(kp_names),),
                kp_names,
                "All 21 MediaPipe keypoints per hand, world frame, m; 0 where absent.",
                present,
                kp_mask,
            )
        )
    feats += [
        Feature(
            "action",
            "float32",
            (len(state_names),),
            state_names,
            "The state of the next frame (action_mode next) or its change from this frame (delta); "
            "the last frame repeats its state (next) or is 0 (delta).",
            "action_valid",
            state_mask,
        ),
        Feature(
            "action_valid",
            "float32",
            (len(identities),),
            identities,
            "1 when the hand is present in this frame and the next (the action is defined), else 0.",
        ),
        Feature(
            "source_frame_idx",
            "int64",
            (1,),
            None,
            "frame_idx of the source video frame (egolake tables) this dataset frame was sampled from.",
        ),
    ]
    h, w = image_hw
    feats += [
        Feature(k, "video", (h, w, 3), ("height", "width", "channels"), "RGB video frame") for k in video_keys
    ]
    return FeatureSpec(tuple(feats), robot_type="human_hands")


def robot_feature_spec(
    embodiment: str,
    joint_names: tuple[tuple[str, ...], ...],
    identities: tuple[str, ...],
    image_hw: tuple[int, int],
    video_keys: tuple[str, ...],
) -> FeatureSpec:
    """The features of a per-robot dataset: joint positions (+ gripper) per followed hand.

    Args:
        embodiment: robot profile name (the dataset's `robot_type`).
        joint_names: per identity, the names of its state dimensions (joints, then `gripper` if any).
        identities: the wearer hands the robot's arms follow, in state order.
        image_hw: video frame height and width, pixels.
        video_keys: video feature names.
    """
    names = tuple(
        f"{ident}.{j}" for ident, joints in zip(identities, joint_names, strict=True) for j in joints
    )
    mask = tuple(i for i, joints in enumerate(joint_names) for _ in joints)
    feats = [
        Feature(
            "observation.state",
            "float32",
            (len(names),),
            names,
            "Joint positions (rad or m) and gripper command retargeted from the wearer's hands "
            "(robot_actions); 0 where the hand is missing or the pose unreachable.",
            "observation.present",
            mask,
        ),
        Feature(
            "observation.present",
            "float32",
            (len(identities),),
            identities,
            "1 when the arm's joints are defined and reachable in this frame, else 0.",
        ),
        Feature(
            "action",
            "float32",
            (len(names),),
            names,
            "Joint positions of the next frame (action_mode next) or their change (delta).",
            "action_valid",
            mask,
        ),
        Feature(
            "action_valid",
            "float32",
            (len(identities),),
            identities,
            "1 when the arm is defined in this frame and the next.",
        ),
        Feature("source_frame_idx", "int64", (1,), None, "frame_idx of the source video frame."),
    ]
    h, w = image_hw
    feats += [
        Feature(k, "video", (h, w, 3), ("height", "width", "channels"), "RGB video frame") for k in video_keys
    ]
    return FeatureSpec(tuple(feats), robot_type=embodiment)
