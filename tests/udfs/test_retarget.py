"""The retarget adapter on synthetic hands_world episodes whose wrists follow known robot trajectories.

Its output stacks `robot_actions` and `robot_quality` rows (`udfs.multi_output`); `run` splits them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pose_core.errors import EgolakeError, InputError
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.ik import pose_errors
from pose_core.retarget.placement import world_from_wrist_for_targets
from pose_core.synth.robot_hands import FPS, joint_trajectory, keypoints_at_wrists, tcp_poses
from schemas.tables import ROBOT_ACTIONS, ROBOT_QUALITY
from udfs import robots
from udfs.guard import ERROR_KIND, guarded_pair
from udfs.multi_output import split_tables
from udfs.options import RetargetStageOptions
from udfs.retarget import (
    CAMERA_COLUMN,
    DEFAULT_PROFILES_DIR,
    OUTPUT_SCHEMA,
    load_embodiments,
    retarget_episode,
    retarget_named,
)

FRAMES = 120
MISSING = slice(40, 55)  # frames where the left hand has no hands_world row
EPISODE = "e0"


@pytest.fixture(scope="module")
def opts(shared_data: Path) -> RetargetStageOptions:
    return RetargetStageOptions(robots_dir=str(shared_data / "robots"), base_placement="profile")


def episode(emb: Embodiment, seeds: dict[str, int], aperture_m: np.ndarray
            ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """(frames, hands_world rows, true tool poses per identity): each hand made from a robot trajectory."""
    ts = np.arange(FRAMES) / FPS + 3.0
    frames = pd.DataFrame({"episode_id": EPISODE, "frame_idx": np.arange(FRAMES) + 100, "ts_s": ts})
    rows, truth = [], {}
    for identity, seed in seeds.items():
        _, q = joint_trajectory(emb, FRAMES, seed)
        truth[identity] = tcp_poses(emb, q)
        kp = keypoints_at_wrists(world_from_wrist_for_targets(emb, truth[identity]),
                                 identity == "wearer_right", aperture_m)
        keep = np.ones(FRAMES, bool)
        if identity == "wearer_left":
            keep[MISSING] = False
        rows.append(pd.DataFrame({"episode_id": EPISODE, "frame_idx": frames["frame_idx"][keep],
                                  "identity": identity, "scale_source": "imu",
                                  "keypoints_world_m": [k.ravel().astype(np.float32) for k in kp[keep]]}))
    # A bystander's hand is not retargeted.
    rows.append(rows[0].assign(identity="other_0"))
    return frames, pd.concat(rows, ignore_index=True).sample(frac=1.0, random_state=0), truth


def run(frames: pd.DataFrame, hands: pd.DataFrame, embodiments: list[Embodiment],
        opts: RetargetStageOptions) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`retarget_episode`'s (robot_actions, robot_quality) rows."""
    out = retarget_episode(frames, hands, embodiments, opts)
    assert list(out.columns) == OUTPUT_SCHEMA.names
    tables = split_tables(out, [ROBOT_ACTIONS, ROBOT_QUALITY])
    return tables[ROBOT_ACTIONS.name], tables[ROBOT_QUALITY.name]


def arm_rows(out: pd.DataFrame, identity: str) -> pd.DataFrame:
    return out[out["identity"] == identity].sort_values("frame_idx").reset_index(drop=True)


