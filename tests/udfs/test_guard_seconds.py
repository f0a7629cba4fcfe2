"""Each guarded unit reports its wall and CPU seconds exactly once (what `runs.unit_s`/`cpu_s` sum)."""

import time

import numpy as np
import pandas as pd

from udfs.guard import DONE_KIND, ERROR_KIND, ROW_KIND, guarded_map, run_unit

COLUMNS = ["episode_id", "y"]


def _busy(unit: pd.DataFrame) -> pd.DataFrame:
    """Spend 0.2 CPU seconds (a shared machine may take longer in wall time), then map the rows."""
    end = time.process_time() + 0.2
    while time.process_time() < end:
        np.sqrt(np.arange(1000.0))
    if (unit["x"] < 0).any():
        raise ValueError("negative x")
    return unit.assign(y=unit["x"] * 2)


def test_seconds_go_on_the_last_data_row_and_data_keeps_its_dtypes():
    out = run_unit(_busy, pd.DataFrame({"episode_id": ["a"] * 3, "x": [1, 2, 3]}), COLUMNS)
    assert (out["_row_kind"] == ROW_KIND).all() and out["y"].dtype == np.int64
    assert out["_unit_s"].iloc[:-1].isna().all() and out["_unit_cpu_s"].iloc[:-1].isna().all()
    cpu, wall = out["_unit_cpu_s"].iat[-1], out["_unit_s"].iat[-1]
    assert 0.2 <= cpu < 0.5 and wall >= cpu - 0.02  # one busy thread: CPU within the wall time


def test_a_unit_without_rows_reports_on_a_done_row_and_a_failed_one_on_its_error_row():
    empty = run_unit(lambda u: _busy(u).iloc[:0], pd.DataFrame({"episode_id": ["a"], "x": [1]}), COLUMNS)
    assert empty["_row_kind"].tolist() == [DONE_KIND] and empty["_unit_cpu_s"].iat[0] > 0.19
    failed = run_unit(_busy, pd.DataFrame({"episode_id": ["b"], "x": [-1]}), COLUMNS)
    assert failed["_row_kind"].tolist() == [ERROR_KIND] and failed["_unit_cpu_s"].iat[0] > 0.19


def test_shards_of_an_episode_each_report_once():
    batch = pd.DataFrame({"episode_id": ["a", "a", "a"], "shard_idx": [0, 0, 1], "x": [1, 2, 3]})
    out = pd.concat(list(guarded_map(_busy, COLUMNS, ["episode_id", "shard_idx"])(iter([batch]))))
    assert out["_unit_s"].notna().sum() == 2 and out["_unit_s"].sum() > 0.39
