"""The compiler's graph IR: nodes in execution order, every tensor with a static shape and dtype.

Its own module so that the passes which build on it (``onnx_import``, ``opsets``, ``simplify``,
``partition``, the code generators) import it from below, and none of them from each other in a
circle.  ``onnx_import`` fills it from an ONNX model.

Quantized tensors are first-class: an int8/uint8 (or int32 bias) tensor that stands for real values
carries its :class:`~rpcsrv.loader.opset.quant.QuantParams` in ``TensorInfo.quant`` (set by the
``quantize`` pass for what the int8 ops read and write); the int8 ops themselves are nodes of the op
language's int8 ops (``QLinearConv``, ``com.microsoft`` ``QGemm``, ...), whose scales and zero points
are constant inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Optional

import numpy as np

from rpcsrv.loader.opset.quant import QuantParams


@dataclass
class TensorInfo:
    """Static shape and TVM dtype string of one tensor; ``quant``: its scale and zero point when it is
    a quantized tensor (the integers stand for ``(q - zero_point) * scale``), else None."""

    shape: tuple[int, ...]
    dtype: str
    quant: Optional[QuantParams] = None


@dataclass
class Node:
    """One ONNX node; ``inputs`` uses ``""`` for an absent optional input, as ONNX does."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict


@dataclass
class Graph:
    """A whole model with static shapes: what partitioning and codegen work on."""

    name: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    tensors: dict[str, TensorInfo]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 0

    def describe(self, name: str) -> str:
        """``name 1x3x224x224 float32`` for messages."""
        info = self.tensors.get(name)
        if info is None:
            return f"{name} (?)"
        return f"{name} {'x'.join(map(str, info.shape)) or 'scalar'} {info.dtype}"