@pytest.mark.parametrize("name", ["so100", "so101", "panda", "xarm7"])
def test_reachable_hands_meet_the_issue_numbers(name: str, opts: RetargetStageOptions) -> None:
    """Issue 7's done-when through the adapter: <= 5 mm mean, <= 2 cm max, <= 3 deg mean, limits held."""
    (emb,) = load_embodiments([name], opts)
    aperture = 0.045 + 0.025 * np.sin(2 * np.pi * 0.3 * np.arange(FRAMES) / FPS)
    frames, hands, truth = episode(emb, {"wearer_left": 3, "wearer_right": 0}, aperture)
    out, quality = run(frames, hands, [emb], opts)
    assert sorted(set(out["identity"])) == ["wearer_left", "wearer_right"]
    assert len(out) == 2 * FRAMES and set(out["embodiment"]) == {name}
    for identity, target in truth.items():
        rows = arm_rows(out, identity)
        has = rows["joint_positions"].notna().to_numpy()
        assert rows["joint_names"].iat[0] == list(emb.model.joint_names)
        np.testing.assert_array_equal(rows["ts_s"], frames["ts_s"])
        q = np.stack(rows["joint_positions"][has].to_list())
        # Errors recomputed from the joints against the ground-truth tool poses.
        e_p, e_r = pose_errors(tcp_poses(emb, q), target[has])
        pos, rot = np.linalg.norm(e_p, axis=1), np.linalg.norm(e_r, axis=1)
        assert pos.mean() <= 0.005 and pos.max() <= 0.02
        assert np.degrees(rot.mean()) <= 3.0
        assert np.all(q >= emb.lower) and np.all(q <= emb.upper)
        ts = rows["ts_s"].to_numpy()[has]
        step = np.abs(np.diff(q, axis=0)) / np.diff(ts)[:, None]
        assert np.all(step <= emb.velocity * (1 + 1e-9))
        assert np.all(rows["reachable"][has]) and set(rows["hand_state"][has]) == {"observed"}
        # The stick figure ends at the tool the joints reach, and starts at the robot's base.
        sticks = np.stack(rows["arm_points_world"][has].to_list()).reshape(int(has.sum()), -1, 3)
        reached = np.stack(rows["ee_base"][has].to_list()).reshape(-1, 4, 4)
        np.testing.assert_allclose(sticks[:, -1], (emb.world_from_base @ reached)[:, :3, 3], atol=1e-9)
        np.testing.assert_allclose(sticks[:, 0], np.tile(emb.world_from_base[:3, 3], (len(sticks), 1)))
        # The gripper follows the aperture (the profile's linear map; slow enough for its speed limit),
        # up to the float32 keypoints of hands_world.
        span = abs(emb.gripper.open - emb.gripper.closed)
        np.testing.assert_allclose(rows["gripper"][has], emb.gripper.command(aperture[has]), atol=1e-5 * span)
    left = arm_rows(out, "wearer_left")
    gap = left.iloc[MISSING]
    assert gap["joint_positions"].isna().all() and gap["gripper"].isna().all()
    assert gap["ee_base"].isna().all() and not gap["reachable"].any()
    assert set(gap["hand_state"]) == {"missing"}
    # One quality row: both hands' steps pooled, passing (all valid steps reached, no violations).
    (row,) = quality.itertuples()
    assert row.embodiment == name and list(row.identities) == ["wearer_left", "wearer_right"]
    assert row.steps == 2 * FRAMES and row.missing_steps == len(range(FRAMES)[MISSING])
    assert row.valid_steps == row.steps - row.missing_steps == row.reachable_steps
    assert row.passed and list(row.flags) == [] and row.position_error_p95_m <= 0.015
    assert row.limit_violations == row.speed_violations == row.acceleration_violations == 0


@pytest.mark.slow
def test_unreachable_stretch_is_flagged(opts: RetargetStageOptions) -> None:
    (emb,) = load_embodiments(["panda"], opts)
    _, q = joint_trajectory(emb, FRAMES, 2)
    target = tcp_poses(emb, q)
    target[60:90, :3, 3] *= 4.0  # four times as far from the base
    kp = keypoints_at_wrists(world_from_wrist_for_targets(emb, target), True, np.full(FRAMES, 0.05))
    frames = pd.DataFrame({"episode_id": EPISODE, "frame_idx": np.arange(FRAMES),
                           "ts_s": np.arange(FRAMES) / FPS})
    hands = pd.DataFrame({"episode_id": EPISODE, "frame_idx": np.arange(FRAMES), "identity": "wearer_right",
                          "keypoints_world_m": list(kp.reshape(FRAMES, -1)), "scale_source": "stereo"})
    out, quality = run(frames, hands, [emb], opts)
    # The smoothing window blurs the jump out of reach by ~10 steps either side.
    assert not out["reachable"][60:90].any() and out["reachable"][:48].all()
    assert (out["ee_error_m"][64:86] > emb.reach_position_tol_m).all()
    assert out["joint_positions"].notna().all()  # bounded best effort, flagged
    # Every step has its hand (valid), but a quarter of them miss by far more than 15 mm: the episode fails.
    (row,) = quality.itertuples()
    assert row.valid_fraction == 1.0 and row.reachable_fraction < 0.8 and not row.passed
    assert list(row.flags) == ["position_error"] and "tool position error to the hand p95" in row.reasons[0]


