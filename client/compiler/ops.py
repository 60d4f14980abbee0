"""The unit of partitioning: :class:`Op`, one ONNX node or a composite of several, and use counts.

A leaf the partitioner (``partition.py``) and every codegen's pattern table (``codegens.py``,
``examplejson.py``) build on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rpcsrv.loader.opset import onnx_op_to_kernel

from .onnx_import import Graph, Node


@dataclass
class Op:
    """A unit of partitioning: one ONNX node, or a composite of several fused ones."""

    name: str
    kernel: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    nodes: list[Node]
    pattern: str = ""  # composite name, "" for a single op
    reason: str = ""  # why it is not supported ("" when it is)
    requires: set = field(default_factory=set)  # op names the accelerator must have for this op
    #: checked node by node against the board's op catalogue (a codegen's ``Pattern`` composite, which its
    #: own runtime runs), not as ``kernel`` with ``attrs`` and ``inputs`` (ExampleJSON's, run as that kernel)
    by_nodes: bool = False
    #: an int8 op's quantization parameters by role (``x``, ``w``, ``y``; ``a``, ``b``, ``y``; ...: the
    #: op language's ``QUANT_ROLES``), as ``rpcsrv.loader.opset.quant.QuantParams``; {} for other ops
    quant: dict = field(default_factory=dict)

    def __post_init__(self):
        self.requires = set(self.requires) or {self.kernel}


def consumers(graph: Graph) -> dict[str, int]:
    uses: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    for o in graph.outputs:
        uses[o] = uses.get(o, 0) + 1
    return uses


def single_op(node: Node) -> Op:
    """``node`` alone as an op (no composite)."""
    return Op(node.name, onnx_op_to_kernel(node.op_type), list(node.inputs), list(node.outputs),
              dict(node.attrs), [node])
