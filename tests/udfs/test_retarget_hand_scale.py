"""A monocular episode made metric by the wearer's hands alone is retargeted to an arm.

The synthetic table episode (no IMU, no stereo: camera poses and map in units of 25 cm) goes through
the fusion udf, which takes its scale from the hands resting on the table (`scale_source` hands); its
`hands_world` rows then go through the retarget udf. Without the map's points the same episode has no
scale and every arm is refused.
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
from tests.udfs.test_hands_fusion import noisy_hands_cam
from udfs.fusion import fuse_hands
from udfs.multi_output import TABLE_COLUMN
from udfs.retarget import RetargetStageOptions, load_embodiments, retarget_episode

logger = logging.getLogger(__name__)

MPU = 0.25  # true metres per map unit


@pytest.fixture(scope="module")
def fused() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(frames, hands_world with the hands' scale, hands_world without a map)."""
    episode = generate_episode(SynthOptions(num_frames=300, seed=0))
    stacked = map_rows(simulated_map(episode, MPU, np.random.default_rng(5)), episode.ts_s, "ep0")
    hands = noisy_hands_cam(episode, np.random.default_rng(1))
    frames = pd.DataFrame(
        {"episode_id": "ep0", "frame_idx": np.arange(episode.num_frames), "ts_s": episode.ts_s}
    )
    no_map = stacked[stacked[TABLE_COLUMN].isna()]
    return frames, fuse_hands(stacked, hands, FusionOptions()), fuse_hands(no_map, hands, FusionOptions())


@pytest.fixture(scope="module")
def opts(shared_data: Path) -> RetargetStageOptions:
    # The synthetic world is z up (hands_world has no gravity without an IMU).
    return RetargetStageOptions(
        robots_dir=str(shared_data / "robots"), default_gravity_dir_world=(0.0, 0.0, -1.0)
    )


def test_an_arm_follows_a_monocular_episode_with_a_hands_scale(fused, opts):
    frames, hands_world, _ = fused
    assert (hands_world["scale_source"] == "hands").all()
    rel_std = float(hands_world["metres_per_unit_std"].iat[0] / hands_world["metres_per_unit"].iat[0])
    (emb,) = load_embodiments(["so100"], opts)
    out = retarget_episode(frames, hands_world, [emb], opts)
    assert out["refused"].isna().all()
    assert (out["scale_source"] == "hands").all()
    np.testing.assert_allclose(out["scale_rel_std"].to_numpy(np.float64), rel_std, rtol=1e-6)
    for identity, rows in out.groupby("identity"):
        has_hand = rows["frame_idx"].isin(hands_world.loc[hands_world["identity"] == identity, "frame_idx"])
        solved = rows["joint_positions"].notna()
        logger.info("so100 %s: %d steps, %d with a hand, %.1f %% reachable", identity, len(rows),
                    has_hand.sum(), 100 * rows.loc[has_hand, "reachable"].mean())  # fmt: skip
        assert (solved == has_hand).all()  # joints wherever the hand is, none where it is not
        assert rows.loc[has_hand, "reachable"].mean() > 0.9
        q = np.stack(rows.loc[solved, "joint_positions"].to_list())
        assert np.all(q >= emb.lower) and np.all(q <= emb.upper)


def test_without_a_scale_the_same_arm_is_refused(fused, opts):
    frames, _, no_scale = fused
    assert (no_scale["scale_source"] == "none").all()
    (emb,) = load_embodiments(["so100"], opts)
    out = retarget_episode(frames, no_scale, [emb], opts)
    assert out["refused"].str.startswith("no metric scale").all() and out["joint_positions"].isna().all()
    assert (out["scale_source"] == "none").all() and out["scale_rel_std"].isna().all()
