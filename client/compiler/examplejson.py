"""The built-in ExampleJSON codegen: one ExampleJSON text per partitioned function (``docs/examplejson.md``).

Its op set is every kernel of the board (``rpcsrv.loader.opset``), its composites the pattern table of
``partition.merge_composites`` (Conv+bias+Relu, dense+bias, BatchNorm+Relu, residual Add+Relu, channel
shuffles), and each function becomes an ``examplejson`` module whose constants the const loader binds by
name.  It is found through ``codegens.get_codegen`` like any installed codegen.
"""

from __future__ import annotations

import json

import numpy as np

from rpcsrv.loader.examplejson import ExampleJSONModule
from rpcsrv.loader.opset import OPS

from .codegens import Codegen, External
from .onnx_import import Graph
from .partition import Function, Op, merge_composites


def _dims(shape) -> str:
    return " ".join(str(d) for d in shape)


def _line(*parts: str) -> str:
    return "  " + " ".join(p for p in parts if p)


def examplejson_text(fn: Function, graph: Graph) -> tuple[str, list[str]]:
    """The function as ExampleJSON text, and the const-loader names of its constants (in order)."""
    ids: dict[str, int] = {}
    lines = [fn.symbol]
    for t in fn.inputs:
        info = graph.tensors[t]
        ids[t] = len(ids)
        lines.append(_line("input", str(ids[t]), _dims(info.shape), f"dtype: {info.dtype}"))
    const_names = []
    for k, t in enumerate(fn.constants):
        info = graph.tensors[t]
        ids[t] = len(ids)
        const_names.append(f"{fn.symbol}_const_{k}")
        lines.append(_line("const", str(ids[t]), _dims(info.shape), f"dtype: {info.dtype}",
                           f"name: {const_names[-1]}"))
    used = {t for op in fn.ops for t in op.inputs} | set(fn.outputs)
    for op in fn.ops:
        wanted = [(k, o) for k, o in enumerate(op.outputs) if o and o in used]
        for k, out in wanted:
            attrs = dict(op.attrs)
            if len(op.outputs) > 1:
                attrs["output_index"] = k
            args = " ".join(str(ids[t]) if t else "-1" for t in op.inputs)
            info = graph.tensors[out]
            ids[out] = len(ids)
            text = json.dumps(attrs, separators=(", ", ": ")) if attrs else ""
            lines.append(_line(op.kernel, str(ids[out]), "inputs:", args, "shape:", _dims(info.shape),
                               f"dtype: {info.dtype}", f"attrs: {text}" if text else ""))
    lines.append(_line("output", " ".join(str(ids[o]) for o in fn.outputs)))
    return "\n".join(lines) + "\n", const_names


class ExampleJSONCodegen(Codegen):
    """ExampleJSON on the board's numpy kernels (the codegen ``byoc compile`` uses by default)."""

    name = "examplejson"
    title = "ExampleJSON"
    ops = frozenset(OPS)

    def merge_composites(self, graph: Graph, ops: frozenset) -> list[Op]:
        return merge_composites(graph, ops)

    def generate(self, fn: Function, graph: Graph) -> External:
        code, names = examplejson_text(fn, graph)
        consts = {name: np.asarray(graph.constants[t], order="C") for name, t in zip(names, fn.constants)}
        return External(ExampleJSONModule(code), consts, code)


EXAMPLEJSON = ExampleJSONCodegen()
