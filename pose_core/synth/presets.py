"""Named synthetic episode settings.

`table` is the default episode (`SynthOptions()`): the wearer leans over a table, turns the head fast
(180 deg/s peaks), steps along the table and works with both hands 35-55 cm from the camera.
`hard` is the stress case of issue 14 for camera poses: a larger furnished room, head turns peaking
at ~205 deg/s, a walk of 2.2 m away from the table (turning round, ~1 m/s) and back, and hands
raised to the lens where one covers up to ~30 % of the frame.
"""

from __future__ import annotations

import logging

from pose_core.synth.episode import SynthOptions
from pose_core.synth.hands import HandOptions
from pose_core.synth.scene import SceneOptions
from pose_core.synth.trajectory import TrajectoryOptions

__all__ = ["SYNTH_PRESETS"]

logger = logging.getLogger(__name__)

_HARD_SCENE = SceneOptions(
    # 7 x 7.6 m: standing 2.2 m back from the table the far wall is still ~2 m ahead.
    room_min_m=(-3.5, -4.6, 0.0),
    room_max_m=(3.5, 3.0, 2.8),
    # A cabinet and a crate behind the wearer, a shelf on the left wall, a chest right of the table.
    floor_boxes=(
        (-1.2, -4.25, 1.4, 0.6, 0.95),
        (1.5, -3.2, 0.6, 0.5, 0.5),
        (-3.2, -2.0, 0.5, 1.6, 1.9),
        (3.0, 0.6, 0.6, 0.9, 0.8),
        (-2.0, 2.7, 1.0, 0.5, 1.2),
    ),
    light_m=(0.0, -0.8, 2.65),
)

_HARD_TRAJECTORY = TrajectoryOptions(
    turn_peak_rate_rad_s=3.55,
    turn_interval_s=(1.8, 3.2),
    excursion_distance_m=2.2,
    excursion_peak_speed_m_s=1.1,
    excursion_dwell_s=(0.5, 1.0),
    excursion_start_s=(6.0, 7.0),
)

_HARD_HANDS = HandOptions(lens_first_s=(1.5, 3.0), lens_hold_s=(0.6, 1.2))

SYNTH_PRESETS: dict[str, SynthOptions] = {
    "table": SynthOptions(),
    "hard": SynthOptions(scene=_HARD_SCENE, trajectory=_HARD_TRAJECTORY, hands=_HARD_HANDS),
}
