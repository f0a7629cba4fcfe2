"""Which device a task runs on, and how many CPU threads it may use.

A GPU stage's Spark task takes its GPU from the task's resources: Spark's stage-level scheduling hands
out one of the addresses the executor's discovery script listed (`conf/gpu_discovery.sh`). A task given
none runs on the CPU (logged once per process). The bench runner (`bench/multi_gpu.py`) pins one process
per GPU with CUDA_VISIBLE_DEVICES and enters the same kind of device. Either way the task limits the CPU
threads of OpenCV, BLAS/OpenMP and torch to its CPUs, so that the tasks sharing a host do not
oversubscribe it.

Models stay one per worker process (e.g. `udfs.hands.load_estimator`'s cache): with one executor per
GPU, every task a worker process runs gets the same GPU address.

Nothing runs at import time; pyspark is imported only inside a Spark task (`from_task_context`), so the
runner works where there is no Spark.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import cv2

__all__ = [
    "THREAD_ENV",
    "TaskDevice",
    "choose_device",
    "current",
    "enter",
    "from_task_context",
    "gpu_addresses",
    "on_task_device",
    "set_threads",
    "thread_env",
]

logger = logging.getLogger(__name__)

#: Variables read by OpenMP, OpenBLAS, MKL, numexpr and torch when they start their thread pools.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

T = TypeVar("T")


@dataclass(frozen=True)
class TaskDevice:
    """Where one task runs.

    Attributes:
        kind: "cuda" or "cpu".
        index: the CUDA device ordinal (cuda only), as the task's resources name it.
        cpus: CPU threads the task may use, >= 1.
    """

    kind: Literal["cpu", "cuda"]
    index: int | None
    cpus: int

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise ValueError(f"a task needs at least one CPU, got {self.cpus}")
        if (self.kind == "cuda") != (self.index is not None) or (self.index is not None and self.index < 0):
            raise ValueError(f"a cuda device needs an ordinal >= 0, a cpu none; got {self.kind} {self.index}")

    @property
    def name(self) -> str:
        """The device as torch and cupy name it: "cuda:<index>" or "cpu"."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


@dataclass
class _ProcessState:
    """This worker process's device (None until a task entered one) and whether the fallback was logged."""

    device: TaskDevice | None = None
    fallback_logged: bool = False


_STATE = _ProcessState()


def gpu_addresses(resources: Mapping[str, Any]) -> list[str]:
    """The GPU addresses among a task's resources (`TaskContext.resources()`: name -> `.addresses`)."""
    info = resources.get("gpu")
    return list(info.addresses) if info is not None else []


def choose_device(addresses: Sequence[str], cpus: int) -> TaskDevice:
    """The first GPU address as a CUDA device, else the CPU (one log line per process).

    Args:
        addresses: GPU addresses given to the task (nvidia-smi indices, `conf/gpu_discovery.sh`).
        cpus: the task's CPUs.

    Raises:
        ValueError: an address is not a CUDA ordinal (a discovery script printing UUIDs).
    """
    if addresses:
        try:
            return TaskDevice("cuda", int(addresses[0]), cpus)
        except ValueError as exc:
            raise ValueError(
                f"GPU address {addresses[0]!r} is not a CUDA ordinal: the executors' discovery script must "
                "print nvidia-smi indices (conf/gpu_discovery.sh)"
            ) from exc
    if not _STATE.fallback_logged:
        logger.warning("no GPU among this task's resources: running on the CPU with %d threads", cpus)
        _STATE.fallback_logged = True
    return TaskDevice("cpu", None, cpus)


def thread_env(cpus: int) -> dict[str, str]:
    """The environment that caps thread pools started later (a child process, a library loaded later)."""
    return dict.fromkeys(THREAD_ENV, str(cpus))


def set_threads(cpus: int) -> None:
    """Cap this process's CPU threads at `cpus`: OpenCV, the BLAS/OpenMP pools already loaded, torch.

    The environment is set too, for pools that start later (torch reads it at its first parallel op).
    """
    from threadpoolctl import threadpool_limits  # loaded on a task's first entry, not at import

    os.environ.update(thread_env(cpus))
    cv2.setNumThreads(cpus)
    threadpool_limits(limits=cpus)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(cpus)


def _select_cuda(index: int) -> None:
    """Make `index` the current CUDA device of torch and cupy where this process has loaded them."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.cuda.set_device(index)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.cuda.Device(index).use()


def enter(device: TaskDevice) -> TaskDevice:
    """Make `device` this process's task device: threads capped, torch/cupy (where loaded) on its GPU.

    Adapters that load torch or cupy later take the device from `current()`. Cheap when unchanged.
    """
    if device != _STATE.device:
        set_threads(device.cpus)
        if device.index is not None:
            _select_cuda(device.index)
        _STATE.device = device
        logger.info("task device %s with %d CPU threads", device.name, device.cpus)
    return device


def current() -> TaskDevice:
    """The device of the task this process runs; outside a placed task, the CPU with all its cores."""
    return _STATE.device or TaskDevice("cpu", None, os.cpu_count() or 1)


def from_task_context(gpu: bool = True) -> TaskDevice:
    """This Spark task's device: its first GPU address and its CPUs (`spark.task.cpus` or its profile's).

    Args:
        gpu: the task asked for a GPU; False: a CPU-only task (its CPUs, no GPU fallback log line).

    Raises:
        RuntimeError: called outside a Spark task.
    """
    from pyspark import TaskContext  # executors have pyspark; the Spark-free runner never calls this

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("from_task_context() runs inside a Spark task only")
    if not gpu:
        return TaskDevice("cpu", None, ctx.cpus())
    return choose_device(gpu_addresses(ctx.resources()), ctx.cpus())


def on_task_device(fn: Callable[..., T], gpu: bool = True) -> Callable[..., T]:
    """`fn` run on its Spark task's device: each call enters `from_task_context(gpu)` first.

    Wraps a pandas UDF's function (`mapInPandas`: once per task; grouped: once per group). The wrapper
    keeps `fn`'s signature: pyspark tells a grouped function's forms apart by its number of arguments.
    `gpu=False` for CPU-only tasks: their threads are capped all the same.
    """

    @functools.wraps(fn)
    def placed(*args: Any) -> T:
        enter(from_task_context(gpu))
        return fn(*args)

    placed.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return placed
