"""The qa stage's unit: one episode's tables in, its `qa` row out, its evidence files written.

Runs on an executor inside `groupBy(episode_id).applyInPandas` over light stacked rows
(`udfs.multi_output`, tables `QA_INPUTS`); it decodes the episode's video itself (never moving
pixels through Spark), draws the overlay, and writes OUTPUT/qa/<episode_id>/index.html,
overlay.mp4 and thumb.jpg. Callable on pandas frames without Spark.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import cv2
import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pose_core.errors import EgolakeError
from pose_core.geometry.camera import Camera
from pose_core.qa import QAResult, evaluate_episode
from schemas.tables import (
    ACTIONS,
    BA_POINTS,
    CAMERA_POSES,
    CAMERAS,
    FRAMES,
    HANDS_CAM,
    HANDS_WORLD,
    QA,
    ROBOT_ACTIONS,
    VIDEOS,
)
from udfs.camera_tables import camera_from_row
from udfs.columns import list_column
from udfs.media.decode import iter_frames
from udfs.media.encode import VideoWriter
from udfs.media.overlay import draw_hands, draw_status, project_world_points
from udfs.multi_output import split_tables
from udfs.options import DecodeOptions, QAOptions
from udfs.qa_report.episode import WEARER, EpisodeView, arm_sticks, episode_signals, episode_view
from udfs.qa_report.page import PageMedia, episode_page, spread

__all__ = ["PAGE_NAME", "QA_INPUTS", "ROBOT_INPUT", "qa_row", "qa_unit"]

logger = logging.getLogger(__name__)

#: Tables the unit reads, stacked per episode.
QA_INPUTS = (FRAMES, CAMERA_POSES, HANDS_WORLD, HANDS_CAM, CAMERAS, BA_POINTS, VIDEOS, ACTIONS)
#: Stacked too when it exists (retargeting configured): the robot arms drawn beside the hands.
ROBOT_INPUT = ROBOT_ACTIONS
#: File name of an episode's page inside OUTPUT/qa/<episode_id>/.
PAGE_NAME = "index.html"


def qa_row(view: EpisodeView, result: QAResult, report_path: str | None) -> pd.DataFrame:
    """The episode's `qa` row."""
    f = view.frames
    tracked_not_filled = view.tracked & (f["pose_quality"] != "interpolated").to_numpy()
    return pd.DataFrame(
        [
            {
                "episode_id": view.episode_id,
                "passed": result.passed,
                "flags": list(result.flags),
                "reasons": list(result.reasons),
                "frames": len(f),
                "duration_s": result.metrics["duration_s"],
                "posed_fraction": float(tracked_not_filled.mean()) if len(f) else 0.0,
                "hand_coverage": result.metrics["hand_coverage"],
                "identity_switches": int(result.metrics["identity_switches"]),
                "scale_source": view.scale_source,
                "report_path": report_path,
            }
        ],
        columns=QA.columns,
    )


def _hand_pixels(
    view: EpisodeView, hands_cam: pd.DataFrame, camera: Camera | None, size_wh: tuple[int, int]
) -> dict[str, NDArray[np.float64]]:
    """Per identity `(F, 21, 2)` pixels in the decoded size: observed from `hands_cam`, filled projected."""
    n = len(view.frames)
    slots = {(int(r.frame_idx), int(r.hand_slot)): r for r in hands_cam.itertuples()}
    camera = camera.scaled(*size_wh) if camera is not None else None
    out = {}
    for identity, hand in view.hands.items():
        px = np.full((n, 21, 2), np.nan)
        for i in np.flatnonzero(hand.present):
            row = slots.get((int(view.frames["frame_idx"].iat[i]), int(hand.hand_slot[i])))
            if row is not None and not hand.filled[i]:
                scale = np.array([size_wh[0] / row.image_width, size_wh[1] / row.image_height])
                px[i] = np.asarray(row.keypoints_px, np.float64).reshape(21, 2) * scale
            elif camera is not None and np.isfinite(view.world_from_cam[i]).all():
                px[i] = project_world_points(
                    hand.keypoints_world[i][None], view.world_from_cam[i][None], camera
                )[0]
        out[identity] = px
    return out


