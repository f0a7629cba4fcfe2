"""A bound on the memory one Spark task's Python worker may fill, so a unit that needs too much fails alone.

Spark's own bound (`spark.executor.pyspark.memory`) caps a worker's address space (RLIMIT_AS). torch,
LiteRT and CUDA reserve address ranges far larger than what they touch, so that cap fails them on import.
This one sets RLIMIT_DATA instead: since Linux 4.7 it counts the heap and every private writable mapping
(numpy arrays, torch CPU tensors, Arrow buffers, malloc's arenas), not reserved-but-inaccessible ranges,
mapped files or device memory. An allocation past it fails at once with `MemoryError` (torch: a
RuntimeError "can't allocate memory") inside the unit, which `udfs.guard` turns into that unit's error
row; the worker lives on and the batch goes on, where the kernel's OOM killer would have taken the
worker, or the host, with no word of which episode did it.

The bound is set around each call of a UDF function and the worker's own limit restored after, so a
Python worker Spark reuses for another stage runs under that stage's bound.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import resource
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["data_limit", "memory_bound_mb", "with_memory_bound"]

T = TypeVar("T")

_MB = 1 << 20


@contextlib.contextmanager
def data_limit(limit_mb: int) -> Iterator[None]:
    """Run the body with this process's writable memory capped at `limit_mb` MiB (at most the hard cap)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = limit_mb * _MB
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def memory_bound_mb() -> int | None:
    """The writable-memory cap this process runs under now, in MiB; None when there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft // _MB


def with_memory_bound(fn: Callable[..., T], limit_mb: int | None) -> Callable[..., T]:
    """`fn` run under `data_limit(limit_mb)`; `fn` itself when `limit_mb` is None.

    A generator function (a `mapInPandas` body) stays one, bounded while it runs, not only while it is
    created. The wrapper keeps `fn`'s signature: pyspark tells a grouped function's forms apart by its
    number of arguments.
    """
    if limit_mb is None:
        return fn
    if limit_mb < 1:
        raise ValueError(f"a memory bound must be at least 1 MiB, got {limit_mb}")
    wrapped: Callable[..., Any]
    if inspect.isgeneratorfunction(fn):

        def bounded_batches(*args: Any) -> Iterator[Any]:
            with data_limit(limit_mb):
                yield from fn(*args)  # type: ignore[misc]

        wrapped = bounded_batches
    else:

        def bounded(*args: Any) -> T:
            with data_limit(limit_mb):
                return fn(*args)

        wrapped = bounded
    wrapped = functools.wraps(fn)(wrapped)
    wrapped.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return wrapped
