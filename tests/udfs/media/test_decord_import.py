"""Importing the decoder leaves torch's CPU BLAS alone (decord2 would preload NVBLAS; see `_import_decord`).

Each case runs in a fresh interpreter: the decoder first, then torch's first matrix product. With a plain
`import decord` and torch's CUDA wheels installed that product is a segfault (exit 139).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = "import torch\nprint(float((torch.ones(8, 64) @ torch.ones(64, 32)).sum()))"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", code]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_torch_runs_on_cpu_after_the_decoder_is_imported():
    pytest.importorskip("torch")
    pytest.importorskip("decord")
    code = f"import udfs.media.decode\n{PRODUCT}"
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) == 8 * 32 * 64
    assert "NVBLAS" not in done.stdout + done.stderr


def test_the_decoder_loads_no_cuda_library():
    if importlib.util.find_spec("nvidia") is None:
        pytest.skip("no nvidia-* wheels installed: nothing for decord to preload")
    pytest.importorskip("decord")
    code = "import udfs.media.decode\nprint(open('/proc/self/maps').read())"
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "/nvidia/" not in done.stdout
