"""What a new batch size costs the torch hand networks: first call per input shape against repeats.

    python -m bench.torch_shapes [--device cuda] [--calls 80] [--max-batch 99]

`--calls` calls of each network with batch sizes drawn from 1..`--max-batch` (random images), once
with the exact sizes and once padded to powers of two (`TorchHandNetworks.pad_batches`), each with
cuDNN's benchmark mode off and on: the mean wall time of a shape's first call and of repeated calls,
and the total. For the GPU machine (no Spark or Java); prints its table, writes nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from pose_core.hands.networks import LANDMARK_INPUT, PALM_INPUT
from pose_core.hands.torch_networks import TorchHandNetworks
from udfs.models import hand_model_bytes


def _calls(nets: TorchHandNetworks, network: str, sizes: np.ndarray, rng: np.random.Generator) -> dict:
    run, side = (nets.landmarks, LANDMARK_INPUT) if network == "landmark" else (nets.palms, PALM_INPUT)
    seen: set[int] = set()
    first, again = [], []
    for n in sizes:
        shape = min(1 << (int(n) - 1).bit_length(), nets.max_batch) if nets.pad_batches else int(n)
        images = rng.random((int(n), side, side, 3), dtype=np.float32)
        t0 = time.perf_counter()
        run(images)
        (again if shape in seen else first).append(time.perf_counter() - t0)
        seen.add(shape)
    repeat_ms = 1e3 * np.mean(again) if again else float("nan")
    total_s = sum(first) + sum(again)
    return {"shapes": len(seen), "first_ms": 1e3 * np.mean(first), "repeat_ms": repeat_ms, "total_s": total_s}


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=80)
    parser.add_argument("--max-batch", type=int, default=99)
    args = parser.parse_args()
    palm, landmark = hand_model_bytes()
    nets = TorchHandNetworks(palm, landmark, args.device)
    rng = np.random.default_rng(0)
    print("| network | cudnn.benchmark | batches | shapes | first call ms | repeat ms | total s |")  # noqa: T201
    print("|---|---|---|---|---|---|---|")  # noqa: T201
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        for padded in (False, True):
            nets.pad_batches = padded
            for network in ("landmark", "palm"):
                r = _calls(nets, network, rng.integers(1, args.max_batch + 1, args.calls), rng)
                print(f"| {network} | {benchmark} | {'padded' if padded else 'exact'} | {r['shapes']} | "  # noqa: T201
                      f"{r['first_ms']:.1f} | {r['repeat_ms']:.1f} | {r['total_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
