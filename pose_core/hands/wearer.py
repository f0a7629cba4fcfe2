"""Wearer association: which hands are the camera wearer's, which is left and right, held over time.

Hands are first linked into tracks by motion (wrist continuity in the camera frame), so a label is a
property of a whole track, decided by evidence summed over its frames: a detector's handedness flip in
a few frames cannot swap identities. A track is the wearer's when most of its frames pass the geometry
checks: within arm's reach of the camera, the forearm (wrist minus middle-finger base, extended past
the wrist) pointing back towards the camera rather than away from it (another person's hand reaching
towards the wearer has its wrist beyond its knuckles), and entering the view from the bottom. The
forearm is not required to point at one body point: hands turned inward over a table have forearms
running sideways towards the elbows. Wearer tracks become ``wearer_left`` / ``wearer_right`` from detector handedness and which side
of the view they are on; other tracks become ``other_<n>`` in order of appearance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from pose_core.errors import ShapeError

__all__ = ["WearerAssignment", "WearerOptions", "assign_identities", "wearer_geometry"]

logger = logging.getLogger(__name__)

_PALM = [0, 5, 9, 13, 17]


@dataclass(frozen=True)
class WearerOptions:
    """Settings of wearer association and identity tracking."""

    # A wearer's wrist is at most this far from the camera, metres (arm's reach from the head).
    max_reach_m: float = 0.9
    # Largest component along the optical axis (z forward) of the forearm's unit direction (wrist minus
    # middle-finger base, camera frame): above it the forearm points away from the camera, as another
    # person's reaching towards the wearer does.
    max_forearm_away: float = 0.6
    # Smallest downward component of the forearm's unit direction in the image (bottom entry).
    min_down_component: float = -0.3
    # Fraction of a track's frames that must pass the geometry for it to be the wearer's.
    min_wearer_fraction: float = 0.5
    # Largest palm-centre move between two consecutive observations of one track, metres.
    max_match_m: float = 0.15
    # Matching cost per unit of handedness-probability disagreement, metres.
    handedness_cost_m: float = 0.1
    # Two wearer tracks sharing at least this many frames cannot share a side.
    min_conflict_frames: int = 5
    # After a miss the gate grows with the frames since the last observation, up to this factor.
    max_gate_growth: int = 2
    # A track unseen for more frames than this ends.
    max_lost_frames: int = 15
    # Weight of the view side (wrist x in the camera) against detector handedness when picking sides.
    side_weight: float = 0.5
    # Horizontal distance over which the view-side evidence saturates, metres.
    side_scale_m: float = 0.2


@dataclass(frozen=True)
class WearerAssignment:
    """Identity of every hand observation (N observations of one episode).

    Attributes:
        track_id: motion track of each observation, `(N,)` int.
        identity: ``wearer_left``, ``wearer_right`` or ``other_<n>``, `(N,)` str.
        wearer_geometry: the observation passes the wearer geometry checks, `(N,)` bool.
        identity_switch: this identity was held by another track at its previous observation, `(N,)` bool.
    """

    track_id: np.ndarray
    identity: np.ndarray
    wearer_geometry: np.ndarray
    identity_switch: np.ndarray


def wearer_geometry(keypoints_cam: np.ndarray, keypoints_px: np.ndarray, opts: WearerOptions) -> np.ndarray:
    """Per-observation wearer checks (reach, forearm towards the body, entry from the bottom).

    Args:
        keypoints_cam: camera-frame keypoints, metres, `(N, 21, 3)`.
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        opts: settings.

    Returns:
        `(N,)` bool, True where all three checks pass.
    """
    wrist = keypoints_cam[:, 0]
    reach = np.linalg.norm(wrist, axis=-1) <= opts.max_reach_m
    forearm = wrist - keypoints_cam[:, 9]
    away = forearm[:, 2] / np.maximum(np.linalg.norm(forearm, axis=-1), 1e-9)
    forearm_px = keypoints_px[:, 0] - keypoints_px[:, 9]
    down = forearm_px[:, 1] / np.maximum(np.linalg.norm(forearm_px, axis=-1), 1e-9)
    return reach & (away <= opts.max_forearm_away) & (down >= opts.min_down_component)


def _link_tracks(
    frame_idx: np.ndarray, centres: np.ndarray, p_right: np.ndarray, opts: WearerOptions
) -> np.ndarray:
    """Motion tracks: Hungarian matching of palm centres frame to frame, gated by distance and age.

    The cost adds `handedness_cost_m` times the handedness disagreement with the track's last
    observation, which breaks ties when two hands come close; the gate uses the distance alone.
    """
    track_id = np.full(len(frame_idx), -1)
    last_centre: dict[int, np.ndarray] = {}
    last_frame: dict[int, int] = {}
    last_p: dict[int, float] = {}
    for frame in np.unique(frame_idx):
        members = np.flatnonzero(frame_idx == frame)
        live = [t for t in last_frame if frame - last_frame[t] <= opts.max_lost_frames]
        if live:
            dist = np.linalg.norm(
                centres[members][:, None] - np.array([last_centre[t] for t in live])[None], axis=-1
            )
            flip = np.abs(p_right[members][:, None] - np.array([last_p[t] for t in live])[None])
            cost = dist + opts.handedness_cost_m * flip
            for row, col in zip(*linear_sum_assignment(cost), strict=True):
                gate = opts.max_match_m * min(frame - last_frame[live[col]], opts.max_gate_growth)
                if dist[row, col] <= gate:
                    track_id[members[row]] = live[col]
        for obs in members:
            if track_id[obs] < 0:
                track_id[obs] = len(last_frame)
            last_centre[int(track_id[obs])] = centres[obs]
            last_frame[int(track_id[obs])] = int(frame)
            last_p[int(track_id[obs])] = float(p_right[obs])
    return track_id


def _side_evidence(keypoints_cam: np.ndarray, p_right: np.ndarray, opts: WearerOptions) -> np.ndarray:
    """Per-observation evidence for 'right' (> 0) or 'left' (< 0), in [-1 - w, 1 + w]."""
    view = np.tanh(keypoints_cam[:, 0, 0] / opts.side_scale_m)
    return (2.0 * p_right - 1.0) + opts.side_weight * view


def assign_identities(
    frame_idx: np.ndarray,
    keypoints_cam: np.ndarray,
    keypoints_px: np.ndarray,
    p_right: np.ndarray,
    opts: WearerOptions | None = None,
) -> WearerAssignment:
    """Give every hand observation of an episode a track and an identity.

    Args:
        frame_idx: frame of each observation, `(N,)` int.
        keypoints_cam: camera-frame keypoints, metres, `(N, 21, 3)`.
        keypoints_px: image keypoints, pixels, `(N, 21, 2)`.
        p_right: detector probability that the hand is a right hand, `(N,)`.
        opts: settings.

    Returns:
        The assignment (see `WearerAssignment`).
    """
    opts = opts or WearerOptions()
    n = len(frame_idx)
    if keypoints_cam.shape != (n, 21, 3) or keypoints_px.shape != (n, 21, 2) or p_right.shape != (n,):
        raise ShapeError("keypoints_cam / keypoints_px / p_right", keypoints_cam.shape, f"({n}, 21, 3) etc.")
    order = np.argsort(frame_idx, kind="stable")
    inverse = np.argsort(order)
    frames, cam, px, pr = frame_idx[order], keypoints_cam[order], keypoints_px[order], p_right[order]
    track = _link_tracks(frames, cam[:, _PALM].mean(axis=1), pr, opts)
    geometry = wearer_geometry(cam, px, opts)
    evidence = _side_evidence(cam, pr, opts)
    labels = _label_tracks(track, frames, geometry, evidence, opts)
    identity = np.array([labels[int(t)] for t in track], dtype=object)
    switch = np.zeros(n, bool)
    holder: dict[str, int] = {}
    for i, (name, t) in enumerate(zip(identity, track, strict=True)):
        switch[i] = name in holder and holder[name] != t
        holder[name] = int(t)
    return WearerAssignment(track[inverse], identity[inverse], geometry[inverse], switch[inverse])


def _label_tracks(
    track: np.ndarray, frames: np.ndarray, geometry: np.ndarray, evidence: np.ndarray, opts: WearerOptions
) -> dict[int, str]:
    """Track -> identity; two wearer tracks alive at once never share a side (weaker one yields)."""
    ids = np.unique(track)
    wearer = {int(t): geometry[track == t].mean() >= opts.min_wearer_fraction for t in ids}
    score = {int(t): float(evidence[track == t].mean()) for t in ids}
    span = {int(t): set(frames[track == t].tolist()) for t in ids}
    labels: dict[int, str] = {}
    for t in sorted((t for t in wearer if wearer[t]), key=lambda t: -abs(score[t])):
        side = "right" if score[t] >= 0 else "left"
        taken = any(
            labels[o] == f"wearer_{side}" and len(span[o] & span[t]) >= opts.min_conflict_frames
            for o in labels
        )
        if taken:
            side = "left" if side == "right" else "right"
        labels[t] = f"wearer_{side}"
    others = [int(t) for t in ids if not wearer[int(t)]]
    for n, t in enumerate(sorted(others, key=lambda t: min(span[t]))):
        labels[t] = f"other_{n}"
    return labels
