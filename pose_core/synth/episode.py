"""A complete synthetic egocentric episode: poses, hands, IMU and lazily rendered frames.

`generate_episode(opts)` computes all ground truth up front (cheap) and renders frames only when
`SynthEpisode.frames()` is iterated, so a 600-frame episode never holds its images in memory.

Convention:
    World frame of `pose_core.synth.scene`: metres, z up, gravity (0, 0, -9.81) m/s^2. Camera frame
    OpenCV (x right, y down, z forward). `world_from_cam` maps camera to world coordinates. The
    stereo right camera sits at `+baseline_m` along the left camera's x axis, same orientation.
    Hand 0 is the wearer's left hand, hand 1 the right; keypoints in MediaPipe order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from pose_core.synth.hands import HandOptions, make_hand_motion
from pose_core.synth.imu import ImuOptions, ImuSamples, synthesize_imu
from pose_core.synth.render import Renderer, RenderOptions, project_world_points
from pose_core.synth.scene import SceneOptions, build_scene
from pose_core.synth.trajectory import TrajectoryOptions, make_head_trajectory

__all__ = ["SynthEpisode", "SynthFrame", "SynthOptions", "generate_episode"]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

_TASK = "Reach to the table, grasp an item with each hand in turn, carry it a little and put it down."


@dataclass(frozen=True)
class SynthOptions:
    """Everything that defines a synthetic episode; equal options give bit-identical episodes."""

    # Number of video frames and frame rate, Hz.
    num_frames: int = 90
    fps: float = 30.0
    # Image size, pixels.
    width: int = 640
    height: int = 480
    # Focal lengths, pixels.
    fx: float = 500.0
    fy: float = 500.0
    # Principal point, pixels; None puts it at the image centre ((W - 1) / 2, (H - 1) / 2).
    cx: float | None = None
    cy: float | None = None
    # Master seed: scene textures, trajectory, hands and IMU noise each get a child seed from it.
    seed: int = 0
    # Render a right camera too, `baseline_m` metres along the left camera's +x.
    stereo: bool = False
    baseline_m: float = 0.1
    # A hand is visible when at least this fraction of its 21 keypoints projects inside the image
    # in front of the camera (frustum test; occlusion by the scene is not considered).
    min_visible_fraction: float = 0.5
    # Make the motion a closed loop of period num_frames / fps: frame num_frames would show frame 0
    # again, so the clip can be played over and over without a seam (`jobs.sample`'s `loops`).
    loop: bool = False
    # Sub-module knobs.
    scene: SceneOptions = field(default_factory=SceneOptions)
    trajectory: TrajectoryOptions = field(default_factory=TrajectoryOptions)
    hands: HandOptions = field(default_factory=HandOptions)
    render: RenderOptions = field(default_factory=RenderOptions)
    imu: ImuOptions = field(default_factory=ImuOptions)

    def __post_init__(self) -> None:
        problems = []
        if self.num_frames < 1:
            problems.append(f"num_frames must be >= 1, got {self.num_frames}")
        if self.fps <= 0:
            problems.append(f"fps must be > 0, got {self.fps}")
        if self.width < 2 or self.height < 2:
            problems.append(f"image size must be at least 2x2, got {self.width}x{self.height}")
        if self.fx <= 0 or self.fy <= 0:
            problems.append(f"focal lengths must be > 0, got {self.fx}, {self.fy}")
        if self.stereo and self.baseline_m <= 0:
            problems.append(f"baseline_m must be > 0 for stereo, got {self.baseline_m}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def intrinsics(self) -> FloatArray:
        """Camera matrix `[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`, pixels, `(3, 3)`."""
        cx = (self.width - 1) / 2.0 if self.cx is None else self.cx
        cy = (self.height - 1) / 2.0 if self.cy is None else self.cy
        return np.array([[self.fx, 0.0, cx], [0.0, self.fy, cy], [0.0, 0.0, 1.0]])


@dataclass(frozen=True)
class SynthFrame:
    """One rendered frame.

    Attributes:
        frame_idx: 0-based index.
        ts_s: time, seconds.
        rgb: left (or only) image, `(H, W, 3)` uint8.
        depth: camera-frame z per pixel, metres, `(H, W)` float32.
        surface_id: what each pixel sees (see `pose_core.synth.render.RenderedFrame`), `(H, W)` int16.
        rgb_right: right image for stereo episodes, `(H, W, 3)` uint8, else None.
        depth_right: right depth for stereo episodes, `(H, W)` float32, else None.
    """

    frame_idx: int
    ts_s: float
    rgb: NDArray[np.uint8]
    depth: NDArray[np.float32]
    surface_id: NDArray[np.int16]
    rgb_right: NDArray[np.uint8] | None
    depth_right: NDArray[np.float32] | None


@dataclass(frozen=True)
class SynthEpisode:
    """Ground truth of a synthetic episode, plus a lazy frame renderer.

    Attributes:
        options: what generated it.
        K: intrinsics, pixels, `(3, 3)`.
        ts_s: frame times, seconds, `(F,)` (frame_idx / fps; constant rate).
        world_from_cam: left camera poses, `(F, 4, 4)`.
        hands_world: keypoints, metres, world frame, `(F, 2, 21, 3)`.
        elbows_world: where the drawn forearms end, metres, world frame, `(F, 2, 3)`.
        hands_px: keypoints projected into the left image, pixels, `(F, 2, 21, 2)`; NaN behind the camera.
        hand_visible: frustum visibility per hand (see `SynthOptions.min_visible_fraction`), `(F, 2)` bool.
        hand_curl: finger curl per hand, 0 straight to 1 fist (grasping above ~0.4), `(F, 2)`.
        imu: accelerometer and gyroscope in the camera frame.
        task: a one-sentence description of what the wearer does.
    """

    options: SynthOptions
    K: FloatArray  # noqa: N815 - the conventional name of the camera matrix
    ts_s: FloatArray
    world_from_cam: FloatArray
    hands_world: FloatArray
    elbows_world: FloatArray
    hands_px: FloatArray
    hand_visible: NDArray[np.bool_]
    hand_curl: FloatArray
    imu: ImuSamples
    task: str
    renderer: Renderer = field(repr=False)

    @property
    def num_frames(self) -> int:
        """Number of frames F."""
        return len(self.ts_s)

    @property
    def world_from_right(self) -> FloatArray:
        """Right camera poses `(F, 4, 4)` (the left pose shifted by `baseline_m` along its +x)."""
        left_from_right = np.eye(4)
        left_from_right[0, 3] = self.options.baseline_m
        return self.world_from_cam @ left_from_right

    def frames(self, start: int = 0, stop: int | None = None) -> Iterator[SynthFrame]:
        """Render frames `start..stop-1` one at a time.

        Args:
            start: first frame index.
            stop: one past the last frame index; None renders to the end.

        Yields:
            One `SynthFrame` per index; stereo episodes include the right view.
        """
        stop = self.num_frames if stop is None else min(stop, self.num_frames)
        world_from_right = self.world_from_right if self.options.stereo else None
        for i in range(start, stop):
            left = self.renderer.render(self.world_from_cam[i], self.hands_world[i], self.elbows_world[i])
            right = (
                None
                if world_from_right is None
                else self.renderer.render(world_from_right[i], self.hands_world[i], self.elbows_world[i])
            )
            yield SynthFrame(
                frame_idx=i,
                ts_s=float(self.ts_s[i]),
                rgb=left.rgb,
                depth=left.depth,
                surface_id=left.surface_id,
                rgb_right=None if right is None else right.rgb,
                depth_right=None if right is None else right.depth,
            )


def generate_episode(opts: SynthOptions) -> SynthEpisode:
    """Generate a synthetic episode (ground truth now, frames lazily).

    Args:
        opts: episode definition.

    Returns:
        The episode; iterate `episode.frames()` for images.
    """
    scene_seq, traj_seq, hands_seq, imu_seq = np.random.SeedSequence(opts.seed).spawn(4)
    k = opts.intrinsics
    ts = np.arange(opts.num_frames) / opts.fps
    # A loop's period is the whole clip, up to the frame after the last.
    duration_s = opts.num_frames / opts.fps if opts.loop else max(float(ts[-1]), 1.0 / opts.fps)
    scene = build_scene(opts.scene, int(scene_seq.generate_state(1)[0]))
    trajectory = make_head_trajectory(duration_s, opts.trajectory, np.random.default_rng(traj_seq), opts.loop)
    hands = make_hand_motion(
        duration_s, trajectory, opts.scene, opts.hands, np.random.default_rng(hands_seq), opts.loop
    )
    world_from_cam = trajectory.sample(ts).world_from_cam
    hands_world = hands.keypoints_world(ts)
    hands_px = np.stack(
        [project_world_points(world_from_cam[i], k, hands_world[i])[0] for i in range(len(ts))]
    )
    z = np.einsum(
        "fij,fhkj->fhki",
        np.linalg.inv(world_from_cam)[:, :3, :3],
        hands_world - world_from_cam[:, None, None, :3, 3],
    )[..., 2]
    with np.errstate(invalid="ignore"):
        inside = (
            (z > opts.render.near_m)
            & (hands_px[..., 0] >= -0.5)
            & (hands_px[..., 0] <= opts.width - 0.5)
            & (hands_px[..., 1] >= -0.5)
            & (hands_px[..., 1] <= opts.height - 0.5)
        )
    imu = synthesize_imu(trajectory, duration_s, opts.imu, np.random.default_rng(imu_seq))
    logger.info("synthetic episode: %d frames, %d IMU samples, seed %d", len(ts), len(imu.ts_s), opts.seed)
    return SynthEpisode(
        options=opts,
        K=k,
        ts_s=ts,
        world_from_cam=world_from_cam,
        hands_world=hands_world,
        elbows_world=hands.elbows_world(ts),
        hands_px=hands_px,
        hand_visible=inside.mean(axis=2) >= opts.min_visible_fraction,
        hand_curl=hands.grip_curl(ts),
        imu=imu,
        task=_TASK,
        renderer=Renderer(scene, k, opts.width, opts.height, opts.render),
    )
