"""A synthetic episode as the qa stage's input tables (pandas), plus fault injectors.

Ground truth comes from `pose_core.synth`: camera poses, both wearer hands in world and image,
frustum visibility. The injectors change the tables the way a failing pipeline would.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from pose_core.synth import SynthEpisode, SynthOptions, generate_episode
from pose_core.synth.scene import SceneOptions
from schemas import TableSchema
from schemas.tables import ACTIONS, BA_POINTS, CAMERA_POSES, CAMERAS, FRAMES, HANDS_CAM, HANDS_WORLD, VIDEOS
from udfs.camera_tables import pose_columns

EPISODE = "feedc0ffee000001"
WEARER = ("wearer_left", "wearer_right")


def _table(schema: TableSchema, data: dict) -> pd.DataFrame:
    """`data` with the schema's columns; absent ones null (None in list columns, as Arrow wants)."""
    out = pd.DataFrame(data).reindex(columns=list(schema.columns))
    for f in schema.arrow:
        if pa.types.is_list(f.type):
            out[f.name] = pd.Series([None if isinstance(v, float) else v for v in out[f.name]], dtype=object)
    return out


def synth_tables(
    folder: str | None, frames: int = 60, seed: int = 0
) -> tuple[dict[str, pd.DataFrame], SynthEpisode]:
    """The tables of a clean synthetic episode; with `folder`, its video is rendered there (320x240)."""
    coarse = SceneOptions(room_texel_m=0.01, table_texel_m=0.004)  # fast to build; still textured
    opts = SynthOptions(num_frames=frames, seed=seed, width=320, height=240, fx=250.0, fy=250.0, scene=coarse)
    ep = generate_episode(opts)
    n = len(ep.ts_s)
    fidx = np.arange(n)
    q, t = pose_columns(ep.world_from_cam)
    source = None
    if folder is not None:
        from udfs.media.encode import write_video

        source = os.path.join(folder, f"{EPISODE}.mp4")
        write_video(source, (f.rgb for f in ep.frames()), ep.options.fps)
    hw, hc = [], []
    for h, identity in enumerate(WEARER):
        for i in np.flatnonzero(ep.hand_visible[:, h]):
            hw.append(
                {
                    "episode_id": EPISODE,
                    "frame_idx": i,
                    "identity": identity,
                    "ts_s": ep.ts_s[i],
                    "keypoints_world_m": ep.hands_world[i, h].ravel().tolist(),
                    "filled": False,
                    "score": 0.9,
                    "identity_switch": False,
                    "scale_source": "none",
                    "depth_source": "hand_size_prior",
                    "hand_slot": h,
                }
            )
            hc.append(
                {
                    "episode_id": EPISODE,
                    "frame_idx": i,
                    "hand_slot": h,
                    "image_width": 320,
                    "image_height": 240,
                    "keypoints_px": ep.hands_px[i, h].ravel().tolist(),
                }
            )
    tables = {
        FRAMES.name: _table(
            FRAMES, {"episode_id": EPISODE, "frame_idx": fidx, "ts_s": ep.ts_s, "shard_idx": 0}
        ),
        CAMERA_POSES.name: _table(
            CAMERA_POSES,
            {
                "episode_id": EPISODE,
                "frame_idx": fidx,
                "ts_s": ep.ts_s,
                "world_from_cam_q_wxyz": q,
                "world_from_cam_t_mu": t,
                "pose_quality": "motion_only",
                "tracking_state": "tracking",
                "segment_id": 0,
                "is_keyframe": fidx % 10 == 0,
                "num_inliers": 120,
                "reproj_error_px": 0.5,
            },
        ),  # fmt: skip
        HANDS_WORLD.name: _table(HANDS_WORLD, pd.DataFrame(hw)),
        HANDS_CAM.name: _table(HANDS_CAM, pd.DataFrame(hc)),
        CAMERAS.name: _table(
            CAMERAS,
            {
                "episode_id": [EPISODE],
                "width": 320,
                "height": 240,
                "fx": 250.0,
                "fy": 250.0,
                "cx": 159.5,
                "cy": 119.5,
                "model": "pinhole",
                "dist": [[]],
                "intrinsics_source": "sidecar",
            },
        ),  # fmt: skip
        BA_POINTS.name: _table(
            BA_POINTS,
            {
                "episode_id": EPISODE,
                "point_idx": np.arange(200),
                "x_in_world_mu": list(np.random.default_rng(seed).uniform(-2, 2, (200, 3))),
            },
        ),  # fmt: skip
        VIDEOS.name: _table(VIDEOS, {"episode_id": [EPISODE], "source_path": [source], "kind": "video"}),
        ACTIONS.name: _table(ACTIONS, {}),
    }
    return tables, ep


