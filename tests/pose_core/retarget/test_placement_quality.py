"""Per-episode base search, and the quality figures and verdict of a robot's data."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pose_core.retarget.arm import RetargetOptions, joint_limit_margins, margins_from_home
from pose_core.retarget.embodiment import Embodiment
from pose_core.retarget.placement import (
    PlacementOptions,
    base_from_tcp_targets,
    search_base,
    world_from_base_at_wrists,
)
from pose_core.retarget.quality import (
    QualityThresholds,
    evaluate_quality,
    hand_states,
    joint_violations,
    retarget_figures,
)
from pose_core.synth.robot_hands import joint_trajectory, tcp_poses
from udfs.robots import load_embodiment

PROFILES = Path(__file__).resolve().parents[3] / "conf" / "embodiments"
GRAVITY = np.array([0.1, 0.9, 0.4])  # a first camera tilted down: gravity along its y mostly


@pytest.fixture(scope="module")
def panda(shared_data: Path) -> Embodiment:
    return load_embodiment(PROFILES / "panda.yaml", shared_data / "robots")


def _world_targets(emb: Embodiment) -> np.ndarray:
    """Tool targets in a camera-like world (y down): a reachable robot path, seen from a tilted camera."""
    _, q = joint_trajectory(emb, 60, 1)
    world_from_base = np.eye(4)
    world_from_base[:3, :3] = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    return world_from_base @ tcp_poses(emb, q)


class TestBaseSearch:
    def test_moves_the_base_until_a_reach_test_holds(self, panda: Embodiment) -> None:
        """A made-up reach test (a 10 cm box 30 cm above the workspace centre): the search finds it."""
        targets = _world_targets(panda)
        opts = PlacementOptions(offset_range_m=0.3, offset_step_m=0.1)

        def in_box(base_from_targets: np.ndarray) -> np.ndarray:
            offset = base_from_targets[:, :3, 3] - (panda.workspace_center_in_base_m + [0.0, 0.0, 0.3])
            inside = np.all(np.abs(offset) <= 0.05 + 0.5 * np.ptp(targets[:, :3, 3], axis=0).max(), axis=1)
            return np.where(inside, 1.0, np.nan)

        def tcp(base: np.ndarray) -> np.ndarray:
            return base_from_tcp_targets(panda, targets @ panda.tcp_from_wrist, base)

        start = world_from_base_at_wrists(panda, targets, GRAVITY)
        assert np.isfinite(in_box(tcp(start))).mean() < 0.5
        base, score = search_base(panda, targets, GRAVITY, in_box, opts)
        assert score == 1.0 and np.isfinite(in_box(tcp(base))).all()
        # Upright against gravity, moved down by ~30 cm along it; turned about the vertical only.
        np.testing.assert_allclose(base[:3, :3] @ panda.world_from_base[:3, :3].T @ [0, 0, 1],
                                   -GRAVITY / np.linalg.norm(GRAVITY), atol=1e-9)
        drop = (start[:3, 3] - base[:3, 3]) @ (-GRAVITY / np.linalg.norm(GRAVITY))
        assert drop == pytest.approx(0.3, abs=0.06)

    def test_of_placements_that_reach_every_probe_the_one_with_most_joint_margin_wins(
            self, panda: Embodiment) -> None:
        """Every candidate reaches every probe; a made-up margin falls off with a target's height from 10 cm
        below the workspace centre: the search raises the base by about 10 cm instead of keeping the start
        (which has the median target on the centre)."""
        targets = _world_targets(panda)
        best_z = panda.workspace_center_in_base_m[2] - 0.1

        def margins(base_from_targets: np.ndarray) -> np.ndarray:
            return np.clip(1.0 - np.abs(base_from_targets[:, 2, 3] - best_z), 0.0, 1.0)

        start = world_from_base_at_wrists(panda, targets, GRAVITY)
        base, score = search_base(panda, targets, GRAVITY, margins, PlacementOptions())
        up = -GRAVITY / np.linalg.norm(GRAVITY)
        assert score == 1.0 and (base[:3, 3] - start[:3, 3]) @ up == pytest.approx(0.1, abs=0.05)

    def test_joint_limit_margin_is_the_tightest_joint_and_ignores_full_turns(self, panda: Embodiment) -> None:
        mid = 0.5 * (panda.lower + panda.upper)
        at_limit, near = mid.copy(), mid.copy()
        at_limit[3] = panda.lower[3]
        near[1] = panda.upper[1] - 0.25 * (panda.upper[1] - panda.lower[1])
        margins = joint_limit_margins(panda, np.stack([mid, at_limit, near]))
        np.testing.assert_allclose(margins, [1.0, 0.0, 0.5])

    def test_joint_limit_margin_skips_joints_without_a_bounded_range(self) -> None:
        """A continuous joint (infinite limits) and one whose limits meet count for nothing: no NaN."""
        arm = SimpleNamespace(lower=np.array([-np.inf, 0.2, -1.0]), upper=np.array([np.inf, 0.2, 1.0]))
        margins = joint_limit_margins(arm, np.array([[5.0, 0.2, 0.0], [5.0, 0.2, 0.5]]))  # type: ignore[arg-type]
        np.testing.assert_allclose(margins, [1.0, 0.5])

    @pytest.mark.slow
    def test_ik_probes_reach_a_robot_made_path(self, panda: Embodiment) -> None:
        targets = _world_targets(panda)
        opts = RetargetOptions()
        test = partial(margins_from_home, panda, opts)
        base, score = search_base(panda, targets, GRAVITY, test, opts.placement)
        start = world_from_base_at_wrists(panda, targets, GRAVITY)
        start_margins = test(base_from_tcp_targets(panda, targets @ panda.tcp_from_wrist, start))
        start_score = np.isfinite(start_margins).mean()
        assert score >= 0.9 and score >= start_score - 0.1  # probes, not every step: about as good or better
        yaw = math.atan2(*(np.linalg.inv(start)[:3, :3] @ base[:3, :3])[[1, 0], 0])
        assert abs(yaw) <= opts.placement.yaw_range_rad + opts.placement.yaw_step_rad / 2 + 1e-9


class TestQuality:
    def test_hand_states(self) -> None:
        present = np.array([True, True, False, True, True])
        filled = np.array([False, True, False, False, True])
        states = hand_states(present, filled, np.array([0.4, 0.5, np.nan, 1.2, np.nan]), 0.9)
        assert states.tolist() == ["observed", "filled", "missing", "beyond_reach", "filled"]

    def test_figures_and_verdict(self) -> None:
        states = np.array(["observed"] * 6 + ["filled"] * 2 + ["missing"] * 2, dtype=object)
        reachable = np.array([True] * 7 + [False] * 3)
        error = np.array([0.001] * 6 + [0.05, 0.05, np.nan, np.nan])
        nan = np.full(10, np.nan)
        tracking = np.minimum(error, 0.002)  # the tool on the smoothed target, which smoothing moved
        fig = retarget_figures(states, reachable, error, tracking, nan, nan, error, (0, 0, 0))
        assert (fig.steps, fig.valid_steps, fig.filled_steps, fig.missing_steps, fig.reachable_steps) == (
            10, 8, 2, 2, 7)
        assert fig.valid_fraction == 0.8 and fig.reachable_fraction == 7 / 8
        assert fig.position_error_median_m == pytest.approx(0.001) and fig.position_error_p95_m > 0.015
        assert fig.tracking_error_p95_m == pytest.approx(0.002)  # close to its target, far from the hand
        assert fig.to_dict()["approach_error_p95_rad"] is None  # NaN becomes null in JSON
        passed, flags, reasons = evaluate_quality(fig, QualityThresholds(), is_arm=True)
        assert not passed and flags == ("position_error",)
        assert reasons[0].startswith("tool position error to the hand p95 50.0 mm (to the smoothed target 2")
        assert evaluate_quality(fig, QualityThresholds(), is_arm=False)[0]  # a hand: no tool error check
        low = QualityThresholds(min_valid_fraction=0.9, max_position_error_p95_m=0.1)
        assert evaluate_quality(fig, low, is_arm=True)[1] == ("low_valid",)
        refused = evaluate_quality(fig, QualityThresholds(), True, refused="no metric scale")
        assert refused[1] == ("refused",) and refused[2] == ("retarget refused: no metric scale",)
        broken = retarget_figures(states, reachable, *[np.full(10, 0.001)] * 2, nan, nan, nan, (0, 2, 1))
        assert evaluate_quality(broken, QualityThresholds(), True)[2] == (
            "0 joint limit, 2 speed and 1 acceleration violations",)

    def test_violations_are_counted(self) -> None:
        dt = 0.1
        q = np.array([[0.0], [0.1], [0.3], [0.3], [1.5]])
        # 1.5 past the limit; steps 0.2 and 1.2 past 0.15; second steps -0.2 and 1.2 past 0.1.
        assert joint_violations(q, dt, (np.array([-1.0]), np.array([1.0])), np.array([1.5]),
                                np.array([10.0])) == (1, 2, 2)
