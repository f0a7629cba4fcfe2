"""Per-episode retargeting: frames and `hands_world` rows in, `robot_actions` and `robot_quality` rows out.

Called by the `retarget` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two light
frames per episode: its frames (`frame_idx`, `ts_s`, and the camera centre `world_from_cam_t_mu` where a
camera pose exists) and its wearer hands' world keypoints with the episode's `scale_source`. Callable on
pandas frames without Spark. The output stacks both tables (`udfs.multi_output`).

Rows: for each configured embodiment and each retargeted identity the episode has, one `robot_actions`
row per control step of the embodiment: step k is at the first frame's `ts_s` + k / `control_fps` (the
profile's rate) and takes the hand of the source frame nearest in presentation time (`frame_idx`;
sample and hold as the export's tensors, never interpolated), so speed limits hold at the robot's own
rate. Its `hand_state` (`pose_core.retarget.quality`) says whether the step is valid: `observed` or
`filled` (gap-filled by fusion's rules), else `missing` (no hands_world row: nothing invented) or
`beyond_reach` (a wrist farther from the camera centre than `max_hand_distance_m`: a failed hand fit).
Invalid steps have null joints, gripper and poses and `reachable = false`; valid steps whose target the
robot cannot reach keep the solver's bounded, continuous joints with `reachable = false` (flagged, not
hidden). Arms place their base per `base_placement` (`search`: per episode and hand, the position and
yaw that reach most of the trajectory, `pose_core.retarget.placement`) and store a stick figure of the
arm in the world (`arm_points_world`) for the QA page. Dexterous hands (`kind: hand`) get
keypoint-vector joints, a null gripper and null tool poses; their `ee_error_m` is the mean
keypoint-vector error. One `robot_quality` row per embodiment pools its followed hands' figures and
says whether the episode passes `quality` (else the robot's dataset leaves it out, with the reasons).

Scale: an arm follows wrist positions, which are metres only when the episode's `scale_source` is not
`none`; every row records that source and the scale's relative standard error (`scale_rel_std`, from
`hands_world.metres_per_unit_std` when the rows have it). Without a metric scale every arm's rows are
written with null joints, `reachable = false` and the reason in `refused` (its quality row fails with
it); a dexterous hand needs only wrist-relative keypoints, metric from the hand-size prior, and is
retargeted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from pose_core.errors import EgolakeError
from pose_core.hands.fusion import SCALE_SOURCES
from pose_core.identities import is_right_hand
from pose_core.retarget import (
    Embodiment,
    as_right_hand,
    grip_aperture_from_keypoints,
    keypoints_in_wrist,
    margins_from_home,
    retarget_hand_keypoints,
    retarget_wrist_trajectory,
    search_base,
    smoothed_world_targets,
    world_from_base_at_wrists,
    wrist_from_keypoints,
)
from pose_core.retarget.quality import (
    VALID_STATES,
    RetargetFigures,
    evaluate_quality,
    hand_states,
    joint_violations,
    retarget_figures,
)
from pose_core.training.tensors import nearest_source, uniform_times
from schemas.tables import ROBOT_ACTIONS, ROBOT_QUALITY
from udfs.columns import list_column
from udfs.multi_output import stack_tables, union_schema
from udfs.options import RetargetStageOptions
from udfs.robots import load_embodiment

__all__ = [
    "CAMERA_COLUMN",
    "DEFAULT_PROFILES_DIR",
    "FRAME_COLUMNS",
    "GRAVITY_COLUMN",
    "HAND_COLUMNS",
    "SCALE_COLUMNS",
    "STEP_ERRORS",
    "OUTPUT_SCHEMA",
    "USER_SCALE_HINT",
    "load_embodiments",
    "profile_path",
    "profiles_digest",
    "retarget_episode",
    "retarget_named",
]

logger = logging.getLogger(__name__)

#: The project's embodiment profiles.
DEFAULT_PROFILES_DIR = Path(__file__).resolve().parents[1] / "conf" / "embodiments"
#: Columns of the two inputs; `gravity_dir_world` (hands_world, per episode), `filled` and the frames'
#: camera centre are optional.
FRAME_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "ts_s")
HAND_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "identity", "keypoints_world_m", "scale_source")
GRAVITY_COLUMN = "gravity_dir_world"
#: Optional hands_world columns: the metric scale and its standard error, recorded on every row.
SCALE_COLUMNS: tuple[str, ...] = ("metres_per_unit", "metres_per_unit_std")
#: The camera centre per frame (camera_poses, map units; times hands_world's `metres_per_unit`).
CAMERA_COLUMN = "world_from_cam_t_mu"
#: `robot_actions`' per-step error columns in `pose_core.retarget.quality.retarget_figures`' order: to the
#: hand, to the smoothed target (tracking), the axes, the smoothing shift.
STEP_ERRORS: tuple[str, ...] = ("hand_error_m", "ee_error_m", "approach_error_rad", "closing_error_rad",
                                "target_shift_m")
#: The stage's output: `robot_actions` and `robot_quality` rows stacked.
OUTPUT_SCHEMA = union_schema([ROBOT_ACTIONS, ROBOT_QUALITY])
#: How a user gives a metric scale when the episode has none (conf/embodiments/README.md).
USER_SCALE_HINT = "--set fusion.user_metres_per_unit=<metres per map unit>"


_EMBODIMENTS: dict[tuple[str, str, str, str], Embodiment] = {}


def profile_path(name: str, opts: RetargetStageOptions) -> Path:
    """The profile file of embodiment `name` (`retarget.profiles_dir`, else the project's)."""
    return (Path(opts.profiles_dir) if opts.profiles_dir else DEFAULT_PROFILES_DIR) / f"{name}.yaml"


def profiles_digest(names: Sequence[str], opts: RetargetStageOptions) -> str:
    """SHA-256 (16 hex) of the named profiles' text (a missing one counts as missing).

    Part of the retarget stage's config hash: editing a profile re-runs the stage on `--resume`. The
    URDFs are not covered (they are the robots', outside egolake): after changing one, run with
    `--from-stage retarget`.
    """
    digest = hashlib.sha256()
    for name in names:
        path = profile_path(name, opts)
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    return digest.hexdigest()[:16]


def load_embodiments(names: Sequence[str], opts: RetargetStageOptions) -> tuple[Embodiment, ...]:
    """The named profiles with their URDFs, loaded on first use in this process and cached.

    The cache key includes the profile's text, so an edited profile is read again.

    Raises:
        EgolakeError: a name has no profile (the known ones are listed).
        InputError: the robots root is unset, or a profile or its URDF is invalid or missing (named).
    """
    out = []
    for name in names:
        path = profile_path(name, opts)
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise EgolakeError(f"no embodiment profile {name!r} in {path.parent}; known: {known}")
        key = (name, str(path), opts.robots_dir, path.read_text(encoding="utf-8"))
        if key not in _EMBODIMENTS:
            _EMBODIMENTS[key] = load_embodiment(path, opts.robots_dir or None)
        out.append(_EMBODIMENTS[key])
    return tuple(out)


def _rows_on_axis(values: np.ndarray, has: np.ndarray) -> list[list[float] | None]:
    """Per-step lists ``(S, ...)`` flattened, None where ``has`` is False."""
    flat = values.reshape(len(values), -1)
    return [row.tolist() if ok else None for row, ok in zip(flat, has, strict=True)]


def _gravity(hands: pd.DataFrame, opts: RetargetStageOptions) -> np.ndarray:
    """The episode's gravity direction in the world ``(3,)``: hands_world's, else the configured default."""
    if GRAVITY_COLUMN in hands:
        known = hands[GRAVITY_COLUMN].dropna()
        if len(known):
            return np.asarray(known.iat[0], np.float64)
    return np.asarray(opts.default_gravity_dir_world, np.float64)


def _camera_centres(axis: pd.DataFrame, hands: pd.DataFrame) -> np.ndarray:
    """Camera centre per frame of ``axis`` in the world, metres ``(F, 3)``; NaN where unknown (kept valid)."""
    out = np.full((len(axis), 3), np.nan)
    if CAMERA_COLUMN not in axis or "metres_per_unit" not in hands:
        return out
    scale = hands["metres_per_unit"].dropna()
    has = axis[CAMERA_COLUMN].notna().to_numpy()
    if len(scale) and has.any():
        centres = list_column(axis[CAMERA_COLUMN][has], 3)
        out[has] = centres * float(scale.iat[0])
    return out


def _scale_rel_std(hands: pd.DataFrame) -> float:
    """The episode's metric scale's relative standard error; NaN when unknown (or no scale)."""
    if not all(c in hands for c in SCALE_COLUMNS):
        return float("nan")
    scale, std = (hands[c].dropna() for c in SCALE_COLUMNS)
    return float(std.iat[0] / scale.iat[0]) if len(scale) and len(std) else float("nan")


def _scale_refusal(hands: pd.DataFrame) -> str | None:
    """Why arms cannot be retargeted in this episode (no metric scale), or None when they can.

    An uncertain scale is not refused here: every row records it (`scale_rel_std`), and QA's
    `scale_uncertain` fails the episode above its bound, which leaves it out of every dataset, human or
    robot.
    """
    sources = sorted({str(s) for s in hands["scale_source"].dropna()})
    if len(sources) == 1 and sources[0] in SCALE_SOURCES:
        return None
    found = sources[0] if len(sources) == 1 else (", ".join(sources) or "null")
    return (
        f"no metric scale (hands_world.scale_source = {found}): wrist motion is in map units, not "
        f"metres; give the scale with {USER_SCALE_HINT}"
    )


@dataclass
class _Track:
    """One followed hand at one embodiment's control steps (``S`` steps)."""

    identity: str
    keypoints: np.ndarray  # (S, 21, 3), NaN where the step is not valid
    states: np.ndarray  # (S,) hand states
    ts: np.ndarray  # (S,) step times
    frame_idx: np.ndarray  # (S,) source frames


def _no_rows(emb: Embodiment, track: _Track, reason: str | None) -> dict[str, object]:
    steps = len(track.ts)
    empty = dict.fromkeys(
        (
            "gripper",
            "ee_error_m",
            "hand_error_m",
            "ee_error_rad",
            "approach_error_rad",
            "closing_error_rad",
            "target_shift_m",
        ),
        np.nan,
    )
    return {
        "refused": reason,
        "joint_names": [list(emb.model.joint_names)] * steps,
        "reachable": False,
        **dict.fromkeys(("joint_positions", "ee_target_base", "ee_base", "arm_points_world")),
        **empty,
    }


def _arm(
    emb: Embodiment, track: _Track, opts: RetargetStageOptions, gravity: np.ndarray
) -> tuple[dict[str, object], RetargetFigures, dict[str, object]]:
    """Columns, figures and the per-hand record (base pose, search score) of one arm following one hand."""
    is_right = is_right_hand(track.identity)
    world_from_wrist = wrist_from_keypoints(track.keypoints, is_right)
    score = None
    if opts.base_placement == "profile":
        base = emb.world_from_base
    else:
        targets = smoothed_world_targets(emb, world_from_wrist, emb.control_fps, opts.arm)
        if opts.base_placement == "search":
            base, score = search_base(
                emb, targets, gravity, partial(margins_from_home, emb, opts.arm), opts.arm.placement
            )
        else:
            base = world_from_base_at_wrists(emb, targets, gravity)
    res = retarget_wrist_trajectory(
        emb, world_from_wrist, grip_aperture_from_keypoints(track.keypoints), track.ts, opts.arm, base
    )
    has = res.valid
    points = emb.model.joint_origins(res.joint_positions)
    points = np.concatenate([np.zeros((len(points), 1, 3)), points, res.base_from_tcp[:, None, :3, 3]], 1)
    points_world = points @ base[:3, :3].T + base[:3, 3]
    figures = retarget_figures(
        track.states,
        res.reachable,
        res.hand_error_m,
        res.ee_error_m,
        res.approach_error_rad,
        res.closing_error_rad,
        res.target_shift_m,
        (res.limit_violations, res.velocity_violations, res.acceleration_violations),
    )
    per_step = {
        "gripper": res.gripper,
        "ee_error_m": res.ee_error_m,
        "hand_error_m": res.hand_error_m,
        "ee_error_rad": res.ee_error_rad,
        "approach_error_rad": res.approach_error_rad,
        "closing_error_rad": res.closing_error_rad,
        "target_shift_m": res.target_shift_m,
    }
    columns = {
        "refused": None,
        "joint_names": [list(res.joint_names)] * len(track.ts),
        "reachable": res.reachable,
        "joint_positions": _rows_on_axis(res.joint_positions, has),
        "ee_target_base": _rows_on_axis(res.base_from_tcp_target, has),
        "ee_base": _rows_on_axis(res.base_from_tcp, has),
        "arm_points_world": _rows_on_axis(points_world, has),
        **{k: np.where(has, v, np.nan) for k, v in per_step.items()},
    }
    return columns, figures, {"world_from_base": np.round(base, 6).tolist(), "base_search_score": score}


def _hand(
    emb: Embodiment, track: _Track, opts: RetargetStageOptions
) -> tuple[dict[str, object], RetargetFigures]:
    """Columns and figures of one dexterous hand following one human hand."""
    is_right = is_right_hand(track.identity)
    wrist = wrist_from_keypoints(track.keypoints, is_right)
    in_wrist = as_right_hand(keypoints_in_wrist(track.keypoints, wrist), is_right)
    res = retarget_hand_keypoints(emb, in_wrist, track.ts, opts.hand)
    valid = res.valid & np.isin(track.states, VALID_STATES)
    violations = joint_violations(
        res.joint_positions, 1.0 / emb.control_fps, (emb.lower, emb.upper), emb.velocity, emb.acceleration
    )
    nan = np.full(len(track.ts), np.nan)
    error = res.vector_error_m
    figures = retarget_figures(track.states, valid, error, error, nan, nan, nan, violations)
    columns = {
        **_no_rows(emb, track, None),
        "joint_positions": _rows_on_axis(res.joint_positions, valid),
        "ee_error_m": np.where(valid, error, np.nan),
        "hand_error_m": np.where(valid, error, np.nan),
        "reachable": valid,
    }
    return columns, figures


def _quality_row(
    episode_id: str,
    emb: Embodiment,
    parts: list[tuple[_Track, dict[str, object]]],
    hands: dict[str, dict[str, object]],
    refused: str | None,
    opts: RetargetStageOptions,
) -> dict[str, object]:
    """The embodiment's `robot_quality` row: its followed hands' steps pooled, with the verdict."""

    def pooled(column: str, dtype: type = np.float64) -> np.ndarray:
        return np.concatenate([np.broadcast_to(np.asarray(c[column], dtype), len(t.ts)) for t, c in parts])

    keys = ("limit_violations", "speed_violations", "acceleration_violations")
    violations = tuple(sum(int(h["figures"][k]) for h in hands.values()) for k in keys)
    errors = [pooled(c) for c in STEP_ERRORS]
    states = np.concatenate([t.states for t, _ in parts])
    figures = retarget_figures(states, pooled("reachable", bool), *errors, violations)
    is_arm = emb.kind == "arm"
    passed, flags, reasons = evaluate_quality(figures, opts.quality, is_arm, refused)
    return {
        "episode_id": episode_id,
        "embodiment": emb.name,
        "kind": emb.kind,
        "identities": [t.identity for t, _ in parts],
        "passed": passed,
        "flags": list(flags),
        "reasons": list(reasons),
        **figures.to_dict(),
        "position_tol_m": emb.reach_position_tol_m,
        "approach_tol_rad": emb.orientation.approach_tol_rad if is_arm else None,
        "closing_tol_rad": emb.orientation.closing_tol_rad if is_arm else None,
        "hands_json": json.dumps(hands, sort_keys=True),
    }


def _tracks(
    frames: pd.DataFrame, hands: pd.DataFrame, emb: Embodiment, opts: RetargetStageOptions
) -> list[_Track]:
    """Each followed hand at the embodiment's control steps, with its hand states."""
    episode_id = frames["episode_id"].iat[0]
    axis = frames.sort_values("frame_idx").drop_duplicates("frame_idx")
    frame_idx = axis["frame_idx"].to_numpy(np.int64)
    ts = axis["ts_s"].to_numpy(np.float64)
    if not np.all(np.diff(ts) > 0):
        raise EgolakeError(f"episode {episode_id}: retargeting needs strictly increasing ts_s in frame order")
    position = pd.Series(np.arange(len(frame_idx)), index=frame_idx)
    cameras = _camera_centres(axis, hands)
    times = uniform_times(ts, emb.control_fps)  # control steps, seconds from the first frame
    src = nearest_source(ts, times)
    out = []
    for identity, rows in hands.groupby("identity", sort=True):
        at = position.reindex(rows["frame_idx"].to_numpy(np.int64))
        if at.isna().any():
            raise EgolakeError(
                f"episode {episode_id}: hands_world frames {at.index[at.isna()][:5].tolist()} "
                f"of {identity} are not in frames"
            )
        at = at.to_numpy(np.int64)
        kp = np.full((len(frame_idx), 21, 3), np.nan)
        kp[at] = list_column(rows["keypoints_world_m"], 63).reshape(-1, 21, 3)
        present, filled = np.zeros(len(frame_idx), bool), np.zeros(len(frame_idx), bool)
        present[at] = True
        if "filled" in rows:
            filled[at] = rows["filled"].fillna(False).to_numpy(bool)
        distance = np.linalg.norm(kp[:, 0] - cameras, axis=1)
        states = hand_states(present[src], filled[src], distance[src], opts.max_hand_distance_m)
        steps = kp[src]
        steps[~np.isin(states, VALID_STATES)] = np.nan
        out.append(_Track(str(identity), steps, states, ts[0] + times, frame_idx[src]))
    return out


def retarget_named(
    frames: pd.DataFrame, hands: pd.DataFrame, names: Sequence[str], opts: RetargetStageOptions
) -> pd.DataFrame:
    """`retarget_episode` with the named embodiments, loaded where it runs (once per worker, cached)."""
    return retarget_episode(frames, hands, load_embodiments(names, opts), opts)


def retarget_episode(
    frames: pd.DataFrame, hands: pd.DataFrame, embodiments: Sequence[Embodiment], opts: RetargetStageOptions
) -> pd.DataFrame:
    """`robot_actions` and `robot_quality` rows of one episode, stacked (see the module docstring).

    Args:
        frames: the episode's frames (`FRAME_COLUMNS`, optional `CAMERA_COLUMN`), any order.
        hands: its `hands_world` rows (`HAND_COLUMNS`, optional `GRAVITY_COLUMN`, `filled`,
            `SCALE_COLUMNS`); identities not in `opts.identities` are ignored.
        embodiments: the robots to retarget to.
        opts: placement, validity, solver and quality settings.

    Returns:
        Rows with `OUTPUT_SCHEMA`'s columns (`_table` names each row's table; lineage columns excepted).

    Raises:
        EgolakeError: a hand row names a frame that `frames` lacks, `ts_s` is not strictly increasing,
            or `hands` lacks `scale_source`.
    """
    hands = hands[hands["identity"].isin(opts.identities)]
    if hands.empty or frames.empty or not embodiments:
        return stack_tables([])
    episode_id = frames["episode_id"].iat[0]
    if "scale_source" not in hands:
        raise EgolakeError(f"episode {episode_id}: hands_world rows need scale_source (arms need metres)")
    gravity = _gravity(hands, opts)
    refusal = _scale_refusal(hands)
    sources = hands["scale_source"].dropna()
    scale = {
        "scale_source": str(sources.iat[0]) if len(sources) else "none",
        "scale_rel_std": _scale_rel_std(hands),
    }
    actions, quality = [], []
    for emb in embodiments:
        refused = refusal if emb.kind == "arm" else None
        parts, records = [], {}
        for track in _tracks(frames, hands, emb, opts):
            if refused is not None:
                columns = _no_rows(emb, track, refused)
            elif emb.kind == "arm":
                columns, figures, record = _arm(emb, track, opts, gravity)
                records[track.identity] = {**record, "figures": figures.to_dict()}
            else:
                columns, figures = _hand(emb, track, opts)
                records[track.identity] = {"figures": figures.to_dict()}
            parts.append((track, columns))
            actions.append(
                pd.DataFrame(
                    {
                        "episode_id": episode_id,
                        "embodiment": emb.name,
                        "identity": track.identity,
                        "step_idx": np.arange(len(track.ts)),
                        "control_fps": emb.control_fps,
                        "frame_idx": track.frame_idx,
                        "ts_s": track.ts,
                        "hand_state": track.states,
                        **scale,
                        **columns,
                    }
                )
            )
        row = _quality_row(episode_id, emb, parts, records, refused, opts)
        quality.append(row)
        logger.info(
            "retargeted episode=%s embodiment=%s steps=%d valid=%.2f reachable=%s passed=%s %s",
            episode_id,
            emb.name,
            row["steps"],
            row["valid_fraction"],
            row["reachable_fraction"],
            row["passed"],
            "; ".join(row["reasons"]),
        )
    return stack_tables(
        [(ROBOT_ACTIONS, pd.concat(actions, ignore_index=True)), (ROBOT_QUALITY, pd.DataFrame(quality))]
    )
