"""Per-shard hand pass: decode a shard, find hands, fit them in metres, one `hands_cam` row per hand.

The estimator is loaded once per Python worker (module-level cache keyed by its options, filled on
first use, never at import) and reused for every shard that worker runs. Each shard is tracked as a
stream of its own (a new stream, or `reset`, per shard: its first frame does not follow the previous
shard's last); on a GPU task several shards go through the estimator in lockstep (`hands_for_shards`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import cast

import numpy as np
import pandas as pd

from pose_core.errors import EgolakeError
from pose_core.geometry.camera import Camera
from pose_core.hands import (
    HandEstimator,
    HandObservation,
    MultiStreamEstimator,
    StreamState,
    fit_hands_with_camera,
    hand_box,
)
from schemas.tables import HANDS_CAM
from udfs.camera_tables import camera_for_frames
from udfs.device import current
from udfs.media.decode import DecodedFrames, iter_frames
from udfs.options import DecodeOptions, EstimatorOptions, HandsOptions

__all__ = [
    "DEPTH_SOURCE",
    "ESTIMATOR_ENTRY_POINTS",
    "hand_rows",
    "hands_for_shard",
    "hands_for_shards",
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
    fits = iter(fit_hands_with_camera([hand for found in hands for hand in found], camera, opts.fit))
    for frame, found in zip(frame_idx, hands, strict=True):
        for slot, hand in enumerate(found):
            fit = next(fits)
            box = _floats(hand_box(hand.keypoints_px, opts.box_margin))
            rows.append((
                episode_id, int(frame), slot, _floats(hand.keypoints_px), hand.score, hand.handedness,
                hand.handedness_score, _floats(fit.keypoints_cam), fit.valid, fit.residual_px,
                fit.num_keypoints, fit.shape_source, fit.model_palm_size_m, box, DEPTH_SOURCE, intrinsics,
                camera.intrinsics_source, camera.width, camera.height,
            ))  # fmt: skip
    return pd.DataFrame(rows, columns=HANDS_CAM.columns)


def hands_for_shard(shard: pd.DataFrame, opts: HandsOptions, decode: DecodeOptions) -> pd.DataFrame:
    """Decode one shard's own frames, find and fit every hand (`hands_for_shards` of one shard).

    Raises:
        EgolakeError: the decoder returned fewer frames than the shard owns.
    """
    result = hands_for_shards([shard], opts, decode)[0]
    if isinstance(result, Exception):
        raise result
    return result


@dataclass
class _ShardPass:
    """One shard on its way through `hands_for_shards`: its decoder, tracking state and rows so far."""

    shard: pd.Series
    chunks: Iterator[DecodedFrames]
    stream: StreamState | None
    parts: list[pd.DataFrame] = field(default_factory=list)
    decoded: int = 0
    error: Exception | None = None


def hands_for_shards(
    shards: Sequence[pd.DataFrame], opts: HandsOptions, decode: DecodeOptions
) -> list[pd.DataFrame | Exception]:
    """Decode shards' own frames chunk by chunk, find and fit every hand; the shards go in lockstep.

    With an estimator that tracks several streams (`MultiStreamEstimator`) on a GPU task, up to
    `opts.estimator.lockstep_shards` shards' chunks go through it together, each shard tracked from
    its own first frame; on a CPU task, or with any other estimator, the shards go one after the
    other. A shard that fails (decode error, too few frames) fails alone; the estimator failing fails
    the shards it was running. Failures are returned, not raised, so `udfs.guard` reports each shard.

    Args:
        shards: one-row frames, each a row of `shards` plus the episode's `calibration_json`.
        opts: stage settings.
        decode: how to decode (its `max_long_side_px` is replaced by the estimator's; its `timeout_s`
            bounds each chunk's decode).

    Returns:
        Per shard, its `hands_cam` rows of frames [own_start, own_stop), or the exception that failed it
        (`EgolakeError` when the decoder returned fewer frames than the shard owns).
    """
    decode = DecodeOptions(
        decode.backend, opts.estimator.max_long_side_px, decode.threads, timeout_s=decode.timeout_s
    )
    estimator = load_estimator(opts.estimator)
    # On a CPU, LiteRT runs one input per invoke: stepping shards together would only hold more frames.
    together = opts.estimator.lockstep_shards if current().kind == "cuda" else 1
    passes = [
        _ShardPass(s, iter_frames(s.source_path, int(s.own_start), int(s.own_stop), decode,
                                  opts.estimator.batch_frames), None)
        for s in (shard.iloc[0] for shard in shards)
    ]  # fmt: skip
    if isinstance(estimator, MultiStreamEstimator):
        for start in range(0, len(passes), together):
            group = passes[start : start + together]
            for p in group:
                p.stream = estimator.new_stream()
            _advance(group, estimator, opts)
    else:
        for p in passes:
            estimator.reset()
            _advance([p], estimator, opts)
    return [_finished(p) for p in passes]


def _advance(passes: list[_ShardPass], estimator: HandEstimator, opts: HandsOptions) -> None:
    """Run `passes` to their end, one chunk of each running shard per estimator call."""
    running = list(passes)
    while running:
        chunks: list[tuple[_ShardPass, DecodedFrames, Camera]] = []
        for p in running:
            try:
                chunk = next(p.chunks, None)
                if chunk is not None:
                    height, width = chunk.frames.shape[1:3]
                    chunks.append((p, chunk, camera_for_frames(p.shard.calibration_json, width, height)))
            except Exception as exc:  # noqa: BLE001 -- this shard fails, the others go on (udfs.guard reports)
                p.error = exc
        if not chunks:
            return
        try:
            if isinstance(estimator, MultiStreamEstimator):
                found = estimator.estimate_streams(
                    [c.frames for _, c, _ in chunks],
                    [camera.k_matrix for _, _, camera in chunks],
                    [cast(StreamState, p.stream) for p, _, _ in chunks],
                )
            else:
                found = [estimator.estimate(c.frames, camera.k_matrix) for _, c, camera in chunks]
        except Exception as exc:  # noqa: BLE001 -- the estimator's failure is each running shard's
            for p, _, _ in chunks:
                p.error = exc
            return
        running = []
        for (p, chunk, camera), hands in zip(chunks, found, strict=True):
            try:
                p.parts.append(hand_rows(p.shard.episode_id, chunk.frame_idx, hands, camera, opts))
                p.decoded += len(chunk.frame_idx)
                running.append(p)
            except Exception as exc:  # noqa: BLE001 -- this shard fails, the others go on
                p.error = exc


def _finished(p: _ShardPass) -> pd.DataFrame | Exception:
    """A shard's rows, or why it failed."""
    s = p.shard
    if p.error is not None:
        return p.error
    expected = int(s.own_stop) - int(s.own_start)
    if p.decoded != expected:
        return EgolakeError(
            f"{s.source_path}: decoded {p.decoded} of {expected} frames in [{s.own_start}, {s.own_stop})"
        )
    return pd.concat(p.parts, ignore_index=True) if p.parts else pd.DataFrame(columns=HANDS_CAM.columns)
