"""One episode's world-frame hands: identities, one size per hand, world frame, smoothing, safe gaps.

The steps, in order: `assign_identities` names every camera-frame fit (wearer_left / wearer_right /
other_<n>) from motion tracks and wearer geometry; `hold_hand_size` gives each identity one metric
size; `hands_to_world` maps the fits through the camera poses at the chosen metric scale;
`smooth_hand_track` smooths each identity's track with a motion model that knows a monocular fit
errs in depth; `fill_gaps` fills the short, safe misses between trusted observations and flags them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from pose_core.camera_poses.scale import ImuScaleOptions
from pose_core.camera_poses.stereo import StereoScaleOptions
from pose_core.errors import ShapeError
from pose_core.hands.contact_scale import (
    HandScale,
    HandScaleInputs,
    HandScaleOptions,
    scale_from_hand_contact,
)
from pose_core.hands.estimator import palm_sizes
from pose_core.hands.fusion import (
    SCALE_SOURCES,
    ScaleCandidate,
    ScaleChoice,
    ScaleSource,
    choose_scale,
    hands_to_world,
    hold_hand_size,
)
from pose_core.hands.gaps import Gap, GapOptions, fill_gaps
from pose_core.hands.temporal import TemporalOptions, fit_ray_scales, smooth_hand_track
from pose_core.hands.wearer import WearerAssignment, WearerOptions, assign_identities
from pose_core.identities import is_wearer

__all__ = ["EpisodeFrames", "EpisodeObservations", "FusedHands", "FusionOptions", "fuse_episode"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FusionOptions:
    """Settings of per-episode hand fusion."""

    # Wearer association and identity tracking.
    wearer: WearerOptions = field(default_factory=WearerOptions)
    # Rules of gap filling.
    gaps: GapOptions = field(default_factory=GapOptions)
    # Hold each identity's hand size constant (one metric size per hand, see `hold_hand_size`).
    hold_hand_size: bool = True
    # The hands' motion model: each identity's track smoothed with the monocular fit's noise (see
    # `pose_core.hands.temporal`).
    temporal: TemporalOptions = field(default_factory=TemporalOptions)
    # An observation anchors a gap fill only with at least this detector score...
    min_trusted_score: float = 0.8
    # ...and at most this RMS reprojection error of its metric fit, pixels.
    max_trusted_residual_px: float = 10.0
    # Metres per world unit of the camera poses given by the user; null when not known. Its standard
    # error is recorded as null (unknown).
    user_metres_per_unit: float | None = None
    # Metric scale (and gravity direction) from the episode's IMU sidecar, when it has one.
    imu_scale: ImuScaleOptions = field(default_factory=ImuScaleOptions)
    # Metric scale from the episode's stereo partner (needs a calibration sidecar with a baseline),
    # trusted before the IMU.
    stereo_scale: StereoScaleOptions = field(default_factory=StereoScaleOptions)
    # Metric scale from the wearer's hands resting on mapped surfaces (needs the map's points), trusted
    # after the stereo pair and the IMU, before the user's value.
    hand_scale: HandScaleOptions = field(default_factory=HandScaleOptions)


@dataclass(frozen=True)
class EpisodeFrames:
    """The posed frames of an episode (F frames, increasing `frame_idx`).

    Attributes:
        frame_idx: `(F,)` int.
        ts_s: presentation times, seconds, `(F,)`.
        world_from_cam: camera poses, translation in world units, `(F, 4, 4)`.
        camera_k: pinhole intrinsics of the images the hands were fitted in, pixels, `(3, 3)`.
        image_size: (width, height) of those images, pixels.
        measured: the camera centre was measured (pose quality keyframe or motion-only, not held or
            interpolated), `(F,)` bool; None: every frame's.
    """

    frame_idx: np.ndarray
    ts_s: np.ndarray
    world_from_cam: np.ndarray
    camera_k: np.ndarray
    image_size: tuple[int, int]
    measured: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.frame_idx)
        if (
            self.ts_s.shape != (n,)
            or self.world_from_cam.shape != (n, 4, 4)
            or self.camera_k.shape != (3, 3)
            or (self.measured is not None and self.measured.shape != (n,))
        ):
            raise ShapeError(
                "ts_s / world_from_cam / camera_k", self.world_from_cam.shape, f"({n},), ({n}, 4, 4)"
            )
        if n > 1 and (np.diff(self.frame_idx) <= 0).any():
            raise ValueError("EpisodeFrames.frame_idx must be strictly increasing")


@dataclass(frozen=True)
class EpisodeObservations:
    """Every fitted hand observation of an episode (N observations).

    Attributes:
        frame_idx: frame of each observation, `(N,)` int.
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        keypoints_cam: metric fits at the prior's hand size, camera frame, metres, `(N, 21, 3)`.
        score: detector score, `(N,)`.
        p_right: detector probability of a right hand, `(N,)`.
        residual_px: RMS reprojection error of each fit, pixels, `(N,)`.
        model_palm_size_m: palm size of the model shape before rescaling, `(N,)`; NaN for template fits.
        calibrated: the fits used calibrated intrinsics (a sidecar), not a focal prior: their depths
            err only by the hand-size prior (see `pose_core.hands.wearer.bystander_evidence`).
    """

    frame_idx: np.ndarray
    keypoints_px: np.ndarray
    keypoints_cam: np.ndarray
    score: np.ndarray
    p_right: np.ndarray
    residual_px: np.ndarray
    model_palm_size_m: np.ndarray
    calibrated: bool = False

    def __post_init__(self) -> None:
        n = len(self.frame_idx)
        vectors = (self.score, self.p_right, self.residual_px, self.model_palm_size_m)
        if (
            self.keypoints_px.shape != (n, 21, 2)
            or self.keypoints_cam.shape != (n, 21, 3)
            or any(v.shape != (n,) for v in vectors)
        ):
            raise ShapeError(
                "observation arrays", self.keypoints_cam.shape, f"({n}, 21, 3), ({n}, 21, 2), ({n},)"
            )


@dataclass(frozen=True)
class FusedHands:
    """World-frame hands of an episode, one entry per (frame, identity) (M entries).

    Attributes:
        frame_idx: `(M,)` int.
        identity: ``wearer_left``, ``wearer_right`` or ``other_<n>``, `(M,)` str.
        keypoints_world: world frame, metres, `(M, 21, 3)`.
        filled: the entry was filled in a gap (no observation), `(M,)` bool.
        observation: index into the input observations, -1 for filled entries, `(M,)` int.
        identity_switch: the identity was held by another track at its previous observation, `(M,)` bool.
        size_factor: factor `hold_hand_size` applied to the observation's fit (1 for filled), `(M,)`.
        scale: metric scale of the camera poses and where it came from.
        gaps: per identity, every gap and what happened to it.
        hand_scale: the hands' own scale estimate (chosen or not); None when not computed (no map
            points given, or disabled).
    """

    frame_idx: np.ndarray
    identity: np.ndarray
    keypoints_world: np.ndarray
    filled: np.ndarray
    observation: np.ndarray
    identity_switch: np.ndarray
    size_factor: np.ndarray
    scale: ScaleChoice
    gaps: dict[str, list[Gap]]
    hand_scale: HandScale | None = None


def _best_per_frame(frame_pos: np.ndarray, identity: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Indices keeping the highest-score observation of each (frame, identity)."""
    order = np.lexsort((-score, identity.astype(str), frame_pos))
    keys = list(zip(frame_pos[order], identity[order], strict=True))
    first = [i for i, key in enumerate(keys) if i == 0 or key != keys[i - 1]]
    return np.sort(order[first])


