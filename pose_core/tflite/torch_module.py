"""Run a float `TfliteGraph` in torch, batched: one small module per TFLite operator, in graph order.

Layout: TFLite activations are NHWC with batch 1. Here every 4-D activation is kept NCHW (torch's
convolution layout) from the input's one permute to the outputs'; the operators whose meaning
depends on the layout (RESHAPE, CONCATENATION's axis, MEAN, FULLY_CONNECTED, PAD's pairs, constants
broadcast against an activation) convert their axes, so outputs equal TFLite's. The batch is taken
from the input: a RESHAPE's leading 1 becomes N.

Padding follows TensorFlow: VALID is none; SAME pads `max((ceil(in / s) - 1) * s + (k - 1) * d + 1 - in, 0)`
in total, the smaller half before (top/left), the larger after (bottom/right), with zeros for
convolutions and -inf for max pooling. Weights are float32 (float16 constants dequantised once, as
LiteRT's CPU kernels do); the module is an `nn.Module` whose constants are buffers, so `.to(device)`
moves them.

Operators: ADD, CONCATENATION, CONV_2D, DEPTHWISE_CONV_2D, DEQUANTIZE, FULLY_CONNECTED, LOGISTIC,
MAX_POOL_2D, MEAN, PAD, PRELU, RELU, RELU6, RESHAPE, RESIZE_BILINEAR (MediaPipe's palm detector and
hand landmark model use these); any other raises `ModelError` when the module is built.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 -- torch's own convention
from torch import Tensor, nn

from pose_core.errors import ModelError
from pose_core.tflite.graph import TfliteGraph, TfliteOp

__all__ = ["TfliteModule"]

logger = logging.getLogger(__name__)

# Axis of an NHWC tensor -> the same axis of its NCHW copy, and the NHWC axis of each NCHW axis.
_NCHW_AXIS = (0, 2, 3, 1)
_NHWC_AXIS = (0, 3, 1, 2)
# TFLite Padding enum, ActivationFunctionType enum (the values of the schema).
_SAME, _VALID = 0, 1
_ACTIVATIONS: dict[int, Callable[[Tensor], Tensor]] = {
    0: lambda x: x,
    1: F.relu,
    3: F.relu6,
}


def _to_nchw(x: Tensor) -> Tensor:
    return x.permute(0, 3, 1, 2).contiguous()


def _to_nhwc(x: Tensor) -> Tensor:
    return x.permute(0, 2, 3, 1).contiguous()


def _activation(op: TfliteOp) -> Callable[[Tensor], Tensor]:
    code = int(op.options.get("fusedActivationFunction", 0))
    if code not in _ACTIVATIONS:
        raise ModelError(f"tflite {op.kind}: fused activation {code} is not supported")
    return _ACTIVATIONS[code]


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one spatial axis: (before, after), after >= before."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _spatial_padding(
    op: TfliteOp, hw: tuple[int, int], kernel: tuple[int, int], dilation: tuple[int, int]
) -> tuple[int, int, int, int]:
    """F.pad's (left, right, top, bottom) for a SAME or VALID operator on an `hw` input."""
    padding = int(op.options["padding"])
    if padding == _VALID:
        return (0, 0, 0, 0)
    if padding != _SAME:
        raise ModelError(f"tflite {op.kind}: padding {padding} is not supported")
    top, bottom = _same_padding(hw[0], kernel[0], int(op.options["strideH"]), dilation[0])
    left, right = _same_padding(hw[1], kernel[1], int(op.options["strideW"]), dilation[1])
    return (left, right, top, bottom)


def _as_nchw_constant(value: np.ndarray) -> np.ndarray:
    """A constant broadcast against an NHWC activation, as the matching constant for its NCHW copy."""
    if value.ndim > 4:
        raise ModelError(f"tflite constant of rank {value.ndim} against a 4-D activation")
    return value.reshape((1,) * (4 - value.ndim) + value.shape).transpose(0, 3, 1, 2)


