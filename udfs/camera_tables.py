"""Camera values <-> table rows: poses, cameras, keyframes, map points; the camera of decoded frames.

Poses are q_wxyz + t columns; the camera of decoded frames comes from the `videos` row (sidecar
intrinsics or the prior). Every conversion here is exact and inverse to its partner, so a stage that
reads what another wrote gets the arrays that stage had (poses to float64 precision).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd

from pose_core.camera_poses.keyframe_map import Keyframe
from pose_core.camera_poses.tracking import TrackingResult, TrackingState
from pose_core.errors import EgolakeError, InputError
from pose_core.geometry.camera import Camera
from pose_core.geometry.rigid3 import invert_rigid_matrices, matrix_from_quat_wxyz, quat_wxyz_from_matrix

__all__ = [
    "camera_for_frames",
    "camera_from_row",
    "camera_row",
    "keyframe_rows",
    "keyframes_from_rows",
    "point_rows",
    "points_from_rows",
    "pose_columns",
    "state_names",
    "tracking_result_from_rows",
    "world_from_cam_from_columns",
]

logger = logging.getLogger(__name__)


def camera_for_frames(calibration_json: str | None, width: int, height: int) -> Camera:
    """The camera of frames decoded at `width x height`.

    From the `videos.calibration_json` sidecar (intrinsics of the stored frames) scaled to the decoded
    size, or, without one, the prior of `Camera.from_prior`: principal point at the centre and a
    70 degree horizontal field of view (depth then scales with the true focal length / the prior's).

    Raises:
        InputError: `bad_intrinsics` for a radtan model with a non-zero k3 (not modelled).
    """
    if calibration_json is None or (isinstance(calibration_json, float) and np.isnan(calibration_json)):
        return Camera.from_prior(width, height)
    calib = json.loads(calibration_json)
    coeffs = tuple(float(c) for c in calib["distortion"])
    model = {"none": "pinhole", "radtan": "radtan", "equidistant": "fisheye"}[calib["distortion_model"]]
    if model == "radtan" and len(coeffs) == 5:
        if coeffs[4] != 0.0:
            raise InputError("bad_intrinsics", f"radtan k3={coeffs[4]} is not supported by the camera model")
        coeffs = coeffs[:4]
    camera = Camera(
        int(calib["width"]), int(calib["height"]), float(calib["fx"]), float(calib["fy"]),
        float(calib["cx"]), float(calib["cy"]), model, coeffs, "sidecar",
    )  # fmt: skip
    return camera.scaled(width, height)


def pose_columns(world_from_cam: np.ndarray) -> tuple[list[list[float] | None], list[list[float] | None]]:
    """The `world_from_cam_q_wxyz` and `world_from_cam_t_mu` values of poses ``(F, 4, 4)``; None where NaN."""
    ok = np.isfinite(world_from_cam).all(axis=(1, 2))
    q = np.zeros((len(world_from_cam), 4))
    if ok.any():
        q[ok] = quat_wxyz_from_matrix(world_from_cam[ok, :3, :3])
    t = world_from_cam[:, :3, 3]
    return (
        [q[i].tolist() if ok[i] else None for i in range(len(ok))],
        [t[i].tolist() if ok[i] else None for i in range(len(ok))],
    )


def world_from_cam_from_columns(q_wxyz: pd.Series, t_m: pd.Series) -> np.ndarray:
    """Poses ``(F, 4, 4)`` from the two pose columns; NaN rows where a value is null."""
    out = np.full((len(q_wxyz), 4, 4), np.nan)
    for i, (q, t) in enumerate(zip(q_wxyz, t_m, strict=True)):
        if q is None or t is None:
            continue
        out[i] = np.eye(4)
        out[i, :3, :3] = matrix_from_quat_wxyz(np.asarray(q, np.float64))
        out[i, :3, 3] = np.asarray(t, np.float64)
    return out


def camera_row(episode_id: str, camera: Camera) -> pd.DataFrame:
    """The `cameras` row of an episode."""
    return pd.DataFrame(
        [
            {
                "episode_id": episode_id,
                "width": camera.width,
                "height": camera.height,
                "fx": camera.fx,
                "fy": camera.fy,
                "cx": camera.cx,
                "cy": camera.cy,
                "model": camera.model,
                "dist": list(camera.dist),
                "intrinsics_source": camera.intrinsics_source,
            }
        ]
    )


def camera_from_row(rows: pd.DataFrame) -> Camera:
    """The `Camera` of a `cameras` row.

    Raises:
        EgolakeError: there is not exactly one row.
    """
    if len(rows) != 1:
        raise EgolakeError(f"expected one cameras row per episode, got {len(rows)}")
    r = rows.iloc[0]
    return Camera(
        int(r.width),
        int(r.height),
        float(r.fx),
        float(r.fy),
        float(r.cx),
        float(r.cy),
        r.model,
        tuple(float(d) for d in r.dist),
        r.intrinsics_source,
    )


def state_names(state: np.ndarray) -> list[str]:
    """Lower-case `TrackingState` names of int codes ``(F,)``."""
    return [TrackingState(int(s)).name.lower() for s in state]


def keyframe_rows(episode_id: str, keyframes: list[Keyframe], segment_id: np.ndarray) -> pd.DataFrame:
    """`keyframes` / `keyframe_poses` rows of keyframes (``cam_from_world`` stored as world_from_cam)."""
    wfc = (
        invert_rigid_matrices(np.stack([k.cam_from_world for k in keyframes]))
        if keyframes
        else np.zeros((0, 4, 4))
    )
    q, t = pose_columns(wfc)
    return pd.DataFrame(
        {
            "episode_id": episode_id,
            "frame_idx": np.array([k.frame_idx for k in keyframes], np.int64),
            "segment_id": np.array([segment_id[k.frame_idx] for k in keyframes], np.int32),
            "world_from_cam_q_wxyz": q,
            "world_from_cam_t_mu": t,
            "obs_point_idx": [np.asarray(k.point_idx, np.int64) for k in keyframes],
            "obs_xy": [np.asarray(k.xy, np.float64).reshape(-1) for k in keyframes],
        }
    )


def keyframes_from_rows(rows: pd.DataFrame) -> list[Keyframe]:
    """Inverse of `keyframe_rows`, in frame order."""
    rows = rows.sort_values("frame_idx")
    wfc = world_from_cam_from_columns(rows["world_from_cam_q_wxyz"], rows["world_from_cam_t_mu"])
    cfw = invert_rigid_matrices(wfc) if len(rows) else wfc
    return [
        Keyframe(int(f), c, np.asarray(p, np.int64), np.asarray(xy, np.float64).reshape(-1, 2))
        for f, c, p, xy in zip(rows["frame_idx"], cfw, rows["obs_point_idx"], rows["obs_xy"], strict=True)
    ]


def point_rows(episode_id: str, points: np.ndarray, result: TrackingResult | None = None) -> pd.DataFrame:
    """`ba_points` rows of points ``(P, 3)``, or `map_points` rows with the tracks and maps of ``result``."""
    df = pd.DataFrame(
        {
            "episode_id": episode_id,
            "point_idx": np.arange(len(points), dtype=np.int64),
            "x_in_world_mu": list(np.asarray(points, np.float64)),
        }
    )
    if result is not None:
        aliases: list[list[int]] = [[] for _ in range(len(points))]
        for track, point in result.point_aliases.items():
            aliases[point].append(track)
        df["track_id"] = np.asarray(result.point_track_id, np.int64)
        df["alias_track_ids"] = [np.asarray(a, np.int64) for a in aliases]
        df["segment_id"] = np.asarray(result.point_segment, np.int32)
    return df


def points_from_rows(rows: pd.DataFrame) -> np.ndarray:
    """Points ``(P, 3)`` indexed by `point_idx` (which must be 0..P-1).

    Raises:
        EgolakeError: point indices are not 0..P-1.
    """
    rows = rows.sort_values("point_idx")
    if not np.array_equal(rows["point_idx"].to_numpy(), np.arange(len(rows))):
        raise EgolakeError("map point indices are not 0..P-1")
    return np.array(rows["x_in_world_mu"].tolist(), np.float64).reshape(-1, 3)


def tracking_result_from_rows(
    tracks: pd.DataFrame, keyframes: pd.DataFrame, map_points: pd.DataFrame, points: np.ndarray
) -> TrackingResult:
    """A `TrackingResult` from `tracks`, keyframe rows, `map_points` and point coordinates ``(P, 3)``.

    Raises:
        EgolakeError: the tracks do not cover frames 0..F-1.
    """
    tracks = tracks.sort_values("frame_idx")
    if not np.array_equal(tracks["frame_idx"].to_numpy(), np.arange(len(tracks))):
        raise EgolakeError("tracks do not cover frames 0..F-1")
    codes = {s.name.lower(): int(s) for s in TrackingState}
    meta = map_points.sort_values("point_idx")
    return TrackingResult(
        world_from_cam=world_from_cam_from_columns(
            tracks["world_from_cam_q_wxyz"], tracks["world_from_cam_t_mu"]
        ),
        state=np.array([codes[s] for s in tracks["tracking_state"]], np.int8),
        segment_id=tracks["segment_id"].to_numpy(np.int32),
        is_keyframe=tracks["is_keyframe"].to_numpy(bool),
        num_inliers=tracks["num_inliers"].fillna(0).to_numpy(np.int32),
        reproj_error_px=tracks["reproj_error_px"].astype(np.float64).to_numpy(),
        points_in_world=points,
        point_track_id=meta["track_id"].to_numpy(np.int64),
        point_segment=meta["segment_id"].to_numpy(np.int32),
        keyframes=keyframes_from_rows(keyframes),
        point_aliases={
            int(track): int(point)
            for point, tracks in zip(meta["point_idx"], meta["alias_track_ids"], strict=True)
            for track in (tracks if tracks is not None else ())
        },
    )
