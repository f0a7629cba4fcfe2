"""What a pipeline would observe of a synthetic episode, without rendering: noisy hand detections, map points.

For tests and benchmarks whose subject comes after those stages (fusion, metric scale): the hand
estimator's output is the true keypoints plus pixel noise (and a 3-D shape with per-joint noise,
dropouts, handedness flips); the map is points spread over the scene's surfaces with monocular-like
noise, seen by keyframes, and the camera poses are the true ones with a little noise, all in map units.

Convention:
    World frame of `pose_core.synth.scene` (metres, z up). Keypoints in MediaPipe order; hand 0 is
    the wearer's left hand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pose_core.geometry.rigid3 import so3_exp
from pose_core.hands.estimator import Handedness, HandObservation
from pose_core.hands.masks import hand_box
from pose_core.synth.episode import SynthEpisode
from pose_core.synth.scene import Scene

__all__ = [
    "DetectionNoise",
    "MapNoise",
    "SimulatedMap",
    "noisy_hand_observations",
    "simulated_map",
    "surface_points",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectionNoise:
    """How the simulated hand estimator errs."""

    # 2-D keypoint noise, pixels (one standard deviation).
    px: float = 2.0
    # Per-joint noise of the model's 3-D shape (camera frame), metres.
    shape_m: float = 0.004
    # Probability that a visible hand is missed in a frame.
    drop: float = 0.1
    # Probability that a detected hand's handedness is flipped.
    flip: float = 0.15


def noisy_hand_observations(
    episode: SynthEpisode, rng: np.random.Generator, noise: DetectionNoise | None = None
) -> list[list[HandObservation]]:
    """Per frame, the hands a noisy estimator finds (score 0.95, handedness score 0.9).

    Args:
        episode: the synthetic episode (its visible hands are observed).
        rng: random source (draws per frame: hand order, dropouts, flips, pixel and shape noise).
        noise: error model; None: `DetectionNoise()`.

    Returns:
        One list of observations per frame, in frame order (shape in the camera frame, metres).
    """
    noise = noise or DetectionNoise()
    cam_from_world = np.linalg.inv(episode.world_from_cam)
    in_cam = (
        np.einsum("fij,fhkj->fhki", cam_from_world[:, :3, :3], episode.hands_world)
        + cam_from_world[:, None, None, :3, 3]
    )
    found = []
    for f in range(episode.num_frames):
        hands = []
        for h in rng.permutation(2):
            if not episode.hand_visible[f, h] or rng.random() < noise.drop:
                continue
            side: Handedness = ("left", "right")[h] if rng.random() > noise.flip else ("right", "left")[h]
            px = episode.hands_px[f, h] + rng.normal(0.0, noise.px, (21, 2))
            shape = in_cam[f, h] + rng.normal(0.0, noise.shape_m, (21, 3))
            hands.append(HandObservation(px, 0.95, side, 0.9, shape))
        found.append(hands)
    return found


def surface_points(
    scene: Scene, rng: np.random.Generator, table_per_m2: float = 300.0, room_per_m2: float = 20.0
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Points spread uniformly over the scene's surfaces, world frame, with their surfaces' normals.

    Args:
        scene: the scene (its rectangles).
        rng: random source.
        table_per_m2: points per square metre on the table and the boxes on it (fine texture).
        room_per_m2: points per square metre on the room's walls, floor, ceiling and furniture.

    Returns:
        (points, metres, `(P, 3)`; unit normals towards the side they are seen from, `(P, 3)`).
    """
    parts, normals = [], []
    for rect in scene.rects:
        fine = rect.name.startswith(("table", "box"))
        area = rect.size_m[0] * rect.size_m[1]
        n = rng.poisson((table_per_m2 if fine else room_per_m2) * area)
        a = rng.uniform(0.0, rect.size_m[0], n)
        b = rng.uniform(0.0, rect.size_m[1], n)
        parts.append(rect.origin + a[:, None] * rect.axis_u + b[:, None] * rect.axis_v)
        normals.append(np.tile(rect.normal, (n, 1)))
    if not parts:
        return np.zeros((0, 3)), np.zeros((0, 3))
    return np.concatenate(parts), np.concatenate(normals)