class _Op(nn.Module):
    """One operator: `fn(constants, *activations)`; its constants are buffers, so they follow `.to()`."""

    def __init__(self, fn: Callable[..., Tensor], **constants: np.ndarray) -> None:
        super().__init__()
        self._fn = fn
        for name, value in constants.items():
            self.register_buffer(name, torch.from_numpy(np.ascontiguousarray(value, np.float32)))

    def forward(self, *inputs: Tensor) -> Tensor:
        return self._fn(self._buffers, *inputs)  # the live dict: `.to()` replaces its tensors


class TfliteModule(nn.Module):
    """A float TFLite graph as a batched torch module.

    Args:
        graph: from `pose_core.tflite.graph.read_tflite`.

    Raises:
        ModelError: an operator or an option this module does not implement.

    `forward(*inputs)` takes the graph's inputs in TFLite's layout with any batch, e.g. `(N, H, W, C)`
    float32, and returns its outputs in TFLite's layout, e.g. `(N, 2016, 18)`.
    """

    def __init__(self, graph: TfliteGraph) -> None:
        super().__init__()
        self._graph = graph
        self._constants: dict[int, np.ndarray] = {
            i: t.data for i, t in enumerate(graph.tensors) if t.data is not None
        }
        self._nchw: set[int] = set()  # activations stored NCHW (every 4-D one)
        self._steps: list[tuple[tuple[int, ...], int]] = []  # (activation inputs, output) per op
        self._mark_inputs()
        modules = []
        for op in graph.ops:
            built = self._build(op)
            if built is None:  # folded into a constant
                continue
            module, inputs = built
            modules.append(module)
            self._steps.append((inputs, op.outputs[0]))
            if len(graph.tensors[op.outputs[0]].shape) == 4:
                self._nchw.add(op.outputs[0])
        self.ops = nn.ModuleList(modules)

    def _mark_inputs(self) -> None:
        for i in self._graph.inputs:
            if len(self._graph.tensors[i].shape) == 4:
                self._nchw.add(i)

    def forward(self, *inputs: Tensor) -> list[Tensor]:
        """The graph's outputs for `inputs` (TFLite layout, any batch)."""
        values: dict[int, Tensor] = {}
        for index, x in zip(self._graph.inputs, inputs, strict=True):
            values[index] = _to_nchw(x) if index in self._nchw else x
        for module, (ins, out) in zip(self.ops, self._steps, strict=True):
            values[out] = module(*(values[i] for i in ins))
        return [_to_nhwc(values[i]) if i in self._nchw else values[i] for i in self._graph.outputs]

    def _shape(self, index: int) -> tuple[int, ...]:
        return self._graph.tensors[index].shape

    def _const(self, op: TfliteOp, position: int) -> np.ndarray:
        index = op.inputs[position]
        if index not in self._constants:
            raise ModelError(f"tflite {op.kind}: input {position} must be a constant")
        return self._constants[index]

    def _build(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]] | None:
        builder = _BUILDERS.get(op.kind)
        if builder is None:
            raise ModelError(f"tflite operator {op.kind} is not supported by the torch runner")
        return builder(self, op)

    # --- operators -------------------------------------------------------------------------------

    def _dequantize(self, op: TfliteOp) -> None:
        self._constants[op.outputs[0]] = self._const(op, 0).astype(np.float32)

    def _conv(self, op: TfliteOp, depthwise: bool) -> tuple[_Op, tuple[int, ...]]:
        weight = self._const(op, 1).astype(np.float32)
        in_shape = self._shape(op.inputs[0])
        kh, kw = weight.shape[1:3]
        if depthwise:
            torch_weight = weight.reshape(kh, kw, -1).transpose(2, 0, 1)[:, None]  # (C*M, 1, kh, kw)
            groups = in_shape[3]
        else:
            torch_weight = weight.transpose(0, 3, 1, 2)  # OHWI -> OIHW
            groups = 1
        has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
        bias = self._const(op, 2) if has_bias else np.zeros(torch_weight.shape[0], np.float32)
        stride = (int(op.options["strideH"]), int(op.options["strideW"]))
        dilation = (int(op.options.get("dilationHFactor", 1)), int(op.options.get("dilationWFactor", 1)))
        pad = _spatial_padding(op, (in_shape[1], in_shape[2]), (kh, kw), dilation)
        act = _activation(op)

        symmetric = pad[0] == pad[1] and pad[2] == pad[3]
        inner = (pad[2], pad[0]) if symmetric else (0, 0)

        def run(c: dict[str, Tensor], x: Tensor) -> Tensor:
            if not symmetric:
                x = F.pad(x, pad)
            return act(F.conv2d(x, c["weight"], c["bias"], stride, inner, dilation, groups))

        return _Op(run, weight=torch_weight, bias=bias), (op.inputs[0],)

    def _add(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        act = _activation(op)
        a, b = op.inputs
        if a in self._constants or b in self._constants:
            const_index, x_index = (a, b) if a in self._constants else (b, a)
            const = self._constants[const_index]
            if x_index in self._nchw:
                const = _as_nchw_constant(const)
            return _Op(lambda c, x: act(x + c["const"]), const=const), (x_index,)
        if (a in self._nchw) != (b in self._nchw):
            raise ModelError("tflite ADD of a 4-D activation and one of another rank is not supported")
        return _Op(lambda c, x, y: act(x + y)), (a, b)

    def _prelu(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        alpha = self._const(op, 1)
        if op.inputs[0] in self._nchw:
            alpha = _as_nchw_constant(alpha)
            if alpha.shape[2:] == (1, 1):  # one slope per channel: torch's own PReLU
                return _Op(lambda c, x: F.prelu(x, c["alpha"]), alpha=alpha.reshape(-1)), (op.inputs[0],)
        return _Op(lambda c, x: torch.where(x >= 0, x, c["alpha"] * x), alpha=alpha), (op.inputs[0],)

    def _unary(self, op: TfliteOp, fn: Callable[[Tensor], Tensor]) -> tuple[_Op, tuple[int, ...]]:
        return _Op(lambda c, x: fn(x)), (op.inputs[0],)

    def _max_pool(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        in_shape = self._shape(op.inputs[0])
        kernel = (int(op.options["filterHeight"]), int(op.options["filterWidth"]))
        stride = (int(op.options["strideH"]), int(op.options["strideW"]))
        pad = _spatial_padding(op, (in_shape[1], in_shape[2]), kernel, (1, 1))
        act = _activation(op)

        def run(c: dict[str, Tensor], x: Tensor) -> Tensor:
            if any(pad):
                x = F.pad(x, pad, value=-math.inf)
            return act(F.max_pool2d(x, kernel, stride))

        return _Op(run), (op.inputs[0],)

    def _pad(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        pairs = self._const(op, 1).astype(np.int64).reshape(-1, 2)
        if pairs[0].any():
            raise ModelError("tflite PAD of the batch axis is not supported")
        if op.inputs[0] in self._nchw:
            pairs = pairs[list(_NHWC_AXIS)]
        flat = tuple(int(v) for pair in pairs[::-1] for v in pair)  # F.pad: last axis first
        return _Op(lambda c, x: F.pad(x, flat)), (op.inputs[0],)

    def _resize_bilinear(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        size = tuple(int(v) for v in self._const(op, 1))
        align, half = bool(op.options.get("alignCorners")), bool(op.options.get("halfPixelCenters"))
        if align == half:  # (False, False) is TF1's legacy sampling; (True, True) is invalid
            raise ModelError(
                f"tflite RESIZE_BILINEAR with alignCorners={align}, halfPixelCenters={half} is not supported"
            )
        return _Op(
            lambda c, x: F.interpolate(x, size=size, mode="bilinear", align_corners=align)
        ), (op.inputs[0],)

    def _reshape(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        target = tuple(int(v) for v in self._shape(op.outputs[0]))
        if self._shape(op.inputs[0])[0] != 1 or target[0] != 1:
            raise ModelError("tflite RESHAPE must keep the batch axis (of size 1) first")
        nchw_in, nchw_out = op.inputs[0] in self._nchw, len(target) == 4

        def run(c: dict[str, Tensor], x: Tensor) -> Tensor:
            y = (_to_nhwc(x) if nchw_in else x).reshape((x.shape[0], *target[1:]))
            return _to_nchw(y) if nchw_out else y

        return _Op(run), (op.inputs[0],)

    def _concatenation(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        rank = len(self._shape(op.outputs[0]))
        axis = int(op.options["axis"]) % rank
        if any(i in self._constants for i in op.inputs):
            raise ModelError("tflite CONCATENATION of a constant is not supported")
        if rank == 4:
            axis = _NCHW_AXIS[axis]
        act = _activation(op)
        return _Op(lambda c, *xs: act(torch.cat(xs, dim=axis))), tuple(op.inputs)

    def _mean(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        rank = len(self._shape(op.inputs[0]))
        axes = tuple(sorted(int(a) % rank for a in self._const(op, 1).reshape(-1)))
        keep = bool(op.options.get("keepDims"))
        if op.inputs[0] in self._nchw and keep:
            dims = tuple(_NCHW_AXIS[a] for a in axes)
            return _Op(lambda c, x: x.mean(dim=dims, keepdim=True)), (op.inputs[0],)
        nchw_in = op.inputs[0] in self._nchw
        return _Op(
            lambda c, x: (_to_nhwc(x) if nchw_in else x).mean(dim=axes, keepdim=keep)
        ), (op.inputs[0],)

    def _fully_connected(self, op: TfliteOp) -> tuple[_Op, tuple[int, ...]]:
        if int(op.options.get("weightsFormat", 0)) != 0 or op.options.get("keepNumDims"):
            raise ModelError("tflite FULLY_CONNECTED: only the default weights format without keepNumDims")
        weight = self._const(op, 1).astype(np.float32)  # (out, in)
        has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
        bias = self._const(op, 2) if has_bias else np.zeros(weight.shape[0], np.float32)
        nchw_in = op.inputs[0] in self._nchw
        act = _activation(op)

        def run(c: dict[str, Tensor], x: Tensor) -> Tensor:
            flat = (_to_nhwc(x) if nchw_in else x).reshape(-1, c["weight"].shape[1])
            return act(F.linear(flat, c["weight"], c["bias"]))

        return _Op(run, weight=weight, bias=bias), (op.inputs[0],)


_BUILDERS: dict[str, Callable[[TfliteModule, TfliteOp], Any]] = {
    "ADD": TfliteModule._add,
    "CONCATENATION": TfliteModule._concatenation,
    "CONV_2D": lambda self, op: self._conv(op, depthwise=False),
    "DEPTHWISE_CONV_2D": lambda self, op: self._conv(op, depthwise=True),
    "DEQUANTIZE": TfliteModule._dequantize,
    "FULLY_CONNECTED": TfliteModule._fully_connected,
    "LOGISTIC": lambda self, op: self._unary(op, torch.sigmoid),
    "MAX_POOL_2D": TfliteModule._max_pool,
    "MEAN": TfliteModule._mean,
    "PAD": TfliteModule._pad,
    "PRELU": TfliteModule._prelu,
    "RELU": lambda self, op: self._unary(op, F.relu),
    "RELU6": lambda self, op: self._unary(op, F.relu6),
    "RESHAPE": TfliteModule._reshape,
    "RESIZE_BILINEAR": TfliteModule._resize_bilinear,
}