def _identities(
    obs: EpisodeObservations, keep: np.ndarray, opts: FusionOptions
) -> tuple[np.ndarray, np.ndarray, WearerAssignment]:
    """Identities of the kept observations and their fits, held at one size per identity.

    With `hold_hand_size`, identities are assigned twice: per-frame fits are noisy in depth (a few
    cm), which breaks motion tracks; the sizes held with the first assignment's identities make the
    second assignment's tracks continuous, and its identities set the final sizes.

    Returns:
        (keypoints_cam `(K, 21, 3)` metres, size factors `(K,)`, the assignment), K = len(keep).
    """
    kp_cam, px, p_right = obs.keypoints_cam[keep], obs.keypoints_px[keep], obs.p_right[keep]
    assignment = assign_identities(obs.frame_idx[keep], kp_cam, px, p_right, opts.wearer, obs.calibrated)
    if not opts.hold_hand_size:
        return kp_cam, np.ones(len(keep)), assignment
    size = obs.model_palm_size_m[keep]
    held, _ = hold_hand_size(kp_cam, size, assignment.identity)
    assignment = assign_identities(obs.frame_idx[keep], held, px, p_right, opts.wearer, obs.calibrated)
    held, factors = hold_hand_size(kp_cam, size, assignment.identity)
    return held, factors, assignment