def _moved(hands: pd.DataFrame, rot: np.ndarray, shift: tuple[float, float, float]) -> pd.DataFrame:
    return hands.assign(keypoints_world_m=[(np.asarray(k, np.float64).reshape(21, 3) @ rot.T + shift).ravel()
                                           for k in hands["keypoints_world_m"]])


@pytest.mark.parametrize("placement", ["wrist_median", "search"])
def test_base_placement_turns_and_moves_with_the_world(placement: str, opts: RetargetStageOptions) -> None:
    """A first camera rolled by 30 degrees and moved: with gravity rotated alike, the joints do not change."""
    (emb,) = load_embodiments(["so101"], opts)
    frames, hands, _ = episode(emb, {"wearer_right": 1}, np.full(FRAMES, 0.05))
    # The z-up episode seen from a level camera (x right, y down, z forward): gravity is the camera's y.
    cam_from_level = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    level_cam = _moved(hands, cam_from_level, (0.0, 0.0, 0.0))
    c, s = np.cos(np.radians(30.0)), np.sin(np.radians(30.0))
    roll = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    rolled = _moved(level_cam, roll, (2.0, -1.0, 0.5))
    rolled = rolled.assign(gravity_dir_world=[roll @ [0.0, 1.0, 0.0]] * len(hands))
    median = replace(opts, base_placement=placement)
    a, _ = run(frames, level_cam, [emb], median)  # no gravity column: the default, the camera's y
    b, _ = run(frames, rolled, [emb], median)
    assert a["reachable"].mean() > 0.95
    np.testing.assert_allclose(np.stack(a["joint_positions"]), np.stack(b["joint_positions"]), atol=1e-4)
    np.testing.assert_array_equal(a["reachable"], b["reachable"])


def test_allegro_follows_both_hands(opts: RetargetStageOptions) -> None:
    """A left hand that mirrors the right one gives the right robot hand the same joints.

    Without a metric scale too: a dexterous hand needs only wrist-relative keypoints, metric by the hand
    size prior whatever the world's scale.
    """
    (allegro,) = load_embodiments(["allegro"], opts)
    rng = np.random.default_rng(0)
    ts = np.arange(60) / FPS
    yaw = 0.4 * np.sin(ts)
    world_from_wrist = np.tile(np.eye(4), (60, 1, 1))
    world_from_wrist[:, 0, 0], world_from_wrist[:, 0, 1] = np.cos(yaw), -np.sin(yaw)
    world_from_wrist[:, 1, 0], world_from_wrist[:, 1, 1] = np.sin(yaw), np.cos(yaw)
    world_from_wrist[:, :3, 3] = rng.normal(size=3)
    right = keypoints_at_wrists(world_from_wrist, True, 0.05 + 0.03 * np.sin(3 * ts))
    left = right * np.array([1.0, -1.0, 1.0])  # the mirror image in the world
    frames = pd.DataFrame({"episode_id": EPISODE, "frame_idx": np.arange(60), "ts_s": ts})
    hands = pd.concat([pd.DataFrame({"episode_id": EPISODE, "frame_idx": np.arange(60), "identity": ident,
                                     "keypoints_world_m": list(kp.reshape(60, -1)), "scale_source": "none"})
                       for ident, kp in (("wearer_right", right), ("wearer_left", left))])
    out, quality = run(frames, hands, [allegro], opts)
    q_r = np.stack(arm_rows(out, "wearer_right")["joint_positions"])
    q_l = np.stack(arm_rows(out, "wearer_left")["joint_positions"])
    np.testing.assert_allclose(q_l, q_r, atol=1e-6)
    assert q_r.shape == (60, 16) and np.all(q_r >= allegro.lower) and np.all(q_r <= allegro.upper)
    assert out["gripper"].isna().all() and out["ee_base"].isna().all() and out["reachable"].all()
    assert out["ee_error_m"].max() < 0.05 and out["refused"].isna().all()
    # A dexterous hand is judged on its valid share and limits only: its error is a keypoint-vector one.
    (row,) = quality.itertuples()
    assert row.kind == "hand" and row.passed and row.valid_fraction == 1.0 and row.approach_tol_rad is None


