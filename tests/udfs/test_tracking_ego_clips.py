"""Camera poses on the real first-person clips of ../shared/data/ego_clips through the stage units.

priors -> hands (their boxes mask the hands out of tracking) -> tracking -> ba -> completion, on pandas
frames as the Spark stages run them, with the default configuration and no calibration (the 70-degree
prior). The clips have no ground truth; what the tests state about camera motion was read off the
frames by eye (contact sheets of every 4th-15th frame):

- egoloc_desk_pour.mp4 (298 frames, head camera at a desk): the view is still while the hands rest
  (0-30: the glass stays within a few pixels of one spot), then the head moves: the view rises
  from the hands to the keyboard and book (36-60), slides right until the fan is in view (60-120),
  stays there while the liquid is poured (120-200) and slides back left (200-298).
- lavila_ego4d_stirring.mp4 (60 frames, Ego4D head camera over a pan): the view tilts down twice,
  by about a tenth of the frame (frames 15-20 and 35-40); in between it sways little. Nothing in the
  frames shows the camera translating, and tracking agrees: the rotation-compensated parallax to the
  first frame stays below 0.45 degrees, so no map starts; the tilts must still be measured.
- egox_egoexo4d_covidtest.mp4 (50 frames, Aria glasses, fisheye): the view pans right and tilts
  up, most clearly from frame 28 on (the room's far wall and tripod sweep across).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.features import FeatureOptions
from pose_core.geometry.rigid3 import so3_log
from schemas.tables import FEATURES, FRAMES
from tests.data_paths import SHARED_DATA
from udfs.camera_tables import world_from_cam_from_columns
from udfs.hands import HandsOptions, hands_for_shard
from udfs.ingest import plan_shards
from udfs.media.decode import DecodeOptions, decode_frames
from udfs.multi_output import split_tables, stack_tables
from udfs.priors import shard_outputs
from udfs.tracking import (
    BA_INPUTS,
    BA_OUTPUTS,
    COMPLETION_INPUTS,
    TRACKING_OUTPUTS,
    CameraTrackingOptions,
    ba_unit,
    completion_unit,
    tracking_unit,
)

pytestmark = pytest.mark.slow

CLIPS = SHARED_DATA / "ego_clips"


def _camera_poses(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`tracks` and `camera_poses` rows of one clip, computed by the stage units."""
    path = str(CLIPS / name)
    n = len(decode_frames(path, 0, None, DecodeOptions()).frame_idx)
    frames, features, hands = [], [], []
    for i, (start, stop, own_start, own_stop) in enumerate(plan_shards(n, 256, 8)):
        shard = pd.DataFrame([{
            "episode_id": "ep", "shard_idx": i, "source_path": path, "kind": "video", "decoder": "decord",
            "frame_start": start, "frame_stop": stop, "own_start": own_start, "own_stop": own_stop,
            "calibration_json": None,
        }])  # fmt: skip
        out = split_tables(shard_outputs(shard, DecodeOptions(), FeatureOptions()), [FRAMES, FEATURES])
        frames.append(out["frames"])
        features.append(out["features"])
        hands.append(hands_for_shard(shard, HandsOptions(), DecodeOptions()))
    frames, features, hands = (pd.concat(x, ignore_index=True) for x in (frames, features, hands))
    boxes = hands.dropna(subset=["box_px"]).groupby("frame_idx")["box_px"].agg(
        lambda b: np.concatenate(list(b)).astype(np.float32))
    view = features.assign(
        calibration_json=None,
        width=np.int32(frames["width"].max()),
        height=np.int32(frames["height"].max()),
        hand_boxes_px=[b if isinstance(b, np.ndarray) else None for b in features["frame_idx"].map(boxes)],
    )
    opts, copts = CameraTrackingOptions(), CompletionOptions()
    tables = split_tables(tracking_unit(view, opts), TRACKING_OUTPUTS)
    tables |= split_tables(ba_unit(stack_tables([(s, tables[s.name]) for s in BA_INPUTS]), copts), BA_OUTPUTS)
    given = {"feature_view": view, "frames": frames} | tables
    poses = completion_unit(stack_tables([(s, given[s.name]) for s in COMPLETION_INPUTS]), copts, opts)
    return tables["tracks"].sort_values("frame_idx"), poses.sort_values("frame_idx")


@pytest.fixture(scope="module", params=["egoloc_desk_pour.mp4", "lavila_ego4d_stirring.mp4",
                                        "egox_egoexo4d_covidtest.mp4"])
def clip(request):
    return request.param, *_camera_poses(request.param)


#: Frames where the camera clearly moves, not only turns (see the module notes): never `static` there.
MOVING = {
    "egoloc_desk_pour.mp4": slice(36, 298),
    "lavila_ego4d_stirring.mp4": slice(0, 0),
    "egox_egoexo4d_covidtest.mp4": slice(28, 50),
}


def test_every_frame_posed_and_static_never_where_the_camera_moves(clip):
    name, tracks, poses = clip
    assert poses["world_from_cam_q_wxyz"].notna().all()
    states = tracks["tracking_state"].to_numpy()
    assert not (states[MOVING[name]] == "static").any(), np.unique(states[MOVING[name]], return_counts=True)


def test_the_longest_clip_ends_in_one_world_frame(clip):
    name, tracks, poses = clip
    if name != "egoloc_desk_pour.mp4":
        pytest.skip("stated for the longest clip")
    assert (poses["segment_id"] == 0).all(), poses["segment_id"].value_counts()
    assert (tracks["tracking_state"].to_numpy()[MOVING[name]] == "tracking").mean() > 0.95


def test_the_stirring_clips_tilts_are_measured(clip):
    name, _, poses = clip
    if name != "lavila_ego4d_stirring.mp4":
        pytest.skip("stated for the stirring clip")
    wfc = world_from_cam_from_columns(poses["world_from_cam_q_wxyz"], poses["world_from_cam_t_m"])
    for a, b in ((13, 22), (33, 42)):  # each tilt: about a tenth of the frame, some 5 degrees
        turned = np.degrees(np.linalg.norm(so3_log((wfc[a, :3, :3].T @ wfc[b, :3, :3])[None])[0]))
        assert turned > 2.0, (a, b, turned)
