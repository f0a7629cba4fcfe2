"""Per-episode retargeting: the episode's frames and `hands_world` rows in, `robot_actions` rows out.

Called by the `retarget` stage through `groupBy(episode_id).cogroup(...).applyInPandas` with two light
frames per episode: its frames (`frame_idx`, `ts_s`) and its wearer hands' world keypoints with the
episode's `scale_source`. Callable on pandas frames without Spark.

Rows: for each configured embodiment and each retargeted identity the episode has, one row per control
step of the embodiment: step k is at the first frame's `ts_s` + k / `control_fps` (the profile's rate)
and takes the hand of the source frame nearest in presentation time (`frame_idx`; sample and hold as the
export's tensors, never interpolated), so speed limits hold at the robot's own rate. Steps whose
source frame has no `hands_world` row for that hand (not seen, not gap-filled) keep their row with null
joints, gripper and poses and `reachable = false`: the gaps are explicit, and nothing is invented there.
Steps with a hand whose target the robot cannot reach keep the solver's bounded, continuous joints with
`reachable = false` (flagged, not hidden). Dexterous hands (`kind: hand`) get keypoint-vector joints,
a null gripper and null tool poses; their `ee_error_m` is the mean keypoint-vector error.

Scale: an arm follows wrist positions, which are metres only when the episode's `scale_source` is not
`none`; every row records that source and the scale's relative standard error (`scale_rel_std`, from
`hands_world.metres_per_unit_std` when the rows have it). Without a metric scale every arm's rows are
written with null joints, `reachable = false` and the reason in `refused` (the export leaves the
episode out of that robot's dataset, naming it); a dexterous hand needs only wrist-relative keypoints,
metric from the hand-size prior, and is retargeted.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pose_core.errors import EgolakeError
from pose_core.hands.fusion import SCALE_SOURCES
from pose_core.retarget import (
    Embodiment,
    HandRetargetOptions,
    RetargetOptions,
    as_right_hand,
    grip_aperture_from_keypoints,
    keypoints_in_wrist,
    load_embodiment,
    retarget_hand_keypoints,
    retarget_wrist_trajectory,
    world_from_base_at_wrists,
    wrist_from_keypoints,
)
from pose_core.training.tensors import nearest_source, uniform_times
from schemas.tables import ROBOT_ACTIONS
from udfs.guard import run_unit

__all__ = [
    "BASE_PLACEMENTS",
    "DEFAULT_PROFILES_DIR",
    "FRAME_COLUMNS",
    "GRAVITY_COLUMN",
    "HAND_COLUMNS",
    "SCALE_COLUMNS",
    "RetargetStageOptions",
    "USER_SCALE_HINT",
    "guarded_retarget",
    "load_embodiments",
    "profile_path",
    "profiles_digest",
    "retarget_episode",
]

logger = logging.getLogger(__name__)

#: The project's embodiment profiles.
DEFAULT_PROFILES_DIR = Path(__file__).resolve().parents[1] / "conf" / "embodiments"
#: Where an arm's base stands: the profile's pose, or moved to each hand's median wrist position.
BASE_PLACEMENTS = ("profile", "wrist_median")
#: Columns of the two inputs; `gravity_dir_world` (hands_world, per episode) is optional.
FRAME_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "ts_s")
HAND_COLUMNS: tuple[str, ...] = ("episode_id", "frame_idx", "identity", "keypoints_world_m", "scale_source")
GRAVITY_COLUMN = "gravity_dir_world"
#: Optional hands_world columns: the metric scale and its standard error, recorded on every row.
SCALE_COLUMNS: tuple[str, ...] = ("metres_per_unit", "metres_per_unit_std")
#: How a user gives a metric scale when the episode has none (conf/embodiments/README.md).
USER_SCALE_HINT = "--set fusion.user_metres_per_unit=<metres per map unit>"


@dataclass(frozen=True)
class RetargetStageOptions:
    """Where profiles and URDFs are, how robot bases are placed, and the solvers."""

    # Robots root holding the URDFs (conf/embodiments/README.md); empty: $EGOLAKE_ROBOTS_DIR.
    robots_dir: str = ""
    # Folder of the profiles <name>.yaml; empty: the project's conf/embodiments.
    profiles_dir: str = ""
    # Where each arm's base stands: "profile" (the profile's world_from_base, for a z-up metric world) or
    # "wrist_median" (upright against gravity, facing the first camera's forward, turned as the profile
    # says, and moved so each hand's median wrist lands on the workspace centre; for a world that is the
    # first camera's frame, as hands_world's is).
    base_placement: str = "wrist_median"
    # Gravity (down) in the world for "wrist_median" when hands_world has no gravity_dir_world (no IMU):
    # the first camera's y, i.e. a first frame held level.
    default_gravity_dir_world: tuple[float, float, float] = (0.0, 1.0, 0.0)
    # hands_world identities retargeted, each to its own copy of every embodiment.
    identities: tuple[str, ...] = ("wearer_left", "wearer_right")
    # Arm solver: chunked, warm-started damped-least-squares IK with joint and speed limits.
    arm: RetargetOptions = field(default_factory=RetargetOptions)
    # Dexterous-hand solver: keypoint-vector retargeting.
    hand: HandRetargetOptions = field(default_factory=HandRetargetOptions)

    def __post_init__(self) -> None:
        if self.base_placement not in BASE_PLACEMENTS:
            raise ValueError(f"retarget.base_placement must be one of {BASE_PLACEMENTS}, "
                             f"got {self.base_placement!r}")


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
    """Per-frame lists ``(F, ...)`` flattened, None where ``has`` is False."""
    flat = values.reshape(len(values), -1)
    return [row.tolist() if ok else None for row, ok in zip(flat, has, strict=True)]


def _gravity(hands: pd.DataFrame, opts: RetargetStageOptions) -> np.ndarray:
    """The episode's gravity direction in the world ``(3,)``: hands_world's, else the configured default."""
    if GRAVITY_COLUMN in hands:
        known = hands[GRAVITY_COLUMN].dropna()
        if len(known):
            return np.asarray(known.iat[0], np.float64)
    return np.asarray(opts.default_gravity_dir_world, np.float64)


def _scale_refusal(hands: pd.DataFrame) -> str | None:
    """Why arms cannot be retargeted in this episode (no metric scale), or None when they can."""
    sources = sorted({str(s) for s in hands["scale_source"].dropna()})
    if len(sources) == 1 and sources[0] in SCALE_SOURCES:
        return None
    found = sources[0] if len(sources) == 1 else (", ".join(sources) or "null")
    return (f"no metric scale (hands_world.scale_source = {found}): wrist motion is in map units, not "
            f"metres; give the scale with {USER_SCALE_HINT}")


def _scale_rel_std(hands: pd.DataFrame) -> float:
    """The episode's metric scale's relative standard error; NaN when unknown (or no scale)."""
    if not all(c in hands for c in SCALE_COLUMNS):
        return float("nan")
    scale, std = (hands[c].dropna() for c in SCALE_COLUMNS)
    return float(std.iat[0] / scale.iat[0]) if len(scale) and len(std) else float("nan")


def _refused_columns(emb: Embodiment, steps: int, reason: str) -> dict[str, object]:
    return {
        "refused": reason,
        "joint_names": [list(emb.model.joint_names)] * steps,
        "joint_positions": None,
        "gripper": np.nan,
        "ee_target_base": None,
        "ee_base": None,
        "ee_error_m": np.nan,
        "ee_error_rad": np.nan,
        "reachable": False,
    }


def _arm_columns(emb: Embodiment, kp: np.ndarray, has: np.ndarray, ts: np.ndarray, is_right: bool,
                 opts: RetargetStageOptions, gravity: np.ndarray) -> dict[str, object]:
    world_from_wrist = wrist_from_keypoints(kp, is_right)
    base = (world_from_base_at_wrists(emb, world_from_wrist, gravity) if opts.base_placement == "wrist_median"
            else None)
    aperture = grip_aperture_from_keypoints(kp)
    res = retarget_wrist_trajectory(emb, world_from_wrist, aperture, ts, opts.arm, base)
    gripper = res.gripper if emb.gripper is not None else np.full(len(ts), np.nan)
    return {
        "refused": None,
        "joint_names": [list(res.joint_names)] * len(ts),
        "joint_positions": _rows_on_axis(res.joint_positions, has),
        "gripper": np.where(has, gripper, np.nan),
        "ee_target_base": _rows_on_axis(res.base_from_tcp_target, has & np.isfinite(res.ee_error_m)),
        "ee_base": _rows_on_axis(res.base_from_tcp, has),
        "ee_error_m": np.where(has, res.ee_error_m, np.nan),
        "ee_error_rad": np.where(has, res.ee_error_rad, np.nan),
        "reachable": res.reachable & has,
    }


def _hand_columns(emb: Embodiment, kp: np.ndarray, has: np.ndarray, ts: np.ndarray, is_right: bool,
                  opts: RetargetStageOptions) -> dict[str, object]:
    in_wrist = as_right_hand(keypoints_in_wrist(kp, wrist_from_keypoints(kp, is_right)), is_right)
    res = retarget_hand_keypoints(emb, in_wrist, ts, opts.hand)
    valid = res.valid & has
    return {
        "refused": None,
        "joint_names": [list(res.joint_names)] * len(ts),
        "joint_positions": _rows_on_axis(res.joint_positions, valid),
        "gripper": np.nan,
        "ee_target_base": None,
        "ee_base": None,
        "ee_error_m": np.where(valid, res.vector_error_m, np.nan),
        "ee_error_rad": np.nan,
        "reachable": valid,
    }


def retarget_episode(frames: pd.DataFrame, hands: pd.DataFrame, embodiments: Sequence[Embodiment],
                     opts: RetargetStageOptions) -> pd.DataFrame:
    """`robot_actions` rows of one episode (see the module docstring for which rows).

    Args:
        frames: the episode's frames (`FRAME_COLUMNS`), any order.
        hands: its `hands_world` rows (`HAND_COLUMNS`, optional `GRAVITY_COLUMN`); identities not in
            `opts.identities` are ignored.
        embodiments: the robots to retarget to.
        opts: placement and solver settings.

    Returns:
        Rows with `ROBOT_ACTIONS.columns` (lineage columns excepted).

    Raises:
        EgolakeError: a hand row names a frame that `frames` lacks, `ts_s` is not strictly increasing,
            or `hands` lacks `scale_source`.
    """
    hands = hands[hands["identity"].isin(opts.identities)]
    if hands.empty or frames.empty or not embodiments:
        return pd.DataFrame(columns=ROBOT_ACTIONS.columns)
    episode_id = frames["episode_id"].iat[0]
    if "scale_source" not in hands:
        raise EgolakeError(f"episode {episode_id}: hands_world rows need scale_source (arms need metres)")
    axis = frames.sort_values("frame_idx").drop_duplicates("frame_idx")
    frame_idx = axis["frame_idx"].to_numpy(np.int64)
    ts = axis["ts_s"].to_numpy(np.float64)
    if not np.all(np.diff(ts) > 0):
        raise EgolakeError(f"episode {episode_id}: retargeting needs strictly increasing ts_s in frame order")
    position = pd.Series(np.arange(len(frame_idx)), index=frame_idx)
    gravity = _gravity(hands, opts)
    refusal = _scale_refusal(hands)
    sources = hands["scale_source"].dropna()
    scale = {"scale_source": str(sources.iat[0]) if len(sources) else "none",
             "scale_rel_std": _scale_rel_std(hands)}
    parts = []
    for identity, rows in hands.groupby("identity", sort=True):
        at = position.reindex(rows["frame_idx"].to_numpy(np.int64))
        if at.isna().any():
            raise EgolakeError(f"episode {episode_id}: hands_world frames {at.index[at.isna()][:5].tolist()} "
                               f"of {identity} are not in frames")
        kp = np.full((len(frame_idx), 21, 3), np.nan)
        kp[at.to_numpy(np.int64)] = np.stack([np.asarray(v, np.float64) for v in rows["keypoints_world_m"]]
                                             ).reshape(-1, 21, 3)
        has = np.zeros(len(frame_idx), bool)
        has[at.to_numpy(np.int64)] = True
        is_right = identity == "wearer_right"
        for emb in embodiments:
            times = uniform_times(ts, emb.control_fps)  # control steps, seconds from the first frame
            src = nearest_source(ts, times)
            step_ts = ts[0] + times
            refused = refusal if emb.kind == "arm" else None
            if refused is not None:
                columns = _refused_columns(emb, len(src), refused)
            elif emb.kind == "arm":
                columns = _arm_columns(emb, kp[src], has[src], step_ts, is_right, opts, gravity)
            else:
                columns = _hand_columns(emb, kp[src], has[src], step_ts, is_right, opts)
            out = pd.DataFrame({"episode_id": episode_id, "embodiment": emb.name, "identity": identity,
                                "step_idx": np.arange(len(src)), "control_fps": emb.control_fps,
                                "frame_idx": frame_idx[src], "ts_s": step_ts, **scale, **columns})
            if refused is not None:
                logger.warning("retarget refused episode=%s embodiment=%s identity=%s: %s", episode_id,
                               emb.name, identity, refused)
            else:
                logger.info("retargeted episode=%s embodiment=%s identity=%s steps=%d at %d Hz with_hand=%d "
                            "reachable=%d", episode_id, emb.name, identity, len(out), emb.control_fps,
                            int(has[src].sum()), int(out["reachable"].sum()))
            parts.append(out)
    return pd.concat(parts, ignore_index=True).loc[:, list(ROBOT_ACTIONS.columns)]


def guarded_retarget(frames: pd.DataFrame, hands: pd.DataFrame, names: Sequence[str],
                     opts: RetargetStageOptions) -> pd.DataFrame:
    """`retarget_episode` for `cogroup(...).applyInPandas`; a failure becomes the episode's error row."""
    unit = frames if not frames.empty else hands
    return run_unit(lambda _: retarget_episode(frames, hands, load_embodiments(names, opts), opts),
                    unit, ROBOT_ACTIONS.columns)
