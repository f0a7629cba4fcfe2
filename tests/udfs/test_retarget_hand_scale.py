"""A monocular episode made metric by the wearer's hands alone is retargeted to an arm.

The synthetic table episode (no IMU, no stereo: camera poses and map in units of 25 cm) goes through
the fusion udf, which takes its scale from the hands resting on the table (`scale_source` hands); its
`hands_world` rows then go through the retarget udf. Without the map's points the same episode has no
scale and every arm is refused. The reference is the same episode fused with its true metric poses.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.hand_scale import map_rows
from pose_core.hands import FusionOptions
from pose_core.synth.episode import SynthOptions, generate_episode
from pose_core.synth.observe import simulated_map
from schemas.tables import ROBOT_ACTIONS
from tests.udfs.test_hands_fusion import noisy_hands_cam, posed_frames
from udfs.fusion import fuse_hands
from udfs.multi_output import TABLE_COLUMN, split_tables
from udfs.options import RetargetStageOptions
from udfs.retarget import load_embodiments, retarget_episode

pytestmark = pytest.mark.slow

logger = logging.getLogger(__name__)

MPU = 0.25  # true metres per map unit


@pytest.fixture(scope="module")
def fused() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(frames, hands_world with the hands' scale, with the true scale, without a map)."""
    episode = generate_episode(SynthOptions(num_frames=300, seed=0))
    stacked = map_rows(simulated_map(episode, MPU, np.random.default_rng(5)), episode.ts_s, "ep0")
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    frames = pd.DataFrame(
        {"episode_id": "ep0", "frame_idx": np.arange(episode.num_frames), "ts_s": episode.ts_s}
    )
    metric = fuse_hands(posed_frames(episode), hands, FusionOptions(user_metres_per_unit=1.0))
    no_map = stacked[stacked[TABLE_COLUMN].isna()]
    return (
        frames,
        fuse_hands(stacked, hands, FusionOptions()),
        metric,
        fuse_hands(no_map, hands, FusionOptions()),
    )


@pytest.fixture(scope="module")
def opts(shared_data: Path) -> RetargetStageOptions:
    # The synthetic world is z up (hands_world has no gravity without an IMU). The base goes under the
    # wrists' median, not searched: a search may settle elsewhere for a 2 % different scale, and the
    # test compares the scale's effect alone.
    return RetargetStageOptions(
        robots_dir=str(shared_data / "robots"),
        default_gravity_dir_world=(0.0, 0.0, -1.0),
        base_placement="wrist_median",
    )


def _tool_targets(rows: pd.DataFrame) -> np.ndarray:
    return np.stack([np.asarray(t, np.float64).reshape(4, 4)[:3, 3] for t in rows["ee_target_base"]])


def _actions(frames: pd.DataFrame, hands: pd.DataFrame, emb, opts: RetargetStageOptions) -> pd.DataFrame:
    """The `robot_actions` rows of one embodiment (the udf stacks them with `robot_quality`)."""
    return split_tables(retarget_episode(frames, hands, [emb], opts), [ROBOT_ACTIONS])[ROBOT_ACTIONS.name]


def test_an_arm_follows_a_monocular_episode_with_a_hands_scale(fused, opts):
    """Robot actions as with the true scale: the same steps solved and reachable, tool targets within 5 mm
    (median) and 15 mm (any step). Retargeting keeps the hands' positions unsmoothed (fusion's motion
    model smooths them), so single steps show the scale's few-percent error at arm's length: 10.1 mm
    at most here."""
    frames, hands_world, metric, _ = fused
    assert (hands_world["scale_source"] == "hands").all()
    rel_std = float(hands_world["metres_per_unit_std"].iat[0] / hands_world["metres_per_unit"].iat[0])
    (emb,) = load_embodiments(["so100"], opts)
    out = _actions(frames, hands_world, emb, opts)
    truth = _actions(frames, metric, emb, opts)
    assert out["refused"].isna().all()
    assert (out["scale_source"] == "hands").all()
    np.testing.assert_allclose(out["scale_rel_std"].to_numpy(np.float64), rel_std, rtol=1e-6)
    for identity, rows in out.groupby("identity"):
        true_rows = truth[truth["identity"] == identity]
        solved = rows["joint_positions"].notna().to_numpy()
        assert (
            solved.sum() > 0.5 * len(rows)
            and (solved == true_rows["joint_positions"].notna().to_numpy()).all()
        )
        reach, true_reach = rows["reachable"][solved].mean(), true_rows["reachable"][solved].mean()
        error = np.linalg.norm(_tool_targets(rows[solved]) - _tool_targets(true_rows[solved]), axis=1)
        logger.info("so100 %s: %d steps solved, reachable %.1f %% (true scale %.1f %%), tool targets off by "
                    "%.1f mm median, %.1f max", identity, solved.sum(), 100 * reach, 100 * true_reach,
                    1e3 * np.median(error), 1e3 * error.max())  # fmt: skip
        assert abs(reach - true_reach) <= 0.05 and np.median(error) < 0.005 and error.max() < 0.015
        q = np.stack(rows.loc[solved, "joint_positions"].to_list())
        assert np.all(q >= emb.lower) and np.all(q <= emb.upper)


def test_without_a_scale_the_same_arm_is_refused(fused, opts):
    frames, _, _, no_scale = fused
    assert (no_scale["scale_source"] == "none").all()
    (emb,) = load_embodiments(["so100"], opts)
    out = _actions(frames, no_scale, emb, opts)
    assert out["refused"].str.startswith("no metric scale").all() and out["joint_positions"].isna().all()
    assert (out["scale_source"] == "none").all() and out["scale_rel_std"].isna().all()
