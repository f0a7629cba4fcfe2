"""The TFLite graph reader and its torch runner: TensorFlow's padding, layouts, batching, refusals.

Hand-built one-operator graphs are checked against numpy references written from TensorFlow's
definitions; the real models' outputs against LiteRT are in `tests/pose_core/hands/test_torch_networks.py`.
"""

from __future__ import annotations

import numpy as np
import pytest

from pose_core.errors import ModelError
from pose_core.tflite.graph import TfliteGraph, TfliteOp, TfliteTensor, read_tflite

torch = pytest.importorskip("torch")
from pose_core.tflite.torch_module import TfliteModule, _same_padding  # noqa: E402 -- needs torch

SAME, VALID = 0, 1


def _tensor(shape: tuple[int, ...], data: np.ndarray | None = None) -> TfliteTensor:
    dtype = np.dtype(np.float32) if data is None else data.dtype
    return TfliteTensor(f"t{len(shape)}", shape, dtype, data)


def _run(graph: TfliteGraph, x: np.ndarray) -> list[np.ndarray]:
    with torch.inference_mode():
        return [o.numpy() for o in TfliteModule(graph)(torch.from_numpy(x))]


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: tuple[int, int]) -> np.ndarray:
    """NHWC convolution with OHWI weights, zero padding `pad` (before, after) on both spatial axes."""
    xp = np.pad(x, ((0, 0), pad, pad, (0, 0)))
    o, kh, kw, _ = w.shape
    out_h = (xp.shape[1] - kh) // stride + 1
    out_w = (xp.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], out_h, out_w, o), np.float64)
    for i in range(out_h):
        for j in range(out_w):
            patch = xp[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            out[:, i, j, :] = np.einsum("nhwc,ohwc->no", patch, w)
    return out


def test_same_padding_is_tensorflows_larger_after():
    # 6 -> 3 with a 3x3 kernel, stride 2: one row of padding in all, and it goes after (bottom/right).
    assert _same_padding(6, 3, 2, 1) == (0, 1)
    assert _same_padding(96, 5, 2, 1) == (1, 2)
    assert _same_padding(7, 3, 2, 1) == (1, 1)
    assert _same_padding(8, 5, 1, 1) == (2, 2)
    assert _same_padding(8, 1, 1, 1) == (0, 0)


@pytest.mark.parametrize(("padding", "pad"), [(SAME, (0, 1)), (VALID, (0, 0))])
def test_strided_conv_matches_tensorflows_padding(padding, pad):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 6, 2)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 2)).astype(np.float32)
    out_side = 3 if padding == SAME else 2
    graph = TfliteGraph(
        tensors=(_tensor((1, 6, 6, 2)), _tensor(w.shape, w), _tensor((1, out_side, out_side, 3))),
        ops=(TfliteOp("CONV_2D", (0, 1, -1), (2,), {"padding": padding, "strideH": 2, "strideW": 2}),),
        inputs=(0,),
        outputs=(2,),
    )
    np.testing.assert_allclose(_run(graph, x)[0], _conv_reference(x, w, 2, pad), atol=1e-5)


def test_depthwise_conv_float16_weights_and_nhwc_reshape():
    """DEQUANTIZE'd float16 depthwise weights, SAME stride 2, then a RESHAPE that must see NHWC order."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 4, 2)).astype(np.float32)
    w16 = rng.normal(size=(1, 3, 3, 2)).astype(np.float16)
    graph = TfliteGraph(
        tensors=(
            _tensor((1, 4, 4, 2)), _tensor(w16.shape, w16), _tensor(w16.shape),
            _tensor((1, 2, 2, 2)), _tensor((3,), np.array([1, 8, 1], np.int32)), _tensor((1, 8, 1)),
        ),
        ops=(
            TfliteOp("DEQUANTIZE", (1,), (2,), {}),
            TfliteOp("DEPTHWISE_CONV_2D", (0, 2, -1), (3,), {"padding": SAME, "strideH": 2, "strideW": 2}),
            TfliteOp("RESHAPE", (3, 4), (5,), {}),
        ),
        inputs=(0,),
        outputs=(5,),
    )  # fmt: skip
    w = w16.astype(np.float32)
    expected = np.stack(
        [_conv_reference(x[..., c : c + 1], w[..., c : c + 1].transpose(3, 1, 2, 0), 2, (0, 1))[..., 0]
         for c in range(2)], axis=-1,
    )  # fmt: skip
    out = _run(graph, x)[0]
    assert out.shape == (3, 8, 1)
    np.testing.assert_allclose(out, expected.reshape(3, 8, 1), atol=1e-5)


def test_channel_pad_prelu_and_max_pool_keep_tflite_semantics():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 4, 2)).astype(np.float32)
    alpha = np.array([[[0.1, 0.3]]], np.float32)
    pairs = np.array([[0, 0], [0, 0], [0, 0], [0, 2]], np.int32)
    graph = TfliteGraph(
        tensors=(
            _tensor((1, 4, 4, 2)), _tensor(alpha.shape, alpha), _tensor((1, 4, 4, 2)),
            _tensor((1, 2, 2, 2)), _tensor((4, 2), pairs), _tensor((1, 2, 2, 4)),
        ),
        ops=(
            TfliteOp("PRELU", (0, 1), (2,), {}),
            TfliteOp("MAX_POOL_2D", (2,), (3,), {
                "padding": VALID, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 2}),
            TfliteOp("PAD", (3, 4), (5,), {}),
        ),
        inputs=(0,),
        outputs=(5,),
    )  # fmt: skip
    prelu = np.where(x >= 0, x, alpha * x)
    pooled = prelu.reshape(2, 2, 2, 2, 2, 2).max(axis=(2, 4))
    expected = np.concatenate([pooled, np.zeros((2, 2, 2, 2), np.float32)], axis=-1)
    np.testing.assert_allclose(_run(graph, x)[0], expected, atol=1e-6)


def test_unsupported_operator_is_refused_by_name():
    graph = TfliteGraph(
        tensors=(_tensor((1, 4)), _tensor((1, 4))),
        ops=(TfliteOp("SOFTMAX", (0,), (1,), {}),),
        inputs=(0,),
        outputs=(1,),
    )
    with pytest.raises(ModelError, match="SOFTMAX"):
        TfliteModule(graph)


def test_reader_refuses_what_is_not_a_model():
    with pytest.raises(ModelError, match="TFL3"):
        read_tflite(b"\x1c\x00\x00\x00ONNXnot a tflite flatbuffer")


def test_constants_follow_the_module_to_another_dtype():
    """`.to()` moves the operators' weights (what `.to("cuda")` relies on): float64 in, float64 out."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 6, 6, 2))
    w = rng.normal(size=(3, 3, 3, 2)).astype(np.float32)
    graph = TfliteGraph(
        tensors=(_tensor((1, 6, 6, 2)), _tensor(w.shape, w), _tensor((1, 3, 3, 3))),
        ops=(TfliteOp("CONV_2D", (0, 1, -1), (2,), {"padding": SAME, "strideH": 2, "strideW": 2}),),
        inputs=(0,),
        outputs=(2,),
    )
    module = TfliteModule(graph).to(torch.float64)
    with torch.inference_mode():
        out = module(torch.from_numpy(x))[0]
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), _conv_reference(x, w.astype(np.float64), 2, (0, 1)), atol=1e-12)
