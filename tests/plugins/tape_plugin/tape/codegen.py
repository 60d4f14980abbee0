"""The compiler side of tape: :data:`CODEGEN`, named by the entry point ``byoc.codegens: tape``.

Op set: conv, relu, add, mul, sigmoid, max_pool, flatten, gemm (float32, 2-D convolutions and pools).
Composites, in table order (a pattern starting at the same node as a later one wins over it):

* ``tape.conv_residual``: ``Relu(Add(Relu(Conv(x, W, B)), x))``, the block input read twice (a DAG);
* ``tape.conv_silu``: ``Mul(c, Sigmoid(c))`` with ``c = Conv(x, W, B)`` (a diamond);
* ``tape.conv_relu``, ``tape.gemm_relu``: chains.

Every composite becomes one instruction (a conv with its activation, skip and post-activation).  The weights
go to the const loader, named ``<symbol>.<k>``; the program lists their slots by those names.
"""

from __future__ import annotations

import numpy as np

from rpcsrv.client.compiler.codegens import Codegen, External, Pattern, is_constant, is_op, wildcard
from rpcsrv.client.compiler.onnx_import import Graph
from rpcsrv.client.compiler.ops import Op
from rpcsrv.client.compiler.partition import Function

from .fmt import CODEC, PAYLOAD, TYPE_KEY, VERSION, TapeModule


def _residual():
    x = wildcard()
    conv = is_op("Conv")(x, is_constant(), is_constant())
    return is_op("Relu")(is_op("Add")(is_op("Relu")(conv), x))


def _silu():
    conv = is_op("Conv")(wildcard(), is_constant(), is_constant())
    return is_op("Mul")(conv, is_op("Sigmoid")(conv))


#: the pattern -> (act, post-activation after the skip) of its fused instruction
FUSED = {"tape.conv_residual": ("relu", "relu"), "tape.conv_silu": ("silu", "none"),
         "tape.conv_relu": ("relu", "none"), "tape.gemm_relu": ("relu", "none")}
OPCODE = {"conv": "conv", "relu": "relu", "add": "add", "mul": "mul", "sigmoid": "sigmoid", "max_pool": "maxpool",
          "flatten": "flatten", "gemm": "gemm"}


class TapeCodegen(Codegen):
    name = TYPE_KEY
    title = "tape"
    ops = frozenset(OPCODE)
    codec = CODEC
    patterns = (
        Pattern("tape.conv_residual", _residual()),
        Pattern("tape.conv_silu", _silu()),
        Pattern("tape.conv_relu", ("Conv", "Relu")),
        Pattern("tape.gemm_relu", ("Gemm", "Relu")),
    )

    def check(self, op: Op, graph: Graph) -> str:
        names = [t for t in op.inputs + op.outputs if t]
        if any(graph.tensors[t].dtype != "float32" for t in names):
            return "tape runs float32 only"
        a = op.attrs  # the model's attributes: absent ones take ONNX's defaults
        if op.kernel in ("conv", "max_pool"):
            if len(graph.tensors[op.inputs[0]].shape) != 4 or a.get("auto_pad", "NOTSET") != "NOTSET":
                return "tape: 2-D, explicit pads"
            if any(d != 1 for d in a.get("dilations", [])) or a.get("ceil_mode", 0) or a.get("storage_order", 0):
                return "tape: no dilations, ceil_mode or storage_order"
            if len([o for o in op.outputs if o]) != 1:
                return "tape: one output"
        if op.kernel == "gemm" and (a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
            return "tape: gemm without transA, alpha or beta"
        return ""

    def generate(self, fn: Function, graph: Graph) -> External:
        slots: dict[str, int] = {}
        dims: list[list[int]] = []

        def slot(name: str) -> int:
            if name not in slots:
                slots[name] = len(dims)
                dims.append(list(graph.tensors[name].shape))
            return slots[name]

        args = [slot(t) for t in fn.inputs]
        constants, weights = {}, []
        for k, t in enumerate(fn.constants):
            name = f"{fn.symbol}.{k}"
            constants[name] = np.ascontiguousarray(graph.constants[t], np.float32)
            weights.append(dict(slot=slot(t), name=name))
        tape = [self._instruction(op, slot) for op in fn.ops]
        program = dict(version=VERSION, symbol=fn.symbol, slots=[dict(dims=d) for d in dims], args=args,
                       results=[slot(t) for t in fn.outputs], weights=weights, tape=tape)
        value = PAYLOAD.parse(PAYLOAD.build(program))  # what the board will decode
        return External(TapeModule(value), constants, listing(value))

    @staticmethod
    def _instruction(op: Op, slot) -> dict:
        act, post = FUSED.get(op.pattern, ("none", "none"))
        first = op.nodes[0]
        srcs = [slot(t) for t in first.inputs if t]
        skip = -1
        if op.pattern == "tape.conv_residual":
            add = op.nodes[2]
            skip = slot([t for t in add.inputs if t != op.nodes[1].outputs[0]][0])
        return dict(op=OPCODE[op.kernel], act=act, srcs=srcs, dst=slot(op.outputs[0]), skip=skip, post=post,
                    ints=_ints(op))


def _ints(op: Op) -> list[int]:
    a = op.attrs
    if op.kernel == "conv":
        return list(a.get("strides", [1, 1])) + list(a.get("pads", [0, 0, 0, 0])) + [a.get("group", 1)]
    if op.kernel == "max_pool":
        return list(a["kernel_shape"]) + list(a.get("strides", [1, 1])) + list(a.get("pads", [0, 0, 0, 0]))
    if op.kernel == "flatten":
        return [a.get("axis", 1)]
    if op.kernel == "gemm":
        return [a.get("transB", 0)]
    return []


def listing(value) -> str:
    """The program as text, for ``byoc compile -v`` and ``rpcsrv extract``."""
    lines = [f"tape {value.symbol}: {len(value.slots)} slots, args {list(value.args)}, results {list(value.results)}"]
    lines += [f"  weight s{w.slot} = {w.name}" for w in value.weights]
    for ins in value.tape:
        extra = (f" +s{ins.skip}" if ins.skip >= 0 else "") + (f" {ins.post}" if ins.post != "none" else "")
        lines.append(f"  s{ins.dst} = {ins.op}{'' if ins.act == 'none' else '.' + ins.act}"
                     f"({', '.join(f's{i}' for i in ins.srcs)}){extra} {list(ins.ints)}")
    return "\n".join(lines) + "\n"


CODEGEN = TapeCodegen()