def fuse_episode(
    frames: EpisodeFrames,
    obs: EpisodeObservations,
    opts: FusionOptions | None = None,
    scale_candidates: Mapping[ScaleSource, ScaleCandidate | float | None] | None = None,
    points_world: np.ndarray | None = None,
) -> FusedHands:
    """World-frame, identity-labelled, gap-filled hands of one episode.

    Args:
        frames: the episode's posed frames; observations of other frames are dropped.
        obs: the episode's hand fits (invalid fits, with non-finite keypoints, are dropped).
        opts: settings.
        scale_candidates: metres per world unit of `frames.world_from_cam` from each scale source
            (see `choose_scale`); the wearer's hands on the map (source ``"hands"``, with
            `points_world`) and `opts.user_metres_per_unit` (source ``"user"``) are added.
        points_world: the map's points, world frame, units of `world_from_cam`, `(P, 3)`; None: no
            scale from the hands. Not looked at when a more trusted source (stereo, IMU) has a scale.

    Returns:
        The fused hands (see `FusedHands`), sorted by frame then identity.
    """
    opts = opts or FusionOptions()
    candidates: dict[ScaleSource, ScaleCandidate | float | None] = dict(scale_candidates or {})
    candidates.setdefault("user", opts.user_metres_per_unit)
    frame_pos = np.searchsorted(frames.frame_idx, obs.frame_idx)
    posed = (frame_pos < len(frames.frame_idx)) & (
        frames.frame_idx[np.minimum(frame_pos, len(frames.frame_idx) - 1)] == obs.frame_idx
    )
    keep = np.flatnonzero(posed & np.isfinite(obs.keypoints_cam).all(axis=(1, 2)))
    if len(keep) == 0:
        return FusedHands(
            np.zeros(0, np.int64), np.zeros(0, object), np.zeros((0, 21, 3)), np.zeros(0, bool),
            np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0), choose_scale(candidates), {},
        )  # fmt: skip
    kp_cam, factors, assignment = _identities(obs, keep, opts)
    best = _best_per_frame(frame_pos[keep], assignment.identity, obs.score[keep])
    keep, kp_cam, factors = keep[best], kp_cam[best], factors[best]
    identity, switch = assignment.identity[best], assignment.identity_switch[best]
    hand_scale = None
    trusted_before = choose_scale(candidates).scale_source in SCALE_SOURCES[: SCALE_SOURCES.index("hands")]
    if points_world is not None and opts.hand_scale.enabled and not trusted_before:
        hand_scale = _hand_scale(
            frames, points_world, frame_pos[keep], identity, kp_cam, obs.keypoints_px[keep], opts
        )
        candidates.setdefault("hands", ScaleCandidate(hand_scale.metres_per_unit, hand_scale.rel_std))
    scale = choose_scale(candidates)
    metric_world_from_cam = frames.world_from_cam.copy()
    metric_world_from_cam[:, :3, 3] *= scale.metres_per_unit
    pos = frame_pos[keep]
    world = hands_to_world(kp_cam, metric_world_from_cam[pos])
    trusted_obs = (obs.score[keep] >= opts.min_trusted_score) & (
        obs.residual_px[keep] <= opts.max_trusted_residual_px
    )
    parts: list[tuple[str, tuple[np.ndarray, ...]]] = []
    gaps: dict[str, list[Gap]] = {}
    n_frames = len(frames.frame_idx)
    for name in sorted(set(identity.tolist())):
        mine = np.flatnonzero(identity == name)
        dense = np.full((n_frames, 21, 3), np.nan)
        dense[pos[mine]] = world[mine]
        seen = np.zeros(n_frames, bool)
        seen[pos[mine]] = True
        trusted = np.zeros(n_frames, bool)
        trusted[pos[mine]] = trusted_obs[mine]
        centres, focal_px = metric_world_from_cam[:, :3, 3], float(frames.camera_k[0, 0])
        ray_scale = np.ones(n_frames)
        fits = keep[mine]
        ray_scale[pos[mine]] = fit_ray_scales(
            obs.residual_px[fits], palm_sizes(obs.keypoints_px[fits]), opts.temporal.residual_ray_power
        )
        dense = smooth_hand_track(dense, seen, frames.ts_s, centres, focal_px, opts.temporal, ray_scale)
        result = fill_gaps(
            frames.ts_s, dense, trusted, metric_world_from_cam, frames.camera_k, frames.image_size, opts.gaps
        )
        gaps[name] = result.gaps
        observation = np.full(n_frames, -1)
        observation[pos[mine]] = keep[mine]
        switched, factor = np.zeros(n_frames, bool), np.ones(n_frames)
        switched[pos[mine]], factor[pos[mine]] = switch[mine], factors[mine]
        rows = np.flatnonzero(seen | result.filled)
        parts.append((name, (rows, result.keypoints_world[rows], result.filled[rows], observation[rows],
                             switched[rows], factor[rows])))  # fmt: skip
    return _assemble(frames.frame_idx, parts, scale, gaps, hand_scale)


