"""World-frame hands: camera-frame keypoints through `world_from_cam`, metric scale, light smoothing.

Convention: `world_from_cam` `(F, 4, 4)` maps camera coordinates to world coordinates; its translation
may be in arbitrary units (monocular tracking). `metric_scale` is metres per world unit, so the
metric camera position is `metric_scale * t`, and hands (metric in the camera frame) land at
`R @ x_in_cam + metric_scale * t`, metres.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "SCALE_SOURCES",
    "ScaleCandidate",
    "ScaleChoice",
    "ScaleSource",
    "choose_scale",
    "hands_to_world",
    "hold_hand_size",
]

logger = logging.getLogger(__name__)

ScaleSource = Literal["stereo", "imu", "hands", "user", "none"]
# Metric scale sources, most trusted first.
SCALE_SOURCES: tuple[ScaleSource, ...] = ("stereo", "imu", "hands", "user")


@dataclass(frozen=True)
class ScaleCandidate:
    """One source's metric scale.

    Attributes:
        metres_per_unit: metres per world unit; None, non-finite or non-positive: unavailable.
        rel_std: its relative standard error; None when the source cannot say (a user's value,
            poses that were metric already).
    """

    metres_per_unit: float | None
    rel_std: float | None = None


@dataclass(frozen=True)
class ScaleChoice:
    """The metric scale of an episode's camera trajectory and where it came from.

    Attributes:
        metres_per_unit: metres per world unit (1.0 with source ``"none"``: units left as they are).
        scale_source: one of `SCALE_SOURCES`, or ``"none"``.
        rel_std: relative standard error of `metres_per_unit`; None when unknown or source ``"none"``.
    """

    metres_per_unit: float
    scale_source: ScaleSource
    rel_std: float | None = None

    @property
    def metres_per_unit_std(self) -> float | None:
        """Standard error of `metres_per_unit`, metres per unit; None when unknown."""
        return None if self.rel_std is None else self.rel_std * self.metres_per_unit


def choose_scale(candidates: Mapping[ScaleSource, ScaleCandidate | float | None]) -> ScaleChoice:
    """Pick the most trusted available scale: stereo baseline, IMU, hands on surfaces, user value.

    Args:
        candidates: each computed source's scale; a bare float is a value without a standard error.
            None, non-finite or non-positive values count as unavailable.

    Returns:
        The chosen scale; ``ScaleChoice(1.0, "none")`` when no source has a value.
    """
    for source in SCALE_SOURCES:
        found = candidates.get(source)
        candidate = found if isinstance(found, ScaleCandidate) else ScaleCandidate(found)
        value = candidate.metres_per_unit
        if value is not None and np.isfinite(value) and value > 0:
            return ScaleChoice(float(value), source, candidate.rel_std)
    return ScaleChoice(1.0, "none")


def hold_hand_size(
    keypoints_cam: np.ndarray, model_palm_size_m: np.ndarray, hand_id: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Give every observation of one hand the same metric size by rescaling its fit about the camera.

    Each per-frame fit (`fit_hand`) scales the estimator's 3-D shape to the prior's palm size, so the
    noise of that frame's shape (its measured palm size) becomes depth noise: a shape measured 3 %
    too large is shrunk 3 % and placed 3 % too near. A hand's size does not change, so one size per
    hand is used instead: observation i is scaled by ``k_i = s_i / median(s over its hand)``, where
    ``s_i`` is the palm size of its model shape before rescaling. Then every frame of the hand
    uses the same factor (prior size / median model size) on the model's own shape.

    PnP is scale covariant: scaling the shape by ``k`` gives the same rotation and reprojection
    with the translation scaled by ``k``, so ``k_i * keypoints_cam[i]`` is exactly the refit.

    Args:
        keypoints_cam: per-observation fits at the prior's size, camera frame, metres, `(N, 21, 3)`.
        model_palm_size_m: palm size of each observation's model shape before rescaling (any unit
            consistent within a hand), `(N,)`; NaN for template fits, which keep their size.
        hand_id: which hand (identity or track) each observation belongs to, `(N,)`.

    Returns:
        (rescaled keypoints `(N, 21, 3)` metres, factors `k` `(N,)`; 1 where no size is known).
    """
    n = len(hand_id)
    if keypoints_cam.shape != (n, 21, 3) or model_palm_size_m.shape != (n,):
        raise ShapeError("keypoints_cam / model_palm_size_m", keypoints_cam.shape, f"({n}, 21, 3) and ({n},)")
    factors = np.ones(n)
    known = np.isfinite(model_palm_size_m) & (model_palm_size_m > 0)
    for hand in np.unique(hand_id[known]):
        members = known & (hand_id == hand)
        factors[members] = model_palm_size_m[members] / np.median(model_palm_size_m[members])
    return keypoints_cam * factors[:, None, None], factors


def hands_to_world(
    keypoints_cam: np.ndarray, world_from_cam: np.ndarray, metres_per_unit: float = 1.0
) -> np.ndarray:
    """World-frame keypoints, metres.

    Args:
        keypoints_cam: camera-frame keypoints, metres, `(F, ..., 3)` (e.g. `(F, 2, 21, 3)`); NaN stays NaN.
        world_from_cam: camera poses, `(F, 4, 4)`, translation in world units.
        metres_per_unit: metres per world unit of `world_from_cam`'s translation.

    Returns:
        Keypoints in the world frame scaled to metres, same shape as `keypoints_cam`.
    """
    if (
        world_from_cam.ndim != 3
        or world_from_cam.shape[1:] != (4, 4)
        or keypoints_cam.shape[0] != len(world_from_cam)
    ):
        raise ShapeError("world_from_cam", world_from_cam.shape, f"({keypoints_cam.shape[0]}, 4, 4)")
    rot = world_from_cam[:, :3, :3]
    trans = world_from_cam[:, :3, 3] * metres_per_unit
    extra = keypoints_cam.ndim - 2
    rot = rot.reshape(rot.shape[:1] + (1,) * extra + (3, 3))
    trans = trans.reshape(trans.shape[:1] + (1,) * extra + (3,))
    return np.einsum("...ij,...j->...i", rot, keypoints_cam) + trans
