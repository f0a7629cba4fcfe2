"""Per-episode action timeline: the episode's frames and `hands_world` rows in, `actions` rows out.

Called by the `actions` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two light
frames per episode: its frames (`frame_idx`, `ts_s`, and the sidecar's `task_text`, null when there
was none) and its `hands_world` rows. Each wearer hand gets a timeline over every frame of the
episode (`pose_core.training.timeline`); frames where the hand has no row are `missing`.
Callable on pandas frames without Spark.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pose_core.identities import is_right_hand
from pose_core.training.timeline import segment_hand
from schemas.tables import ACTIONS
from udfs.columns import list_column
from udfs.options import ActionsOptions

__all__ = ["FRAME_COLUMNS", "HAND_COLUMNS", "episode_actions"]

logger = logging.getLogger(__name__)

#: Columns of the frames side (one row per frame; `task_text` repeats the episode's sidecar text).
FRAME_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "ts_s", "task_text")
#: Columns of the `hands_world` side.
HAND_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "identity", "keypoints_world_m")


def _mean(values: np.ndarray) -> float:
    """Mean of the finite values; NaN when there are none (a missing segment)."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _task(frames: pd.DataFrame, opts: ActionsOptions) -> tuple[str, str]:
    texts = frames["task_text"].dropna() if "task_text" in frames else pd.Series(dtype=str)
    texts = texts[texts.str.strip() != ""]
    return (str(texts.iat[0]).strip(), "sidecar") if len(texts) else (opts.default_task_text, "conf")


def episode_actions(frames: pd.DataFrame, hands: pd.DataFrame, opts: ActionsOptions) -> pd.DataFrame:
    """`actions` rows of one episode.

    Args:
        frames: the episode's frames (`FRAME_COLUMNS`), any order.
        hands: the episode's `hands_world` rows (`HAND_COLUMNS`), possibly none.
        opts: stage settings.

    Returns:
        One row per segment and identity of `opts.identities`, segments in time order.
    """
    if frames.empty:
        return pd.DataFrame(columns=ACTIONS.columns)
    frames = frames.sort_values("frame_idx").reset_index(drop=True)
    episode_id = frames["episode_id"].iat[0]
    frame_idx = frames["frame_idx"].to_numpy(np.int64)
    ts = frames["ts_s"].to_numpy(np.float64)
    row_of = pd.Series(np.arange(len(frame_idx)), index=frame_idx)
    task_text, task_source = _task(frames, opts)
    parts = []
    for identity in opts.identities:
        mine = hands[hands["identity"] == identity]
        mine = mine[mine["frame_idx"].isin(row_of.index)]
        rows = row_of.loc[mine["frame_idx"]].to_numpy()
        keypoints = np.full((len(frame_idx), 21, 3), np.nan)
        present = np.zeros(len(frame_idx), bool)
        if len(rows):
            keypoints[rows] = list_column(mine["keypoints_world_m"], 63).reshape(-1, 21, 3)
            present[rows] = True
        timeline = segment_hand(keypoints, ts, present, is_right_hand(identity), opts.timeline)
        segs = timeline.segments
        starts = np.array([s.start for s in segs], np.int64)
        stops = np.array([s.stop for s in segs], np.int64)
        speed = [_mean(timeline.wrist_speed[s.start : s.stop]) for s in segs]
        aperture = [_mean(timeline.grip_aperture_m[s.start : s.stop]) for s in segs]
        parts.append(
            pd.DataFrame(
                {
                    "episode_id": episode_id,
                    "identity": identity,
                    "segment_idx": np.arange(len(segs), dtype=np.int32),
                    "label": [s.label for s in segs],
                    "frame_start": frame_idx[starts] if len(segs) else [],
                    "frame_stop": frame_idx[stops - 1] + 1 if len(segs) else [],
                    "ts_start_s": ts[starts] if len(segs) else [],
                    "ts_stop_s": ts[stops - 1] if len(segs) else [],
                    "mean_wrist_speed_mps": speed,
                    "mean_grip_aperture_m": aperture,
                    "task_text": task_text,
                    "task_source": task_source,
                }
            )
        )
    out = pd.concat(parts, ignore_index=True)
    logger.info(
        "actions episode=%s segments=%d labels=%s task_source=%s", episode_id, len(out),
        out["label"].value_counts().to_dict(), task_source,
    )  # fmt: skip
    return out