def inject_tracking_loss(t: dict[str, pd.DataFrame], start: int, stop: int) -> None:
    """Frames [start, stop) lost (no pose); tracking restarts as a new segment at `stop`."""
    cp = t[CAMERA_POSES.name]
    lost = cp["frame_idx"].between(start, stop - 1)
    cp.loc[lost, "tracking_state"] = "lost"
    cp.loc[lost, "world_from_cam_q_wxyz"] = pd.Series([None] * int(lost.sum()), index=cp.index[lost])
    cp.loc[lost, "world_from_cam_t_mu"] = pd.Series([None] * int(lost.sum()), index=cp.index[lost])
    cp.loc[cp["frame_idx"] >= stop, "segment_id"] = cp["segment_id"].max() + 1


def inject_scale_jump(t: dict[str, pd.DataFrame], at: int, factor: float) -> None:
    """From frame `at` a new segment whose map scale is `factor` times the old one (path continuous)."""
    cp = t[CAMERA_POSES.name]
    anchor = np.asarray(cp.loc[cp["frame_idx"] == at - 1, "world_from_cam_t_mu"].iat[0])
    after = cp["frame_idx"] >= at
    cp.loc[after, "world_from_cam_t_mu"] = pd.Series(
        [(anchor + factor * (np.asarray(v) - anchor)).tolist() for v in cp.loc[after, "world_from_cam_t_mu"]],
        index=cp.index[after],
    )
    cp.loc[after, "segment_id"] = cp["segment_id"].max() + 1


def inject_identity_switch(t: dict[str, pd.DataFrame], frame: int) -> None:
    """From the first frame >= `frame` showing both hands on, the hands swap identities (left <-> right)."""
    hw = t[HANDS_WORLD.name]
    both = hw.groupby("frame_idx")["identity"].nunique()
    at = int(both[(both.index >= frame) & (both == 2)].index[0])
    later = hw["frame_idx"] >= at
    hw.loc[later, "identity"] = hw.loc[later, "identity"].map(
        {"wearer_left": "wearer_right", "wearer_right": "wearer_left"}
    )


def write_qa_pages(
    qa_root: str, video_folder: str, frames: int = 45, max_page_points: int = 3000
) -> pd.DataFrame:
    """A faulty episode (scale jump at frame 25) through `qa_unit` into `qa_root`, plus the batch index
    `qa_root/index.html`, without Spark: the pages the qa stage writes. Returns the `qa` row.

    `max_page_points` below `frames` gives the page of a long episode (`QAOptions.max_page_points`).
    """
    from udfs.multi_output import stack_tables
    from udfs.options import QAOptions
    from udfs.qa_report import QA_INPUTS, index_page, qa_unit

    tables, _ = synth_tables(video_folder, frames)
    inject_scale_jump(tables, 25, 3.0)
    opts = QAOptions(max_page_points=max_page_points)
    row = qa_unit(stack_tables([(s, tables[s.name]) for s in QA_INPUTS]), opts, qa_root)
    episodes = row.assign(source_path=tables["videos"]["source_path"].iat[0], unchecked=None)
    quarantine = tables["videos"].iloc[:0].reindex(columns=["source_path", "reason_code", "message"])
    with open(os.path.join(qa_root, "index.html"), "w", encoding="utf-8") as fh:
        fh.write(index_page(episodes, quarantine))
    return row
