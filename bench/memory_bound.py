"""What the task memory bound (`udfs.memory`, RLIMIT_DATA) lets through and what it stops.

    python -m bench.memory_bound [--bound-mb 3072]

Under the bound, in this process: import torch, a matmul and a cuDNN convolution on the GPU, pinned
host memory, 8 GiB on the device and cupy (GPU rows skipped without CUDA), then a 4 GiB host array,
which must fail. Each row gives the process's writable memory (VmData, what the bound counts), its
address space (VmSize, what Spark's `spark.executor.pyspark.memory` would count) and resident set.
Prints its table, writes nothing; for the GPU machine too (no Spark or Java).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from udfs.memory import data_limit

GIB = 1 << 30


def _status_mib() -> tuple[int, int, int]:
    """(VmData, VmSize, VmRSS) of this process, MiB."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f)
    data, size, rss = (int(status[key].split()[0]) // 1024 for key in ("VmData", "VmSize", "VmRSS"))
    return data, size, rss


def _steps(torch: Any) -> list[tuple[str, Callable[[], object]]]:
    """The checks, in order; `torch` is the module, imported under the bound."""
    steps: list[tuple[str, Callable[[], object]]] = [
        ("torch CPU convolution", lambda: torch.nn.Conv2d(3, 16, 3)(torch.randn(8, 3, 256, 256))),
    ]
    if torch.cuda.is_available():
        ones, conv = torch.ones(4096, 4096, device="cuda"), torch.nn.Conv2d(3, 32, 3)
        steps += [
            ("CUDA matmul 4096x4096", lambda: (torch.randn(4096, 4096, device="cuda") @ ones).sum().item()),
            ("cuDNN convolution", lambda: conv.cuda()(torch.randn(64, 3, 224, 224, device="cuda")).sum()),
            ("256 MiB pinned host memory", lambda: torch.empty(256 << 20, dtype=torch.uint8).pin_memory()),
            ("8 GiB on the device", lambda: torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")),
            ("cupy sum of 1 GiB", _cupy_sum),
        ]
    steps.append(("4 GiB host array (must fail)", lambda: np.ones(4 * GIB, dtype=np.uint8)))
    return steps


def _cupy_sum() -> float:
    import cupy as cp  # noqa: PLC0415 - only where CUDA is

    return float(cp.ones(GIB // 4, dtype=cp.float32).sum())


def _row(step: str, result: str) -> None:
    data, size, rss = _status_mib()
    print(f"| {step} | {result} | {data} | {size} | {rss} |")  # noqa: T201


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound-mb", type=int, default=3072)
    args = parser.parse_args()
    print(f"bound {args.bound_mb} MiB (RLIMIT_DATA)\n")  # noqa: T201
    print("| step | result | VmData MiB | VmSize MiB | VmRSS MiB |\n|---|---|---|---|---|")  # noqa: T201
    with data_limit(args.bound_mb):
        import torch  # noqa: PLC0415 - imported under the bound: its own reservations are the point

        _row("import torch", "ok")
        for name, step in _steps(torch):
            try:
                step()
                result = "ok"
            except (MemoryError, RuntimeError) as exc:
                result = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            _row(name, result)


if __name__ == "__main__":
    main()
