"""Synthetic egocentric episodes with exact ground truth (camera poses, hands, IMU, depth).

Pure arrays: nothing here reads or writes files (`jobs.sample` does). Entry point:
`generate_episode(SynthOptions(...))`.
"""

from pose_core.synth.episode import SynthEpisode, SynthFrame, SynthOptions, generate_episode
from pose_core.synth.imu import GRAVITY_M_S2, ImuOptions, ImuSamples

__all__ = [
    "GRAVITY_M_S2",
    "ImuOptions",
    "ImuSamples",
    "SynthEpisode",
    "SynthFrame",
    "SynthOptions",
    "generate_episode",
]
