"""udfs.device: a task's device from its resources, its thread caps, without Spark (a fake TaskContext)."""

from __future__ import annotations

import inspect
import logging
import os
import sys
from types import SimpleNamespace

import cv2
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from udfs import device
from udfs.device import TaskDevice, choose_device, current, enter, gpu_addresses, on_task_device, set_threads


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test starts as a new worker process would: no device entered, no fallback logged; thread
    caps and their environment are restored afterwards."""
    monkeypatch.setattr(device, "_STATE", device._ProcessState())
    for name in device.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)  # restored as it was after the test
    cv_threads = cv2.getNumThreads()
    with threadpool_limits(limits=None):  # restores the BLAS/OpenMP pools' limits on exit
        yield
    cv2.setNumThreads(cv_threads)


def resources(**addresses: list[str]) -> dict[str, SimpleNamespace]:
    """A `TaskContext.resources()` dict: name -> an object with `.addresses`, like ResourceInformation."""
    return {name: SimpleNamespace(name=name, addresses=a) for name, a in addresses.items()}


class FakeTaskContext:
    def __init__(self, res: dict, cpus: int) -> None:
        self._res, self._cpus = res, cpus

    def resources(self) -> dict:
        return self._res

    def cpus(self) -> int:
        return self._cpus


def test_gpu_addresses_from_task_resources():
    from pyspark.resource import ResourceInformation

    assert gpu_addresses({"gpu": ResourceInformation("gpu", ["3", "5"])}) == ["3", "5"]
    assert gpu_addresses(resources(fpga=["0"])) == []
    assert gpu_addresses({}) == []


def test_first_gpu_address_is_the_cuda_device():
    assert choose_device(["3", "5"], cpus=4) == TaskDevice("cuda", 3, 4)
    assert TaskDevice("cuda", 3, 4).name == "cuda:3"


def test_no_gpu_falls_back_to_cpu_with_one_log_line(caplog):
    with caplog.at_level(logging.WARNING, logger="udfs.device"):
        first = choose_device([], cpus=2)
        second = choose_device([], cpus=2)
    assert first == second == TaskDevice("cpu", None, 2)
    assert first.name == "cpu"
    assert [r.getMessage() for r in caplog.records] == [
        "no GPU among this task's resources: running on the CPU with 2 threads"
    ]


def test_an_address_that_is_no_ordinal_names_the_discovery_script():
    with pytest.raises(ValueError, match="gpu_discovery.sh"):
        choose_device(["GPU-8d1c7f2e"], cpus=1)


@pytest.mark.parametrize(
    ("kind", "index", "cpus"), [("cpu", None, 0), ("cuda", None, 1), ("cpu", 0, 1), ("cuda", -1, 1)]
)
def test_task_device_refuses_inconsistent_values(kind, index, cpus):
    with pytest.raises(ValueError):
        TaskDevice(kind, index, cpus)


@pytest.mark.parametrize("cpus", [1, 2])
def test_set_threads_caps_opencv_blas_and_the_environment(cpus):
    import numpy  # noqa: F401 - loads OpenBLAS, whose pool must be capped

    set_threads(cpus)
    assert cv2.getNumThreads() == cpus
    pools = [p for p in threadpool_info() if p["user_api"] in ("blas", "openmp")]
    assert pools and all(p["num_threads"] == cpus for p in pools)
    assert all(os.environ[name] == str(cpus) for name in device.THREAD_ENV)


def test_enter_puts_loaded_torch_and_cupy_on_the_task_gpu(monkeypatch):
    calls = []
    torch = SimpleNamespace(
        set_num_threads=lambda n: calls.append(("torch threads", n)),
        cuda=SimpleNamespace(set_device=lambda i: calls.append(("torch device", i))),
    )
    use = SimpleNamespace(Device=lambda i: SimpleNamespace(use=lambda: calls.append(("cupy", i))))
    cupy = SimpleNamespace(cuda=use)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    task = TaskDevice("cuda", 2, 3)
    assert enter(task) == task
    assert current() == task
    assert calls == [("torch threads", 3), ("torch device", 2), ("cupy", 2)]
    enter(task)  # the same device again: nothing to redo
    assert len(calls) == 3


def test_current_outside_a_placed_task_is_the_whole_cpu():
    assert current() == TaskDevice("cpu", None, os.cpu_count() or 1)


def test_a_placed_function_enters_its_task_device(monkeypatch):
    import pyspark

    task = FakeTaskContext(resources(gpu=["1"]), cpus=1)
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: task))
    for name in ("torch", "cupy"):  # a real one, if loaded, must not be sent to a GPU it may not have
        monkeypatch.setitem(sys.modules, name, None)

    def unit(pdf):
        return current().name, pdf

    placed = on_task_device(unit)
    assert placed("rows") == ("cuda:1", "rows")
    assert current() == TaskDevice("cuda", 1, 1)
    assert list(inspect.signature(placed).parameters) == ["pdf"]  # pyspark counts a grouped UDF's arguments


def test_outside_a_spark_task_there_is_no_task_context():
    with pytest.raises(RuntimeError, match="inside a Spark task"):
        device.from_task_context()
