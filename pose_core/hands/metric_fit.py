"""Metric 3-D hand keypoints in the camera frame from 2-D keypoints, intrinsics and a hand-size prior.

A monocular image fixes a hand's 3-D position only up to scale; the scale comes from the hand's size.
The fit is a PnP problem: a metric hand shape (21 points, metres, hand frame) is posed rigidly
(`cam_from_hand`) so that it projects onto the detected keypoints. When the estimator gives an
articulated 3-D shape (`HandObservation.keypoints_rel_m`), the shape is its pose on the canonical
skeleton (`skeleton.retarget`: the model's bone directions, the canonical bone lengths at the prior's
size; `FitOptions.skeleton`), or the model's shape itself rescaled to the prior; without one, a flat
template hand fitted on its (near-rigid) palm keypoints only.

Hand-size prior: the mean distance from the wrist (keypoint 0) to the four finger MCP joints (5, 9, 13,
17) of an adult hand is about 0.090 m (about 0.47 of a 0.19 m hand length, wrist crease to middle
fingertip); adults spread about +-8 % (one sigma) around it. Depth scales with this number, so a hand
8 % larger than the prior is placed 8 % too far: give the wearer's own value when it is known.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import cv2
import numpy as np

from pose_core.errors import ShapeError
from pose_core.geometry.camera import Camera
from pose_core.hands.articulated import ArticulatedOptions, refine_articulated_hands
from pose_core.hands.estimator import NUM_KEYPOINTS, HandObservation, palm_sizes
from pose_core.hands.skeleton import bone_lengths, canonical_palm_size, retarget

__all__ = [
    "TEMPLATE_RIGHT_HAND",
    "FitOptions",
    "HandFit",
    "HandSizePrior",
    "fit_hand",
    "fit_hands",
    "fit_hands_with_camera",
    "fit_keypoints",
    "palm_size",
]

logger = logging.getLogger(__name__)

PALM_KEYPOINTS = (0, 1, 5, 9, 13, 17)

# A relaxed, flat right hand in its own frame: x towards the thumb, y from the wrist to the fingers,
# z out of the palm; metres, wrist at the origin, palm size (mean wrist->MCP distance) 0.090 m.
TEMPLATE_RIGHT_HAND = np.array([
    [0.000, 0.000, 0.0],
    [0.022, 0.025, 0.0], [0.043, 0.047, 0.0], [0.058, 0.068, 0.0], [0.070, 0.089, 0.0],
    [0.024, 0.090, 0.0], [0.030, 0.133, 0.0], [0.034, 0.158, 0.0], [0.037, 0.178, 0.0],
    [0.004, 0.093, 0.0], [0.004, 0.140, 0.0], [0.004, 0.168, 0.0], [0.004, 0.190, 0.0],
    [-0.015, 0.088, 0.0], [-0.019, 0.132, 0.0], [-0.022, 0.159, 0.0], [-0.024, 0.180, 0.0],
    [-0.032, 0.080, 0.0], [-0.040, 0.115, 0.0], [-0.045, 0.135, 0.0], [-0.049, 0.154, 0.0],
])  # fmt: skip


@dataclass(frozen=True)
class HandSizePrior:
    """How big a hand is assumed to be (see the module docstring for the source)."""

    # Mean distance wrist -> finger MCP joints (keypoints 5, 9, 13, 17), metres.
    palm_size_m: float = 0.090
    # Relative one-sigma spread of that size across adults (documents the depth uncertainty).
    relative_std: float = 0.08


@dataclass(frozen=True)
class FitOptions:
    """Settings of the metric hand fit."""

    # The hand-size prior that sets the metric scale.
    prior: HandSizePrior = field(default_factory=HandSizePrior)
    # Shape posed onto the keypoints when the estimator gives a 3-D hand: "canonical" (its bone
    # directions on the canonical adult skeleton at the prior's size: one size and one set of
    # proportions for every frame) or "model" (the estimator's shape rescaled to the prior's palm size).
    skeleton: Literal["canonical", "model"] = "canonical"
    # Articulated refinement of fits of a model's shape: fingers bent to the 2-D keypoints, bones rigid.
    articulated: ArticulatedOptions = field(default_factory=ArticulatedOptions)
    # Fewest finite keypoints needed to fit (fewer gives an invalid fit).
    min_keypoints: int = 6
    # Fits whose hand wrist lands nearer than this or farther than `max_depth_m` are invalid, metres.
    min_depth_m: float = 0.05
    max_depth_m: float = 5.0


@dataclass(frozen=True)
class HandFit:
    """Result of a metric hand fit.

    Attributes:
        keypoints_cam: keypoints in the camera frame, metres, `(21, 3)`; NaN when not `valid`.
        cam_from_hand: rigid transform of the shape into the camera, `(4, 4)`.
        residual_px: RMS reprojection error of the supporting keypoints, pixels.
        num_keypoints: keypoints that supported the fit.
        shape_source: ``"canonical"`` (the estimator's articulation on the canonical skeleton),
            ``"model"`` (the estimator's shape rescaled) or ``"template"``.
        valid: the fit succeeded and its depth is within the allowed range.
        model_palm_size_m: palm size of the estimator's shape before it was rescaled to the prior,
            metres as the model gives them, for ``"model"`` fits, whose size follows it;
            `fusion.hold_hand_size` uses it. NaN for canonical and template fits, whose size does not.
    """

    keypoints_cam: np.ndarray
    cam_from_hand: np.ndarray
    residual_px: float
    num_keypoints: int
    shape_source: str
    valid: bool
    model_palm_size_m: float = float("nan")


def palm_size(keypoints: np.ndarray) -> float:
    """Mean wrist -> finger-MCP distance of a hand `(21, 3)`, in its units."""
    return float(palm_sizes(keypoints))


def _invalid(shape_source: str, num: int) -> HandFit:
    return HandFit(np.full((NUM_KEYPOINTS, 3), np.nan), np.eye(4), float("nan"), num, shape_source, False)


def fit_keypoints(  # noqa: PLR0913, PLR0917 -- the PnP inputs plus options
    keypoints_px: np.ndarray,
    shape_m: np.ndarray,
    camera_k: np.ndarray,
    use: np.ndarray,
    opts: FitOptions,
    shape_source: str = "model",
) -> HandFit:
    """Pose a metric hand shape so that it projects onto 2-D keypoints (PnP), and place all 21 keypoints.

    Args:
        keypoints_px: detected keypoints, pixels, `(21, 2)`; NaN rows are missing.
        shape_m: metric hand shape, hand frame, metres, `(21, 3)` (already at the prior's size).
        camera_k: pinhole intrinsics, pixels, `(3, 3)` (undistorted keypoints).
        use: which keypoints may support the fit, `(21,)` bool.
        opts: fit settings.
        shape_source: recorded in the result.

    Returns:
        The fit; `keypoints_cam = R @ shape_m + t` for every keypoint, also the unsupported ones.

    Raises:
        ShapeError: an input does not have the documented shape.
    """
    if keypoints_px.shape != (NUM_KEYPOINTS, 2) or shape_m.shape != (NUM_KEYPOINTS, 3):
        raise ShapeError("keypoints_px / shape_m", keypoints_px.shape + shape_m.shape, "(21, 2) and (21, 3)")
    if camera_k.shape != (3, 3):
        raise ShapeError("camera_k", camera_k.shape, "(3, 3)")
    support = use & np.isfinite(keypoints_px).all(axis=1) & np.isfinite(shape_m).all(axis=1)
    num = int(support.sum())
    if num < max(opts.min_keypoints, 4):
        return _invalid(shape_source, num)
    obj = np.ascontiguousarray(shape_m[support], np.float64)
    img = np.ascontiguousarray(keypoints_px[support], np.float64)
    k = camera_k.astype(np.float64)
    ok, rvec, tvec = cv2.solvePnP(obj, img, k, None, flags=cv2.SOLVEPNP_SQPNP)
    if not ok:
        return _invalid(shape_source, num)
    rvec, tvec = cv2.solvePnPRefineLM(obj, img, k, None, rvec, tvec)
    rot = cv2.Rodrigues(rvec)[0]
    keypoints_cam = shape_m @ rot.T + tvec.reshape(1, 3)
    proj = cv2.projectPoints(obj, rvec, tvec, k, None)[0].reshape(-1, 2)
    residual = float(np.sqrt(np.mean(np.sum((proj - img) ** 2, axis=1))))
    cam_from_hand = np.eye(4)
    cam_from_hand[:3, :3], cam_from_hand[:3, 3] = rot, tvec.ravel()
    depth = keypoints_cam[0, 2]
    valid = bool(opts.min_depth_m <= depth <= opts.max_depth_m and (keypoints_cam[:, 2] > 0).all())
    return HandFit(keypoints_cam, cam_from_hand, residual, num, shape_source, valid)


def fit_hand(hand: HandObservation, camera_k: np.ndarray, opts: FitOptions | None = None) -> HandFit:
    """Metric 3-D keypoints of one detected hand, camera frame.

    Uses the estimator's articulated shape (all keypoints) when present, on the canonical skeleton or
    as it is (`FitOptions.skeleton`), else the template hand (mirrored for a left hand) on the palm
    keypoints, which barely move as fingers flex.

    Args:
        hand: one detected hand.
        camera_k: pinhole intrinsics, pixels, `(3, 3)`.
        opts: fit settings.

    Returns:
        The fit (see `HandFit`); its `keypoints_cam` are in metres, `(21, 3)`.
    """
    return fit_hands([hand], camera_k, opts)[0]


def fit_hands(
    hands: Sequence[HandObservation], camera_k: np.ndarray, opts: FitOptions | None = None
) -> list[HandFit]:
    """`fit_hand` of several hands seen with one camera.

    Their articulated refinements run as one batch (`refine_articulated_hands`): hand by hand, they
    were most of a fit's cost.
    """
    opts = opts or FitOptions()
    rigid = [_rigid_fit(hand, camera_k, opts) for hand in hands]
    refine = opts.articulated.enabled
    todo = [
        i for i, (fit, shape) in enumerate(rigid)
        if refine and shape is not None and fit.valid and np.isfinite(hands[i].keypoints_px).all()
    ]  # fmt: skip
    fits = [fit for fit, _ in rigid]
    if todo:
        refined = refine_articulated_hands(
            np.stack([hands[i].keypoints_px for i in todo]),
            np.stack([cast(np.ndarray, rigid[i][1]) for i in todo]),
            np.repeat(np.asarray(camera_k, np.float64)[None], len(todo), axis=0),
            np.stack([fits[i].cam_from_hand for i in todo]),
            opts.articulated,
        )
        for i, keypoints_cam in zip(todo, refined, strict=True):
            fits[i] = _with_keypoints(fits[i], keypoints_cam, hands[i].keypoints_px, camera_k, opts)
    return fits


def _rigid_fit(
    hand: HandObservation, camera_k: np.ndarray, opts: FitOptions
) -> tuple[HandFit, np.ndarray | None]:
    """The rigid fit of `fit_hand` and the shape `(21, 3)` to refine it with (None: a template fit)."""
    use_all = np.ones(NUM_KEYPOINTS, bool)
    if hand.keypoints_rel_m is not None and np.isfinite(hand.keypoints_rel_m).all():
        shape = hand.keypoints_rel_m - hand.keypoints_rel_m[0]
        if opts.skeleton == "canonical":
            lengths = bone_lengths() * (opts.prior.palm_size_m / canonical_palm_size())
            shape = retarget(shape, lengths)
            return fit_keypoints(hand.keypoints_px, shape, camera_k, use_all, opts, "canonical"), shape
        model_size = palm_size(shape)
        shape = shape * (opts.prior.palm_size_m / model_size)
        fit = fit_keypoints(hand.keypoints_px, shape, camera_k, use_all, opts, "model")
        return replace(fit, model_palm_size_m=model_size), shape
    mirror = np.array([-1.0, 1.0, 1.0]) if hand.handedness == "left" else np.ones(3)
    shape = TEMPLATE_RIGHT_HAND * mirror * (opts.prior.palm_size_m / palm_size(TEMPLATE_RIGHT_HAND))
    use = np.zeros(NUM_KEYPOINTS, bool)
    use[list(PALM_KEYPOINTS)] = True
    return fit_keypoints(hand.keypoints_px, shape, camera_k, use, opts, "template"), None


def _with_keypoints(
    fit: HandFit, keypoints_cam: np.ndarray, keypoints_px: np.ndarray, camera_k: np.ndarray, opts: FitOptions
) -> HandFit:
    """`fit` with refined keypoints `(21, 3)`: their reprojection residual and validity."""
    projected = keypoints_cam @ camera_k.T
    residual = projected[:, :2] / projected[:, 2:] - keypoints_px
    depth = keypoints_cam[0, 2]
    valid = bool(opts.min_depth_m <= depth <= opts.max_depth_m and (keypoints_cam[:, 2] > 0).all())
    return replace(
        fit,
        keypoints_cam=keypoints_cam,
        residual_px=float(np.sqrt(np.mean(np.sum(residual**2, axis=1)))),
        valid=valid,
    )


def fit_hands_with_camera(
    hands: Sequence[HandObservation], camera: Camera, opts: FitOptions | None = None
) -> list[HandFit]:
    """`fit_hands` for keypoints detected in (possibly distorted) images of `camera`.

    The keypoints are undistorted to the pinhole image of `camera.k_matrix` first; each fit's
    `residual_px` is measured in that undistorted image.

    Args:
        hands: detected hands, keypoints in the distorted image, pixels, `(21, 2)` each.
        camera: intrinsics and distortion of the images the hands were found in.
        opts: fit settings.

    Returns:
        One fit per hand; its `keypoints_cam` are in metres, camera frame, `(21, 3)`.
    """
    if camera.model != "pinhole":
        undistorted = []
        for hand in hands:
            rays = camera.cam_ray_from_img(hand.keypoints_px)
            pinhole_px = rays * [camera.fx, camera.fy] + [camera.cx, camera.cy]
            undistorted.append(replace(hand, keypoints_px=pinhole_px))
        hands = undistorted
    return fit_hands(hands, camera.k_matrix, opts)