def _status_lines(view: EpisodeView) -> tuple[list[str], list[tuple[int, int, int]]]:
    f = view.frames
    lines, colours = [], []
    for i, r in enumerate(f.itertuples()):
        filled = [k for k, h in view.hands.items() if h.filled[i] and h.present[i]]
        text = f"#{r.frame_idx} {r.ts_s:.2f}s {r.tracking_state} {r.pose_quality}"
        text += " KEYFRAME" if r.is_keyframe else ""
        text += f" filled: {', '.join(filled)}" if filled else ""
        lines.append(text)
        colours.append(
            (255, 90, 90) if r.tracking_state == "lost" else (255, 220, 0) if filled else (255, 255, 255)
        )
    return lines, colours


def _even(frames: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Crop to even width and height (H.264 in yuv420p needs them)."""
    h, w = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    return frames[:, :h, :w]


def _overlay_chunks(
    view: EpisodeView, t: dict[str, pd.DataFrame], opts: QAOptions
) -> Iterator[tuple[NDArray[np.int64], NDArray[np.uint8]]]:
    """(positions in view.frames, drawn frames) per decoded chunk of the episode's video."""
    videos = t[VIDEOS.name]
    if videos.empty:
        raise EgolakeError("no videos row: the episode's video cannot be found")
    source = str(videos["source_path"].iat[0])
    camera = camera_from_row(t[CAMERAS.name]) if len(t[CAMERAS.name]) == 1 else None
    position = {int(f): i for i, f in enumerate(view.frames["frame_idx"])}
    lines, colours = _status_lines(view)
    pixels: dict[str, NDArray[np.float64]] | None = None
    for chunk in iter_frames(source, opts=DecodeOptions(max_long_side_px=opts.page_image_px)):
        keep = [j for j, f in enumerate(chunk.frame_idx) if int(f) in position]
        if not keep:
            continue
        frames = _even(chunk.frames[keep])
        at = np.array([position[int(chunk.frame_idx[j])] for j in keep], np.int64)
        if pixels is None:
            pixels = _hand_pixels(
                view, t[HANDS_CAM.name], camera, (chunk.frames.shape[2], chunk.frames.shape[1])
            )
        drawn = draw_hands(
            frames, {k: v[at] for k, v in pixels.items()}, {k: h.filled[at] for k, h in view.hands.items()}
        )
        yield at, draw_status(drawn, [lines[i] for i in at], [colours[i] for i in at])


def _render(
    view: EpisodeView, t: dict[str, pd.DataFrame], opts: QAOptions, folder: str, fps: float
) -> PageMedia:
    """Decode, draw, write overlay.mp4 and thumb.jpg; return the page's media."""
    n = len(view.frames)
    wanted = set(spread(n, opts.max_page_frames).tolist())
    jpegs, jpeg_frame = [], []
    writer = VideoWriter(os.path.join(folder, "overlay.mp4"), fps) if opts.overlay_video else None
    try:
        for at, drawn in _overlay_chunks(view, t, opts):
            for i, frame in zip(at, drawn, strict=True):
                if writer is not None:
                    writer.write(frame)
                if int(i) in wanted:
                    ok, buf = cv2.imencode(
                        ".jpg", frame[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, opts.jpeg_quality]
                    )
                    if ok:
                        jpegs.append(buf.tobytes())
                        jpeg_frame.append(int(i))
    finally:
        if writer is not None:
            writer.close()
    if not jpegs:
        raise EgolakeError("no frame of the episode's video could be decoded for the QA page")
    with open(os.path.join(folder, "thumb.jpg"), "wb") as fh:
        fh.write(jpegs[len(jpegs) // 2])
    points = t[BA_POINTS.name]["x_in_world_mu"].dropna()
    pts = list_column(points, 3)
    pts = pts[np.isfinite(pts).all(axis=1)] * view.metres_per_unit
    if opts.scene_points_max_distance > 0 and np.any(view.tracked):
        pts = near_path(pts, view.world_from_cam[view.tracked, :3, 3], opts.scene_points_max_distance)
    if len(pts) > opts.max_scene_points:
        pts = pts[np.linspace(0, len(pts) - 1, opts.max_scene_points).round().astype(int)]
    cams = t[CAMERAS.name]
    return PageMedia(
        jpegs=jpegs,
        jpeg_frame=np.asarray(jpeg_frame, np.int64),
        points=pts,
        camera=camera_from_row(cams) if len(cams) == 1 else None,
        actions=t[ACTIONS.name],
        arms=arm_sticks(view, t[ROBOT_INPUT.name]) if ROBOT_INPUT.name in t else {},
    )


def near_path(points: NDArray[np.float64], centres: NDArray[np.float64],
              factor: float) -> NDArray[np.float64]:
    """The points ``(N, 3)`` within ``factor`` times their median distance of the cameras' median centre.

    ``centres`` ``(C, 3)``: the world view's scene without the far outliers that would set its scale.
    """
    if len(points) == 0:
        return points
    distance = np.linalg.norm(points - np.median(centres, axis=0), axis=1)
    return points[distance <= factor * np.median(distance)]


def _extent(points: NDArray[np.float64]) -> float:
    """Robust size of a point set `(N, 3)`: the largest 5-95 percentile range of a coordinate (1 if none)."""
    if len(points) == 0:
        return 1.0
    lo, hi = np.percentile(points, [5, 95], axis=0)
    return float(np.max(hi - lo)) or 1.0


def qa_unit(stacked: pd.DataFrame, opts: QAOptions, qa_root: str) -> pd.DataFrame:
    """Check one episode and write its evidence page; returns its `qa` row.

    Args:
        stacked: the episode's rows of `QA_INPUTS` (and `ROBOT_INPUT` when its columns are there), stacked
            (`udfs.multi_output.stack_tables`).
        opts: thresholds and page settings.
        qa_root: OUTPUT/qa; the page goes to `<qa_root>/<episode_id>/index.html`.

    Raises:
        EgolakeError: the episode has no frames or its video cannot be decoded.
    """
    robots = (ROBOT_INPUT,) if set(ROBOT_INPUT.columns) <= set(stacked.columns) else ()
    t = split_tables(stacked, (*QA_INPUTS, *robots))
    view = episode_view(t[FRAMES.name], t[CAMERA_POSES.name], t[HANDS_WORLD.name])
    result = evaluate_episode(episode_signals(view), opts.thresholds)
    folder = os.path.join(qa_root, view.episode_id)
    os.makedirs(folder, exist_ok=True)
    ts = view.frames["ts_s"].to_numpy()
    dt = float(np.median(np.diff(ts))) if len(ts) > 1 else 1.0 / 30.0
    media = _render(view, t, opts, folder, fps=round(1.0 / dt, 3) if dt > 0 else 30.0)
    extent = _extent(np.vstack([view.world_from_cam[view.tracked, :3, 3], media.points]))
    page = episode_page(
        view,
        result,
        media,
        frustum_every=round(opts.frustum_every_s / dt),
        size=opts.frustum_size * extent,
        horizon=round(opts.wrist_horizon_s / dt),
        max_points=opts.max_page_points,
    )
    path = os.path.join(folder, PAGE_NAME)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    logger.info(
        "qa episode=%s passed=%s flags=%s page_kb=%d wearer=%s",
        view.episode_id,
        result.passed,
        ",".join(result.flags),
        len(page) // 1024,
        [k for k in view.hands if k in WEARER],
    )
    return qa_row(view, result, path)
