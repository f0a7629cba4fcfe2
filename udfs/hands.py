"""Per-shard hand pass: decode a shard, find hands, fit them in metres, one `hands_cam` row per hand.

The estimator is loaded once per Python worker (module-level cache keyed by its options, filled on
first use, never at import) and reused for every shard that worker runs; `reset` is called per
shard because a shard's first frame does not follow the previous shard's last.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib.metadata import entry_points

import numpy as np
import pandas as pd

from pose_core.errors import EgolakeError
from pose_core.geometry.camera import Camera
from pose_core.hands import (
    HandEstimator,
    HandObservation,
    fit_hand_with_camera,
    hand_box,
)
from schemas.tables import HANDS_CAM
from udfs.camera_tables import camera_for_frames
from udfs.device import current
from udfs.media.decode import iter_frames
from udfs.options import DecodeOptions, EstimatorOptions, HandsOptions

__all__ = [
    "DEPTH_SOURCE",
    "ESTIMATOR_ENTRY_POINTS",
    "hand_rows",
    "hands_for_shard",
    "load_estimator",
]

logger = logging.getLogger(__name__)

#: Entry-point group of plugged-in estimators: `name = "module:factory"`, `factory(opts) -> HandEstimator`.
ESTIMATOR_ENTRY_POINTS = "egolake.hand_estimators"
#: Where the metric depth of a monocular hand fit comes from.
DEPTH_SOURCE = "hand_size_prior"


_ESTIMATORS: dict[tuple[EstimatorOptions, str], HandEstimator] = {}


def load_estimator(opts: EstimatorOptions) -> HandEstimator:
    """The estimator for `opts` on this task's device (`udfs.device.current`), built on first use and cached.

    The MediaPipe networks run in torch on the task's GPU when `mediapipe.backend` allows it (auto,
    torch), else on LiteRT.

    Raises:
        EgolakeError: `opts.kind` is neither "mediapipe" nor an installed entry point.
        FileNotFoundError: the MediaPipe models are not in the cache (run `python -m conf.models`).
    """
    device = current().name
    key = (opts, device)
    if key not in _ESTIMATORS:
        if opts.kind == "mediapipe":
            from udfs.models import hand_estimator  # noqa: PLC0415 -- only the default estimator needs it

            _ESTIMATORS[key] = hand_estimator(opts.mediapipe, device)
        else:
            found = [ep for ep in entry_points(group=ESTIMATOR_ENTRY_POINTS) if ep.name == opts.kind]
            if not found:
                raise EgolakeError(
                    f"hand estimator {opts.kind!r} is not installed: use 'mediapipe' or register an "
                    f"entry point in the group {ESTIMATOR_ENTRY_POINTS!r}"
                )
            _ESTIMATORS[key] = found[0].load()(opts)
        logger.info("hand estimator loaded kind=%s", opts.kind)
    return _ESTIMATORS[key]


def _floats(values: np.ndarray) -> list[float]:
    return np.asarray(values, np.float64).ravel().tolist()


def hand_rows(
    episode_id: str,
    frame_idx: Sequence[int],
    hands: Sequence[Sequence[HandObservation]],
    camera: Camera,
    opts: HandsOptions,
) -> pd.DataFrame:
    """`hands_cam` rows of some frames: one per hand found, fitted in metres; none for a frame without hands.

    Args:
        episode_id: the episode.
        frame_idx: the frames' indices, `(B,)`.
        hands: per frame, the estimator's hands (keypoints in the image of `camera`).
        camera: intrinsics of those images.
        opts: stage settings (fit, box margin).
    """
    rows = []
    intrinsics = [camera.fx, camera.fy, camera.cx, camera.cy]
    for frame, found in zip(frame_idx, hands, strict=True):
        for slot, hand in enumerate(found):
            fit = fit_hand_with_camera(hand, camera, opts.fit)
            box = _floats(hand_box(hand.keypoints_px, opts.box_margin))
            rows.append((
                episode_id, int(frame), slot, _floats(hand.keypoints_px), hand.score, hand.handedness,
                hand.handedness_score, _floats(fit.keypoints_cam), fit.valid, fit.residual_px,
                fit.num_keypoints, fit.shape_source, fit.model_palm_size_m, box, DEPTH_SOURCE, intrinsics,
                camera.intrinsics_source, camera.width, camera.height,
            ))  # fmt: skip
    return pd.DataFrame(rows, columns=HANDS_CAM.columns)


def hands_for_shard(shard: pd.DataFrame, opts: HandsOptions, decode: DecodeOptions) -> pd.DataFrame:
    """Decode one shard's own frames, find and fit every hand.

    Args:
        shard: one row of `shards` plus the episode's `calibration_json`.
        opts: stage settings.
        decode: how to decode (its `max_long_side_px` is replaced by the estimator's; its `timeout_s`
            bounds each chunk's decode).

    Returns:
        `hands_cam` rows of frames [own_start, own_stop).

    Raises:
        EgolakeError: the decoder returned fewer frames than the shard owns.
    """
    s = shard.iloc[0]
    decode = DecodeOptions(
        decode.backend, opts.estimator.max_long_side_px, decode.threads, timeout_s=decode.timeout_s
    )
    estimator = load_estimator(opts.estimator)
    estimator.reset()
    parts, decoded = [], 0
    chunks = iter_frames(
        s.source_path, int(s.own_start), int(s.own_stop), decode, opts.estimator.batch_frames
    )
    for chunk in chunks:
        height, width = chunk.frames.shape[1:3]
        camera = camera_for_frames(s.calibration_json, width, height)
        found = estimator.estimate(chunk.frames, camera.k_matrix)
        parts.append(hand_rows(s.episode_id, chunk.frame_idx, found, camera, opts))
        decoded += len(chunk.frame_idx)
    expected = int(s.own_stop) - int(s.own_start)
    if decoded != expected:
        raise EgolakeError(
            f"{s.source_path}: decoded {decoded} of {expected} frames in [{s.own_start}, {s.own_stop})"
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=HANDS_CAM.columns)