@pytest.mark.parametrize("source", ["none", None])
def test_arms_are_refused_without_a_metric_scale_and_follow_a_user_scale(
        source: str | None, opts: RetargetStageOptions) -> None:
    """Wrist motion in map units is not robot motion: every step flagged with the reason, no joints."""
    (emb,) = load_embodiments(["so101"], opts)
    frames, hands, _ = episode(emb, {"wearer_right": 0}, np.full(FRAMES, 0.05))
    out, quality = run(frames, hands.assign(scale_source=source), [emb], opts)
    assert len(out) == FRAMES and out["joint_positions"].isna().all() and not out["reachable"].any()
    reason = out["refused"].unique().tolist()
    assert len(reason) == 1 and f"scale_source = {source or 'null'}" in reason[0]
    assert "fusion.user_metres_per_unit" in reason[0]  # says how to give one
    (row,) = quality.itertuples()
    assert not row.passed and list(row.flags) == ["refused"]
    assert row.reasons[0] == f"retarget refused: {reason[0]}"
    user, _ = run(frames, hands.assign(scale_source="user"), [emb], opts)
    assert user["refused"].isna().all() and user["reachable"].all()


def test_hand_states_filled_missing_and_beyond_reach(opts: RetargetStageOptions) -> None:
    """Gap-filled rows are valid; a wrist farther than max_hand_distance_m from the camera is not followed.

    The right hand's frames 20-29 are gap-filled, and for frames 70-89 the camera centre is put 1.2 m from
    the wrist: those steps are `beyond_reach`, with null joints, counted apart from missing steps.
    """
    (emb,) = load_embodiments(["so101"], opts)
    frames, hands, _ = episode(emb, {"wearer_right": 0}, np.full(FRAMES, 0.05))
    hands = hands[hands["identity"] == "wearer_right"].sort_values("frame_idx").reset_index(drop=True)
    hands["filled"] = np.isin(np.arange(FRAMES), np.arange(20, 30))
    wrists = np.stack([np.asarray(k, np.float64)[:3] for k in hands["keypoints_world_m"]])
    cameras = wrists + np.array([0.0, 0.0, 0.4])  # the wrist 40 cm in front of the camera ...
    cameras[70:90] = wrists[70:90] + np.array([0.0, 0.0, 1.2])  # ... but 1.2 m away here
    frames = frames.assign(**{CAMERA_COLUMN: list(cameras / 2.0)})
    hands = hands.assign(metres_per_unit=2.0)  # camera_poses are in map units: times metres_per_unit
    out, quality = run(frames, hands, [emb], opts)
    states = arm_rows(out, "wearer_right")["hand_state"].to_numpy()
    expected = np.full(FRAMES, "observed", dtype=object)
    expected[20:30], expected[70:90] = "filled", "beyond_reach"
    np.testing.assert_array_equal(states, expected)
    rows = arm_rows(out, "wearer_right")
    assert rows["joint_positions"][70:90].isna().all() and not rows["reachable"][70:90].any()
    assert rows["joint_positions"][20:30].notna().all() and rows["reachable"][20:30].all()
    (row,) = quality.itertuples()
    assert (row.valid_steps, row.filled_steps, row.beyond_reach_steps, row.missing_steps) == (100, 10, 20, 0)
    assert row.passed  # 100 of 120 valid: above the 60 % threshold


def test_an_episode_below_the_valid_threshold_fails_with_the_reason(opts: RetargetStageOptions) -> None:
    """The right hand seen in 60 of 120 frames, the left never: 25 % valid steps, below the 60 % default."""
    (emb,) = load_embodiments(["so101"], opts)
    frames, hands, _ = episode(emb, {"wearer_right": 0}, np.full(FRAMES, 0.05))
    right = hands[hands["identity"] == "wearer_right"]
    seen = right[right["frame_idx"] < frames["frame_idx"].iat[60]]
    both = pd.concat([seen, seen.iloc[:1].assign(identity="wearer_left")])
    _, quality = run(frames, both, [emb], opts)
    (row,) = quality.itertuples()
    assert row.steps == 2 * FRAMES and row.valid_steps == 61 and not row.passed
    assert list(row.flags) == ["low_valid"]
    assert row.reasons[0].startswith("valid steps 25 % < 60 % (retarget.quality.min_valid_fraction)")
    assert row.reachable_fraction == 1.0  # what is there is reached: the verdict is about coverage
    loose = replace(opts, quality=replace(opts.quality, min_valid_fraction=0.2))
    assert run(frames, both, [emb], loose)[1]["passed"].all()


