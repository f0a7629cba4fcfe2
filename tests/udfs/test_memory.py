"""The bound on a task's writable memory (`udfs.memory`): a unit past it fails alone, with the bound named."""

import inspect
import resource

import numpy as np
import pandas as pd
import pytest

from udfs.guard import ERROR_KIND, ROW_KIND, guarded_map, run_unit
from udfs.memory import data_limit, memory_bound_mb, with_memory_bound

GIB = 1 << 30


def _data_mb() -> int:
    """This process's writable memory now (VmData), MiB: a bound must leave room above it."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f)
    return int(status["VmData"].split()[0]) // 1024


def _allocates(unit: pd.DataFrame) -> pd.DataFrame:
    """Reserves `gib` GiB (np.empty: counted by RLIMIT_DATA, never touched, so no RAM is used)."""
    block = np.empty(int(unit["gib"].iat[0] * GIB), dtype=np.uint8)
    return pd.DataFrame({"episode_id": unit["episode_id"], "bytes": [block.nbytes]})


def test_a_unit_past_the_bound_fails_alone_and_names_it():
    bound = _data_mb() + 512
    units = pd.DataFrame({"episode_id": ["big", "small"], "gib": [4.0, 0.125]})
    mapper = with_memory_bound(guarded_map(_allocates, ["episode_id", "bytes"], ["episode_id"]), bound)
    out = pd.concat(list(mapper(iter([units]))))
    big, small = out[out.episode_id == "big"].iloc[0], out[out.episode_id == "small"].iloc[0]
    assert big["_row_kind"] == ERROR_KIND
    assert big["_error"].startswith("MemoryError: Unable to allocate 4.00 GiB")
    assert f"over this task's memory bound of {bound} MiB" in big["_error"]
    assert (small["_row_kind"], small["bytes"]) == (ROW_KIND, GIB // 8)


def test_the_bound_holds_while_a_batch_generator_runs_and_is_lifted_after():
    before = resource.getrlimit(resource.RLIMIT_DATA)
    seen = []

    def batches(frames):
        for frame in frames:
            seen.append(memory_bound_mb())
            yield frame

    bounded = with_memory_bound(batches, 4096)
    assert inspect.isgeneratorfunction(bounded)
    assert list(bounded(iter([1, 2]))) == [1, 2]
    assert seen == [4096, 4096]
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_a_grouped_function_keeps_its_arguments_and_its_bound():
    def pair(left, right):
        return memory_bound_mb(), left + right

    bounded = with_memory_bound(pair, 3000)
    assert len(inspect.signature(bounded).parameters) == 2  # pyspark picks a grouped form by this
    assert bounded(1, 2) == (3000, 3)
    assert with_memory_bound(pair, None) is pair


def test_torch_allocations_past_the_bound_fail_with_the_bound_named():
    torch = pytest.importorskip("torch")

    def tensor(unit):
        torch.empty(2 * GIB, dtype=torch.uint8)
        return unit

    with data_limit(_data_mb() + 512):
        out = run_unit(tensor, pd.DataFrame({"episode_id": ["e"]}), ["episode_id"])
    assert "can't allocate memory" in out["_error"].iat[0]
    assert "memory bound of" in out["_error"].iat[0]


def test_no_bound_below_a_mebibyte():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        with_memory_bound(lambda u: u, 0)


def test_a_thread_that_could_not_start_under_a_bound_points_at_it():
    """FFmpeg's decoder threads fail with EAGAIN when their stacks cannot be mapped under the bound."""

    def decoder(unit):
        raise OSError(11, "Resource temporarily unavailable")

    with data_limit(_data_mb() + 512):
        out = run_unit(decoder, pd.DataFrame({"episode_id": ["e"]}), ["episode_id"])
    assert "(perhaps over this task's memory bound of" in out["_error"].iat[0]
    plain = run_unit(decoder, pd.DataFrame({"episode_id": ["e"]}), ["episode_id"])
    assert plain["_error"].iat[0] == "BlockingIOError: [Errno 11] Resource temporarily unavailable"
