"""Wearer association: which hands are the camera wearer's, which is left and right, held over time.

Every decision uses evidence that holds without metric depth: a monocular fit's depth is only as good
as the hand-size prior and the intrinsics, and on a blurred or half-visible hand it is off by tens of
centimetres. A label is a property of a whole track, decided by evidence summed over its frames, so a
detector's handedness flip in a few frames cannot swap identities.

1. **Tracks.** Observations are linked frame to frame by their 2-D keypoints: Hungarian matching on
   the median palm-keypoint (wrist and finger bases) distance to each track's constant-velocity
   prediction (a finger fit that changes its articulation between frames does not break a track), in
   units of the hand's size in the image (palm size: mean wrist -> finger-base distance), plus a
   size-change term and a side term (the observation's side vote of point 3 against the track's mean
   vote: with two hands side by side, the other hand's palm can lie as near the prediction) and a cost
   per frame since the track was last seen; gated,
   and a track survives short misses (its prediction moving on for a few frames only). Where a track
   was lost for a while and its side votes (point 3) before and after disagree, it is cut: the other
   hand came back where the lost one was expected.
2. **Bystanders.** A track is another person's (``other_<n>``, in order of appearance) only with
   evidence of one in most of its frames: the wrist beyond `far_m` (twice arm's reach: depth is
   trusted only this coarsely), the forearm pointing away from the camera (fingers towards it; from
   the fit's rotation, which does not depend on the hand's scale), or an arm reaching down from the top
   into the upper half of the view; distance does not count for an arm entering from below. A third
   hand alongside both of the wearer's is another person's too.
3. **Sides.** Each wearer track votes over its frames with the detector's handedness, the forearm's
   direction in the image (the wearer's right arm comes from the lower right, also when the hand
   crosses to the left) and the side of the view it is on. Wearer tracks that overlap in time get
   different sides, the track with the most evidence first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from pose_core.errors import ShapeError
from pose_core.hands.estimator import RIGID_PALM, palm_sizes
from pose_core.identities import bystander_hand, wearer_hand

__all__ = ["WearerAssignment", "WearerOptions", "assign_identities", "bystander_evidence", "side_evidence"]

logger = logging.getLogger(__name__)

_UNMATCHED = 1e6


@dataclass(frozen=True)
class WearerOptions:
    """Settings of wearer association and identity tracking."""

    # Largest median palm-keypoint distance between an observation and a track's prediction, in hand sizes
    # (the image palm size), for one frame since the track's last observation ...
    max_match_palms: float = 1.0
    # ... growing with the frames since then, up to this many times.
    max_gate_growth: int = 3
    # A lost track's prediction moves on with its last velocity for at most this many frames, then waits
    # there: one frame's velocity of a hand leaving the view carried over a long gap lands anywhere.
    max_extrapolated_frames: int = 3
    # Matching cost per unit of |log| of the palm-size ratio between an observation and its track.
    size_cost: float = 0.5
    # Matching cost of an observation whose side vote (`side_evidence`) is opposite to its track's mean
    # vote, the votes at full strength (half this for a vote of 0): the detector's handedness alone flips
    # often, the forearm's direction and the view's side rarely.
    side_cost: float = 0.4
    # Matching cost per frame a track has gone unseen beyond one, in palms: of two tracks about as near an
    # observation, the one seen in the last frame is the likelier continuation (DeepSORT's matching
    # cascade matches recently seen tracks first for the same reason); a track lost a while waits where
    # its hand was, and the other hand passing there is not it.
    lost_frame_cost: float = 0.05
    # A track unseen for more frames than this ends.
    max_lost_frames: int = 15
    # Bystander evidence: a wrist farther than this from the camera, metres (about twice arm's reach).
    far_m: float = 1.5
    # Bystander evidence: largest component along the optical axis (z forward) of the forearm's unit
    # direction (wrist minus middle-finger base, camera frame); above it the fingers point at the camera.
    max_forearm_away: float = 0.6
    # Bystander evidence: an upward component of the forearm's image direction above this, with the
    # wrist above the optical axis, is an arm reaching down from the top.
    min_up_component: float = 0.85
    # A track is another person's when at least this fraction of its frames shows bystander evidence.
    min_other_fraction: float = 0.5
    # Side votes (each in [-1, 1], right positive): weight of the detector's handedness (2 p - 1) ...
    handedness_weight: float = 1.0
    # ... of the forearm's horizontal image direction (the wearer's right forearm points right) ...
    arm_weight: float = 1.0
    # ... and of the side of the view (tanh of the wrist's x / z over `view_scale`).
    view_weight: float = 0.5
    # Horizontal view angle (tangent) over which the view-side vote saturates.
    view_scale: float = 0.3
    # Two wearer tracks sharing at least this many frames cannot share a side.
    min_conflict_frames: int = 5
    # A track is cut in two where it was lost for at least this many frames and its side vote before and
    # after disagrees: the hand that came back is the other one (e.g. one hand leaves the view and the
    # other enters where the lost track expected it) ...
    min_split_gap_frames: int = 3
    # ... when each part has at least `min_conflict_frames` observations and a mean vote of at least
    # this size, of opposite signs.
    min_split_vote: float = 0.5

    def __post_init__(self) -> None:
        if self.max_match_palms <= 0 or self.max_gate_growth < 1 or self.max_lost_frames < 1:
            raise ValueError(
                "fusion.wearer: max_match_palms > 0, max_gate_growth >= 1, max_lost_frames >= 1 needed, got "
                f"{self.max_match_palms}, {self.max_gate_growth}, {self.max_lost_frames}"
            )
        if self.lost_frame_cost < 0:
            raise ValueError(f"fusion.wearer.lost_frame_cost must be >= 0, got {self.lost_frame_cost}")
        if self.max_extrapolated_frames < 0 or self.min_split_gap_frames < 2 or self.min_split_vote <= 0:
            raise ValueError(
                "fusion.wearer: max_extrapolated_frames >= 0, min_split_gap_frames >= 2, min_split_vote > 0 "
                f"needed, got {self.max_extrapolated_frames}, {self.min_split_gap_frames}, "
                f"{self.min_split_vote}"
            )


@dataclass(frozen=True)
class WearerAssignment:
    """Identity of every hand observation (N observations of one episode).

    Attributes:
        track_id: motion track of each observation, `(N,)` int.
        identity: ``wearer_left``, ``wearer_right`` or ``other_<n>``, `(N,)` str.
        bystander: the observation shows evidence of another person's hand, `(N,)` bool.
        identity_switch: this identity was held by another track at its previous observation, `(N,)` bool.
    """

    track_id: np.ndarray
    identity: np.ndarray
    bystander: np.ndarray
    identity_switch: np.ndarray


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def _palm_px(keypoints_px: np.ndarray) -> np.ndarray:
    """Hand size in the image: mean wrist -> finger-base distance, pixels, `(N,)`."""
    return np.maximum(palm_sizes(keypoints_px), 1.0)


def bystander_evidence(
    keypoints_cam: np.ndarray, keypoints_px: np.ndarray, opts: WearerOptions, calibrated: bool = False
) -> np.ndarray:
    """Per observation: does it show evidence of another person's hand?

    Evidence: the fingers pointing at the camera, an arm reaching down from the top into the upper half
    of the view, or the wrist beyond `far_m`; without a calibration, distance does not count for an arm
    that enters from below (its forearm not pointing up in the image, its wrist below the optical
    axis), the wearer's own way of reaching in: a wide-angle camera's hands are placed too far under
    the focal-length prior. With calibrated intrinsics a fit's depth errs only by the hand-size prior,
    so a hand twice arm's reach away is not the wearer's wherever it enters (nor, often, a hand at all:
    a detection on a skin-coloured texture).

    Args:
        keypoints_cam: camera-frame keypoints, metres, `(N, 21, 3)` (scale only matters for `far_m`).
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        opts: settings.
        calibrated: the fits used calibrated intrinsics (a calibration sidecar), not a focal prior.

    Returns:
        `(N,)` bool.
    """
    wrist = keypoints_cam[:, 0]
    far = np.linalg.norm(wrist, axis=-1) > opts.far_m
    facing = _unit(wrist - keypoints_cam[:, 9])[:, 2] > opts.max_forearm_away
    arm_px = _unit(keypoints_px[:, 0] - keypoints_px[:, 9])
    from_top = (-arm_px[:, 1] > opts.min_up_component) & (wrist[:, 1] < 0.0)
    from_below = (arm_px[:, 1] >= 0.0) & (wrist[:, 1] > 0.0)
    return facing | from_top | (far & (calibrated | ~from_below))


def side_evidence(
    keypoints_cam: np.ndarray, keypoints_px: np.ndarray, p_right: np.ndarray, opts: WearerOptions
) -> np.ndarray:
    """Per-observation vote for the wearer's right (> 0) or left (< 0) hand.

    Args:
        keypoints_cam: camera-frame keypoints, `(N, 21, 3)` (only the wrist's direction x / z is used).
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        p_right: detector probability of a right hand, `(N,)`.
        opts: settings (the weights).

    Returns:
        `(N,)`, in [-w, w] with w the sum of the weights.
    """
    arm_x = _unit(keypoints_px[:, 0] - keypoints_px[:, 9])[:, 0]
    wrist = keypoints_cam[:, 0]
    view = np.tanh(wrist[:, 0] / np.maximum(wrist[:, 2], 1e-6) / opts.view_scale)
    return opts.handedness_weight * (2.0 * p_right - 1.0) + opts.arm_weight * arm_x + opts.view_weight * view


@dataclass
class _Track:
    """A motion track while it is being linked."""

    keypoints_px: np.ndarray  # (21, 2) last observation
    velocity_px: np.ndarray  # (21, 2) per frame
    frame: int
    size_px: float
    vote_sum: float
    count: int

    def cost(
        self, keypoints_px: np.ndarray, size_px: float, vote: float, frame: int, opts: WearerOptions
    ) -> float:
        """Matching cost of an observation, or `_UNMATCHED` outside the gate."""
        gap = frame - self.frame
        predicted = self.keypoints_px + self.velocity_px * min(gap, opts.max_extrapolated_frames)
        scale = max(size_px, self.size_px)
        palm = list(RIGID_PALM)
        distance = float(np.median(np.linalg.norm(keypoints_px[palm] - predicted[palm], axis=-1))) / scale
        if distance > opts.max_match_palms * min(gap, opts.max_gate_growth):
            return _UNMATCHED
        size = opts.size_cost * abs(np.log(size_px / self.size_px))
        full = opts.handedness_weight + opts.arm_weight + opts.view_weight  # a vote's largest size
        side = opts.side_cost * abs(vote - self.vote_sum / self.count) / (2.0 * full) if full > 0 else 0.0
        return distance + size + side + opts.lost_frame_cost * (gap - 1)

    def extend(self, keypoints_px: np.ndarray, size_px: float, vote: float, frame: int) -> None:
        self.velocity_px = (keypoints_px - self.keypoints_px) / (frame - self.frame)
        self.keypoints_px, self.size_px, self.frame = keypoints_px, size_px, frame
        self.vote_sum += vote
        self.count += 1


def _link_tracks(
    frame_idx: np.ndarray, keypoints_px: np.ndarray, votes: np.ndarray, opts: WearerOptions
) -> np.ndarray:
    """Motion tracks by 2-D keypoints: Hungarian matching to constant-velocity predictions, gated.

    Args:
        frame_idx: sorted frames of the observations, `(N,)`.
        keypoints_px: `(N, 21, 2)` pixels.
        votes: side vote of each observation, `(N,)` (`side_evidence`).
        opts: settings.

    Returns:
        Track of each observation, `(N,)` int, numbered in order of appearance.
    """
    track_id = np.full(len(frame_idx), -1)
    size = _palm_px(keypoints_px)
    tracks: list[_Track] = []
    for frame in np.unique(frame_idx):
        members = np.flatnonzero(frame_idx == frame)
        live = [t for t, track in enumerate(tracks) if frame - track.frame <= opts.max_lost_frames]
        if live:
            cost = np.array([
                [tracks[t].cost(keypoints_px[o], size[o], votes[o], int(frame), opts) for t in live]
                for o in members
            ])  # fmt: skip
            for row, col in zip(*linear_sum_assignment(cost), strict=True):
                if cost[row, col] < _UNMATCHED:
                    track_id[members[row]] = live[col]
        for obs in members:
            if track_id[obs] < 0:
                track_id[obs] = len(tracks)
                tracks.append(
                    _Track(keypoints_px[obs], np.zeros((21, 2)), int(frame), size[obs], votes[obs], 1)
                )
            else:
                tracks[track_id[obs]].extend(keypoints_px[obs], size[obs], votes[obs], int(frame))
    return track_id


def assign_identities(
    frame_idx: np.ndarray,
    keypoints_cam: np.ndarray,
    keypoints_px: np.ndarray,
    p_right: np.ndarray,
    opts: WearerOptions | None = None,
    calibrated: bool = False,
) -> WearerAssignment:
    """Give every hand observation of an episode a track and an identity.

    Args:
        frame_idx: frame of each observation, `(N,)` int.
        keypoints_cam: camera-frame keypoints, metres, `(N, 21, 3)`.
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        p_right: detector probability that the hand is a right hand, `(N,)`.
        opts: settings.
        calibrated: the fits used calibrated intrinsics (see `bystander_evidence`).

    Returns:
        The assignment (see `WearerAssignment`).

    Raises:
        ShapeError: an input does not have the documented shape.
    """
    opts = opts or WearerOptions()
    n = len(frame_idx)
    if keypoints_cam.shape != (n, 21, 3) or keypoints_px.shape != (n, 21, 2) or p_right.shape != (n,):
        raise ShapeError("keypoints_cam / keypoints_px / p_right", keypoints_cam.shape, f"({n}, 21, 3) etc.")
    order = np.argsort(frame_idx, kind="stable")
    inverse = np.argsort(order)
    frames, cam, px, pr = frame_idx[order], keypoints_cam[order], keypoints_px[order], p_right[order]
    evidence = side_evidence(cam, px, pr, opts)
    track = _split_by_side(_link_tracks(frames, px, evidence, opts), frames, evidence, opts)
    bystander = bystander_evidence(cam, px, opts, calibrated)
    labels = _label_tracks(track, frames, bystander, evidence, opts)
    identity = np.array([labels[int(t)] for t in track], dtype=object)
    switch = np.zeros(n, bool)
    holder: dict[str, int] = {}
    for i, (name, t) in enumerate(zip(identity, track, strict=True)):
        switch[i] = name in holder and holder[name] != t
        holder[name] = int(t)
    logger.debug("%d observations, %d tracks, identities %s", n, len(labels), sorted(set(labels.values())))
    return WearerAssignment(track[inverse], identity[inverse], bystander[inverse], switch[inverse])


def _split_by_side(
    track: np.ndarray, frames: np.ndarray, evidence: np.ndarray, opts: WearerOptions
) -> np.ndarray:
    """Cut tracks where a hand was lost and the other one came back (module docstring, point 1).

    A cut goes where the track was lost for at least `min_split_gap_frames` and the side votes of the
    parts are opposite and each at least `min_split_vote` on average over at least `min_conflict_frames`
    observations; of several such places the one with the largest summed vote of the parts, then the
    parts again. Within continuous tracking nothing is cut: a run of handedness flips is not a new hand.

    Args:
        track: track of each observation, `(N,)` int, observations sorted by frame.
        frames: `(N,)` sorted frames.
        evidence: side vote of each observation, `(N,)` (see `side_evidence`).
        opts: settings.

    Returns:
        Track of each observation, `(N,)` int, renumbered in order of appearance.
    """
    pieces = [np.flatnonzero(track == t) for t in np.unique(track)]
    done: list[np.ndarray] = []
    while pieces:
        members = pieces.pop()
        votes = np.cumsum(evidence[members])
        best, best_gain = 0, 0.0
        for cut in np.flatnonzero(np.diff(frames[members]) >= opts.min_split_gap_frames) + 1:
            n_before, n_after = cut, len(members) - cut
            before, after = votes[cut - 1], votes[-1] - votes[cut - 1]
            if (
                min(n_before, n_after) >= opts.min_conflict_frames
                and before * after < 0
                and min(abs(before) / n_before, abs(after) / n_after) >= opts.min_split_vote
                and abs(before) + abs(after) > best_gain
            ):
                best, best_gain = int(cut), abs(before) + abs(after)
        if best:
            pieces += [members[:best], members[best:]]
        else:
            done.append(members)
    split = np.empty_like(track)
    for number, members in enumerate(sorted(done, key=lambda m: int(m[0]))):
        split[members] = number
    return split


def _label_tracks(
    track: np.ndarray, frames: np.ndarray, bystander: np.ndarray, evidence: np.ndarray, opts: WearerOptions
) -> dict[int, str]:
    """Track -> identity (see the module docstring, points 2 and 3)."""
    ids = [int(t) for t in np.unique(track)]
    other = {t: bystander[track == t].mean() >= opts.min_other_fraction for t in ids}
    vote = {t: float(evidence[track == t].sum()) for t in ids}
    span = {t: set(frames[track == t].tolist()) for t in ids}
    labels: dict[int, str] = {}
    for t in sorted((t for t in ids if not other[t]), key=lambda t: -abs(vote[t])):
        preferred = "right" if vote[t] >= 0 else "left"
        for side in (preferred, "left" if preferred == "right" else "right"):
            if not any(
                labels[o] == wearer_hand(side) and len(span[o] & span[t]) >= opts.min_conflict_frames
                for o in labels
            ):
                labels[t] = wearer_hand(side)
                break
        else:
            other[t] = True  # a third hand alongside both of the wearer's
    for n, t in enumerate(sorted((t for t in ids if other[t]), key=lambda t: min(span[t]))):
        labels[t] = bystander_hand(n)
    return labels
