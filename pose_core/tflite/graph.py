"""A `.tflite` model's first subgraph as plain data: tensors (constants as numpy arrays) and operators.

The flatbuffer is read with the schema code that LiteRT ships (`ai_edge_litert.schema_py_generated`,
over the `flatbuffers` runtime), so no second TFLite package is needed and the reader follows the
same schema as the interpreter it is compared with. The caller passes the model's bytes; this module
reads no files.

Only what a float model needs is kept: float16 constants stay float16 (a `DEQUANTIZE` operator turns
them into float32, as in the graph); quantized (int8/uint8 with scales), sparse and custom operators
are refused with an error that names them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pose_core.errors import ModelError

__all__ = ["TfliteGraph", "TfliteOp", "TfliteTensor", "read_tflite"]

logger = logging.getLogger(__name__)

# TensorType enum of the TFLite schema -> numpy dtype (those a float graph holds).
_DTYPES: dict[str, type[np.generic]] = {
    "FLOAT32": np.float32,
    "FLOAT16": np.float16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "BOOL": np.bool_,
}
# A TFLite flatbuffer's file identifier, at bytes 4-8.
_IDENTIFIER = b"TFL3"
# Buffer.offset of 0 or 1 means "no data outside the flatbuffer" (the schema's convention).
_NO_OFFSET = 1


@dataclass(frozen=True)
class TfliteTensor:
    """One tensor of the graph.

    Attributes:
        name: the tensor's name in the model.
        shape: static shape in TFLite's layout (activations NHWC, batch 1).
        dtype: element type.
        data: the constant's value, `shape`, or None for an activation.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    data: np.ndarray | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TfliteOp:
    """One operator: its builtin name (e.g. ``"CONV_2D"``), tensor indices and builtin options.

    Attributes:
        kind: `BuiltinOperator` name.
        inputs: tensor indices; -1 marks an absent optional input (e.g. no bias).
        outputs: tensor indices.
        options: fields of the operator's builtin options (e.g. ``padding``, ``strideW``); empty if none.
    """

    kind: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict[str, Any]


@dataclass(frozen=True)
class TfliteGraph:
    """A model's main subgraph: tensors, operators in execution order, graph inputs and outputs."""

    tensors: tuple[TfliteTensor, ...]
    ops: tuple[TfliteOp, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def _enum_names(enum: type) -> dict[int, str]:
    return {v: k for k, v in vars(enum).items() if not k.startswith("_")}


def _buffer_bytes(model: bytes, buffer: Any) -> bytes | None:
    """A buffer's bytes: inline in the flatbuffer, or at `offset` past it (models over 2 GB)."""
    if buffer is None:
        return None
    if buffer.offset > _NO_OFFSET:
        return model[buffer.offset : buffer.offset + buffer.size]
    if buffer.data is None or len(buffer.data) == 0:
        return None
    return np.asarray(buffer.data, np.uint8).tobytes()


def read_tflite(model: bytes) -> TfliteGraph:
    """Read the first subgraph of a `.tflite` flatbuffer.

    Args:
        model: the model file's bytes.

    Returns:
        The graph, constants decoded (little-endian, as TFLite stores them).

    Raises:
        ModelError: not a TFLite model; a custom operator, a quantized or sparse tensor, or an element
            type this reader does not know.
    """
    from ai_edge_litert import schema_py_generated as schema  # noqa: PLC0415 -- only when a graph is read

    if model[4:8] != _IDENTIFIER:
        raise ModelError(f"not a TFLite model: no {_IDENTIFIER.decode()} identifier at bytes 4-8")
    op_names = _enum_names(schema.BuiltinOperator)
    type_names = _enum_names(schema.TensorType)
    root = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    sub = root.subgraphs[0]
    tensors = []
    for t in sub.tensors:
        name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
        type_name = type_names.get(t.type, str(t.type))
        if type_name not in _DTYPES:
            raise ModelError(f"tflite tensor {name!r}: element type {type_name} is not supported")
        quant = t.quantization
        if quant is not None and quant.scale is not None and len(quant.scale) > 0:
            raise ModelError(f"tflite tensor {name!r} is quantized: only float graphs are supported")
        if t.sparsity is not None:
            raise ModelError(f"tflite tensor {name!r} is sparse: not supported")
        dtype = np.dtype(_DTYPES[type_name]).newbyteorder("<")
        shape = tuple(int(d) for d in (t.shape if t.shape is not None else ()))
        raw = _buffer_bytes(model, root.buffers[t.buffer]) if t.buffer > 0 else None
        data = None if raw is None else np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="))
        data = None if data is None else data.reshape(shape)
        tensors.append(TfliteTensor(name, shape, np.dtype(_DTYPES[type_name]), data))
    ops = []
    for op in sub.operators:
        code = root.operatorCodes[op.opcodeIndex]
        kind = op_names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "")
        if kind in ("", "CUSTOM"):
            raise ModelError(f"tflite custom operator {code.customCode!r} is not supported")
        options = dict(vars(op.builtinOptions)) if op.builtinOptions is not None else {}
        inputs, outputs = tuple(int(i) for i in op.inputs), tuple(int(i) for i in op.outputs)
        ops.append(TfliteOp(kind, inputs, outputs, options))
    logger.debug("read tflite graph: %d tensors, %d operators", len(tensors), len(ops))
    return TfliteGraph(
        tuple(tensors), tuple(ops), tuple(int(i) for i in sub.inputs), tuple(int(i) for i in sub.outputs)
    )
