"""The compiler's graph IR: nodes in execution order, every tensor with a static shape and dtype.

Its own module so that the passes which build on it (``onnx_import``, ``opsets``, ``simplify``,
``partition``, the code generators) import it from below, and none of them from each other in a
circle.  ``onnx_import`` fills it from an ONNX model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TensorInfo:
    """Static shape and TVM dtype string of one tensor."""

    shape: tuple[int, ...]
    dtype: str


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
