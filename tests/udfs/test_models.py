"""Which runtime and device run the hand networks (`udfs.models.hand_backend`), without loading a model."""

from __future__ import annotations

import sys

import pytest

from pose_core.errors import EgolakeError
from pose_core.hands import MediaPipeOptions
from udfs.models import hand_backend


def _torch(monkeypatch, cuda: bool):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    return torch


def test_litert_is_litert_whatever_the_machine():
    assert hand_backend(MediaPipeOptions(backend="litert"), "cuda:0") == ("litert", "cpu")


@pytest.mark.parametrize(
    ("backend", "cuda", "device", "expected"),
    [
        ("auto", False, None, ("litert", "cpu")),  # a CPU machine (CI) keeps the LiteRT default
        ("auto", True, None, ("torch", "cuda")),
        ("auto", True, "cuda:1", ("torch", "cuda:1")),  # the task's GPU
        ("auto", True, "cpu", ("litert", "cpu")),  # a task given no GPU
        ("torch", False, None, ("torch", "cpu")),  # asked for: torch on CPU
        ("torch", True, None, ("torch", "cuda")),
    ],
)
def test_backend_and_device(monkeypatch, backend, cuda, device, expected):
    _torch(monkeypatch, cuda)
    assert hand_backend(MediaPipeOptions(backend=backend), device) == expected


def test_without_torch_auto_falls_back_and_torch_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert hand_backend(MediaPipeOptions(backend="auto")) == ("litert", "cpu")
    with pytest.raises(EgolakeError, match=r"egolake\[gpu\]"):
        hand_backend(MediaPipeOptions(backend="torch"))


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="auto, litert or torch"):
        MediaPipeOptions(backend="tensorrt")  # type: ignore[arg-type]