def _profile_at(name: str, control_fps: int, folder: Path) -> Path:
    """A copy of a shipped profile with another control rate, in `folder`."""
    text = (DEFAULT_PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    assert "control_fps: 30\n" in text
    (folder / f"{name}.yaml").write_text(text.replace("control_fps: 30\n", f"control_fps: {control_fps}\n"))
    return folder


@pytest.mark.parametrize("control_fps", [10, 60])
def test_steps_are_at_the_profile_control_rate_sampled_not_interpolated(
        control_fps: int, opts: RetargetStageOptions, tmp_path: Path) -> None:
    """Video at 30 fps, robot at 10 or 60 Hz: step k at t0 + k / fps takes the nearest frame's hand."""
    at_rate = replace(opts, profiles_dir=str(_profile_at("so101", control_fps, tmp_path)))
    (emb,) = load_embodiments(["so101"], at_rate)
    assert emb.control_fps == control_fps
    frames, hands, truth = episode(emb, {"wearer_left": 3}, np.full(FRAMES, 0.05))
    out = arm_rows(run(frames, hands, [emb], at_rate)[0], "wearer_left").sort_values("step_idx")
    ts = frames["ts_s"].to_numpy()
    steps = int(np.floor((ts[-1] - ts[0]) * control_fps + 1e-6)) + 1
    assert out["step_idx"].tolist() == list(range(steps)) and (out["control_fps"] == control_fps).all()
    np.testing.assert_allclose(out["ts_s"], ts[0] + np.arange(steps) / control_fps, atol=1e-12)
    gap = np.abs(out["ts_s"].to_numpy()[:, None] - ts[None])
    nearest = np.argmax(gap <= gap.min(axis=1, keepdims=True) + 1e-6, axis=1)  # a tie: the earlier frame
    np.testing.assert_array_equal(out["frame_idx"], frames["frame_idx"].to_numpy()[nearest])
    # Steps whose frame has no hand are empty: the gap is not bridged by interpolated hands.
    has = ~np.isin(nearest, np.arange(FRAMES)[MISSING])
    np.testing.assert_array_equal(out["joint_positions"].notna(), has)
    q = np.stack(out["joint_positions"][has].to_list())
    e_p, _ = pose_errors(tcp_poses(emb, q), truth["wearer_left"][nearest[has]])
    assert np.linalg.norm(e_p, axis=1).mean() <= 0.005
    speeds = np.abs(np.diff(q, axis=0)) / np.diff(out["ts_s"].to_numpy()[has])[:, None]
    assert np.all(speeds <= emb.velocity * (1 + 1e-9))


class TestErrors:
    def test_unknown_profile_and_missing_urdf_are_named(self, opts: RetargetStageOptions, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        with pytest.raises(EgolakeError, match="no embodiment profile 'nope'.*so100"):
            load_embodiments(["nope"], opts)
        monkeypatch.setattr(robots, "packaged_robots_root", lambda: None)  # no installed models either
        with pytest.raises(InputError) as err:
            load_embodiments(["panda"], replace(opts, robots_dir=str(tmp_path)))
        assert err.value.reason_code == "urdf_missing" and "panda.urdf" in str(err.value)

    def test_failure_is_the_episode_error_row(self, opts: RetargetStageOptions) -> None:
        frames = pd.DataFrame({"episode_id": EPISODE, "frame_idx": [0, 1], "ts_s": [0.0, 0.0]})
        hands = pd.DataFrame({"episode_id": EPISODE, "frame_idx": [0, 1], "identity": "wearer_right",
                              "keypoints_world_m": [np.zeros(63), np.zeros(63)], "scale_source": "imu"})
        unit = guarded_pair(partial(retarget_named, names=["so101"], opts=opts), OUTPUT_SCHEMA.names)
        out = unit(frames, hands)
        assert out["_row_kind"].tolist() == [ERROR_KIND] and "increasing" in out["_error"].iat[0]
        assert out["episode_id"].iat[0] == EPISODE

    def test_bad_placement(self) -> None:
        with pytest.raises(ValueError, match="base_placement"):
            RetargetStageOptions(base_placement="table")