def _hand_scale(  # noqa: PLR0913, PLR0917 - private step of fuse_episode
    frames: EpisodeFrames, points_world: np.ndarray, frame_pos: np.ndarray, identity: np.ndarray,
    keypoints_cam: np.ndarray, keypoints_px: np.ndarray, opts: FusionOptions,
) -> HandScale:  # fmt: skip
    """The wearer's hands' scale estimate (other people's hands are left out)."""
    wearer = np.array([is_wearer(str(i)) for i in identity], bool)
    measured = np.ones(len(frames.frame_idx), bool) if frames.measured is None else frames.measured
    inputs = HandScaleInputs(
        ts_s=frames.ts_s, world_from_cam=frames.world_from_cam, measured=measured, camera_k=frames.camera_k,
        points_world=np.asarray(points_world, np.float64).reshape(-1, 3), frame_pos=frame_pos[wearer],
        hand_id=identity[wearer].astype(str), keypoints_cam=keypoints_cam[wearer],
        keypoints_px=keypoints_px[wearer],
    )  # fmt: skip
    return scale_from_hand_contact(inputs, opts.hand_scale)


def _assemble(
    frame_idx: np.ndarray, parts: list[tuple[str, tuple[np.ndarray, ...]]], scale: ScaleChoice,
    gaps: dict[str, list[Gap]], hand_scale: HandScale | None,
) -> FusedHands:  # fmt: skip
    """Concatenate per-identity entries and sort them by frame, then identity.

    ``parts`` holds, per identity, its name and its entries' columns: frame positions, then the
    `FusedHands` columns from ``keypoints_world`` to ``size_factor``.
    """
    rows = np.concatenate([cols[0] for _, cols in parts])
    identity = np.concatenate([np.full(len(cols[0]), name, dtype=object) for name, cols in parts])
    order = np.lexsort((identity.astype(str), rows))
    keypoints_world, filled, observation, identity_switch, size_factor = (
        np.concatenate([cols[i] for _, cols in parts])[order] for i in range(1, 6)
    )
    logger.debug("fused %d entries, %d identities", len(rows), len(parts))
    return FusedHands(
        frame_idx[rows[order]], identity[order], keypoints_world, filled, observation, identity_switch,
        size_factor, scale=scale, gaps=gaps, hand_scale=hand_scale,
    )  # fmt: skip