@dataclass(frozen=True)
class MapNoise:
    """How the simulated tracker and map err (defaults: a monocular map of a textured table)."""

    # Points per square metre on the table and the boxes, and on the room (`surface_points`).
    table_per_m2: float = 300.0
    room_per_m2: float = 20.0
    # Point error along the ray from the episode's middle camera, as a fraction of that distance
    # (monocular depth noise), and isotropic, metres.
    depth_fraction: float = 0.008
    isotropic_m: float = 0.003
    # Fraction of points that are outliers, moved by up to +-`outlier_fraction_of_depth` along the ray.
    outliers: float = 0.05
    outlier_fraction_of_depth: float = 0.3
    # Camera pose noise per frame: rotation, radians, and centre, metres.
    rotation_rad: float = float(np.radians(0.05))
    centre_m: float = 0.002
    # Every this many frames a keyframe observes the points in its image (in front, on their visible
    # side, outside the hands' boxes; occlusion by the scene itself is not modelled).
    keyframe_every: int = 10


@dataclass(frozen=True)
class SimulatedMap:
    """Camera poses and a map in map units (`metres_per_unit` metres each).

    Attributes:
        world_from_cam: noisy camera poses, translation in map units, `(F, 4, 4)`.
        points: noisy map points, world frame, map units, `(P, 3)`.
        keyframes: frame index of each keyframe, `(K,)`.
        observed: per keyframe, the indices of the points it sees.
        metres_per_unit: the truth.
    """

    world_from_cam: NDArray[np.float64]
    points: NDArray[np.float64]
    keyframes: NDArray[np.int64]
    observed: list[NDArray[np.int64]]
    metres_per_unit: float


def _seen_by(episode: SynthEpisode, points: NDArray[np.float64], normals: NDArray[np.float64], frame: int
             ) -> NDArray[np.int64]:  # fmt: skip
    """Indices of the points frame `frame` sees: in the image, in front, facing it, outside the hands."""
    cam_from_world = np.linalg.inv(episode.world_from_cam[frame])
    x = points @ cam_from_world[:3, :3].T + cam_from_world[:3, 3]
    uv = x[:, :2] / np.maximum(x[:, 2:], 1e-9) * np.diag(episode.K)[:2] + episode.K[:2, 2]
    w, h = episode.options.width, episode.options.height
    seen = (x[:, 2] > 0.1) & (uv[:, 0] >= 0) & (uv[:, 0] < w) & (uv[:, 1] >= 0) & (uv[:, 1] < h)
    seen &= np.einsum("ij,ij->i", normals, episode.world_from_cam[frame, :3, 3] - points) > 0
    for hand in np.flatnonzero(episode.hand_visible[frame]):
        x0, y0, x1, y1 = hand_box(episode.hands_px[frame, hand], 0.1)
        seen &= ~((uv[:, 0] >= x0) & (uv[:, 0] <= x1) & (uv[:, 1] >= y0) & (uv[:, 1] <= y1))
    return np.flatnonzero(seen)


def simulated_map(
    episode: SynthEpisode, metres_per_unit: float, rng: np.random.Generator, noise: MapNoise | None = None
) -> SimulatedMap:
    """Noisy camera poses and map of an episode, in units of `metres_per_unit` metres.

    Args:
        episode: the synthetic episode.
        metres_per_unit: the true scale of the map's units.
        rng: random source.
        noise: error model; None: `MapNoise()`.

    Returns:
        The map.
    """
    noise = noise or MapNoise()
    points, normals = surface_points(episode.renderer.scene, rng, noise.table_per_m2, noise.room_per_m2)
    ray = points - episode.world_from_cam[episode.num_frames // 2, :3, 3]
    dist = np.linalg.norm(ray, axis=1)
    ray /= dist[:, None]
    outlier = rng.random(len(dist)) < noise.outliers
    moved = rng.uniform(-noise.outlier_fraction_of_depth, noise.outlier_fraction_of_depth, len(dist)) * dist
    along = rng.normal(0.0, noise.depth_fraction * dist) + np.where(outlier, moved, 0.0)
    noisy = points + along[:, None] * ray + rng.normal(0.0, noise.isotropic_m, points.shape)
    poses = episode.world_from_cam.copy()
    poses[:, :3, :3] = poses[:, :3, :3] @ so3_exp(rng.normal(0.0, noise.rotation_rad, (len(poses), 3)))
    poses[:, :3, 3] += rng.normal(0.0, noise.centre_m, (len(poses), 3))
    poses[:, :3, 3] /= metres_per_unit
    keyframes = np.arange(0, episode.num_frames, noise.keyframe_every)
    observed = [_seen_by(episode, points, normals, int(f)) for f in keyframes]
    return SimulatedMap(poses, noisy / metres_per_unit, keyframes, observed, metres_per_unit)
