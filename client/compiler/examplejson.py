"""The built-in ExampleJSON codegen: one ExampleJSON text per partitioned function (``docs/examplejson.md``).

Its op set is every kernel of the board (``rpcsrv.loader.opset``), its composites the pattern table of
:func:`merge_composites` (Conv+bias+activation, the activation Relu, ReLU6 as Clip, HardSwish or Swish;
dense+bias, BatchNorm+Relu, residual Add+Relu, channel shuffles: see ``partition.py``'s first step),
and each function becomes an ``examplejson`` module whose constants the const loader binds by name.
The int8 ops the compiler folds QDQ chains into are its quantized composites, named as TVM's QNN
backends name theirs: ``examplejson.qnn_conv2d`` (``q_linear_conv``: conv, int32 bias, requantize,
``_relu``/``_clip`` with a fused activation) and ``examplejson.qnn_dense`` (``q_gemm``, ``q_linear_matmul``).  It
is found through ``codegens.get_codegen`` like any installed codegen.
"""

from __future__ import annotations

import json

import numpy as np

from rpcsrv.loader.examplejson import ExampleJSONModule
from rpcsrv.loader.opset import OPS

from .codegens import Codegen, External
from .onnx_import import ONNX_DOMAINS, Graph, Node, TensorInfo
from .ops import Op, consumers, single_op
from .partition import Function

COMPILER = "examplejson"
#: the int8 ops that are quantized composites (the QDQ fold made them: conv/dense, bias, requantize)
QNN_COMPOSITES = {"q_linear_conv": "qnn_conv2d", "q_gemm": "qnn_dense", "q_linear_matmul": "qnn_dense"}


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


# ------------------------------------------------------------- the composite table (MergeComposite)

def _fusable(first: Node, second: Node, uses: dict) -> bool:
    """``second`` reads ``first``'s only output, which nothing else uses."""
    return (len(first.outputs) == 1 and uses.get(first.outputs[0]) == 1
            and first.outputs[0] in second.inputs and first.domain in ONNX_DOMAINS
            and second.domain in ONNX_DOMAINS)


def _fused_activation(kernel: str, act: Node, ops: frozenset, graph: Graph) -> tuple | None:
    """(kernel name, attrs or None) of ``act`` fused into ``kernel``: Relu; Clip with constant scalar bounds
    (ReLU6 of mobile networks, as ``clip`` with ``min``/``max``); HardSwish; Swish (SiLU, from
    ``fuse.fuse_swish``).  None: not fusable."""
    if kernel not in OPS or "activation" not in OPS[kernel].attrs:
        return None
    name = {"Relu": "relu", "Clip": "clip", "HardSwish": "hard_swish", "Swish": "swish"}.get(act.op_type)
    if name is None or name not in ops or (name != "clip" and act.attrs):
        return None
    if name != "clip":
        return name, None
    bounds = {k: act.attrs[k] for k in ("min", "max") if k in act.attrs}  # opset 6: attributes
    for key, tensor in zip(("min", "max"), act.inputs[1:3]):
        if tensor:
            value = graph.constants.get(tensor)
            if value is None or value.size != 1:
                return None
            bounds[key] = float(value.reshape(-1)[0])
    return name, bounds


def _dense_bias(mm: Node, add: Node, graph: Graph) -> list[str] | None:
    """Gemm inputs for MatMul(A, B) → Add(bias): 2-D A and B, a constant bias that broadcasts."""
    bias = [i for i in add.inputs if i != mm.outputs[0]]
    if len(add.inputs) != 2 or len(bias) != 1 or bias[0] not in graph.constants:
        return None
    a, b = (graph.tensors.get(x) for x in mm.inputs)
    c = graph.tensors.get(bias[0])
    if a is None or b is None or c is None or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if not a.dtype == b.dtype == c.dtype or c.dtype not in ("float32", "float64", "float16"):
        return None
    m, n = a.shape[0], b.shape[1]
    padded = (1,) * (2 - len(c.shape)) + c.shape
    if len(c.shape) > 2 or any(d not in (1, want) for d, want in zip(padded, (m, n))):
        return None
    return [mm.inputs[0], mm.inputs[1], bias[0]]


def _matmul_bias(mm: Node, add: Node, graph: Graph) -> list[str] | None:
    """MatMul inputs + bias for MatMul(A, B) → Add(constant) when the operands are not both 2-D
    (a transformer's (1, seq, width) @ (width, n) projections): the ``matmul`` kernel adds its
    optional third input in place.  The constant must broadcast onto the product without growing it.
    """
    bias = [i for i in add.inputs if i != mm.outputs[0]]
    if len(add.inputs) != 2 or len(bias) != 1 or bias[0] not in graph.constants:
        return None
    y, c = graph.tensors.get(mm.outputs[0]), graph.tensors.get(bias[0])
    out = graph.tensors.get(add.outputs[0])
    if y is None or c is None or out is None or out.shape != y.shape or not y.shape:
        return None
    if not y.dtype == c.dtype == out.dtype or c.dtype not in ("float32", "float64", "float16"):
        return None
    if len(c.shape) > len(y.shape) or any(d not in (1, want) for d, want in
                                          zip(reversed(c.shape), reversed(y.shape))):
        return None
    return [mm.inputs[0], mm.inputs[1], bias[0]]


def _conv_bias(conv: Node, add: Node, graph: Graph) -> list[str] | None:
    """Conv inputs for Conv(X, W) → Add(per-channel constant), as PyTorch exports often write it.

    The constant must broadcast as ``(1, C, 1, ...)`` over the output; it is added to the graph's
    constants reshaped to ``(C,)``, the layout of Conv's bias input.
    """
    if len(conv.inputs) > 2 and conv.inputs[2] or len(add.inputs) != 2:
        return None
    other = [i for i in add.inputs if i != conv.outputs[0]]
    out, w = graph.tensors.get(conv.outputs[0]), graph.tensors.get(conv.inputs[1])
    if len(other) != 1 or other[0] not in graph.constants or out is None or w is None:
        return None
    bias = graph.constants[other[0]]
    channels = w.shape[0]
    padded = (1,) * (len(out.shape) - bias.ndim) + tuple(bias.shape)
    if bias.ndim > len(out.shape) or bias.dtype.name != out.dtype or \
            padded != (1, channels) + (1,) * (len(out.shape) - 2):
        return None
    name = f"{other[0]}__conv_bias"
    graph.constants[name] = bias.reshape(channels)
    graph.tensors[name] = TensorInfo((channels,), out.dtype)
    return [conv.inputs[0], conv.inputs[1], name]


def merge_composites(graph: Graph, ops: frozenset) -> list[Op]:
    """Apply the pattern table; returns the ops in execution order.

    (A fused Conv → Add(bias) adds the reshaped bias to ``graph.constants``.)
    """
    uses = consumers(graph)
    consumer_of: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumer_of.setdefault(i, []).append(n)
    done: set[int] = set()
    result: list[Op] = []

    def next_node(node: Node) -> Node | None:
        users = consumer_of.get(node.outputs[0], []) if node.outputs else []
        return users[0] if len(users) == 1 and _fusable(node, users[0], uses) else None

    for node in graph.nodes:
        if id(node) in done:
            continue
        op = single_op(node)
        nxt = next_node(node)
        if node.op_type == "MatMul" and nxt is not None and nxt.op_type == "Add" \
                and {"matmul", "add"} <= ops and "gemm" in OPS:
            gemm_inputs = _dense_bias(node, nxt, graph)
            mm_inputs = None if gemm_inputs is not None else _matmul_bias(node, nxt, graph)
            if gemm_inputs is not None or mm_inputs is not None:
                kernel = "gemm" if gemm_inputs is not None else "matmul"
                op = Op(f"{node.name}+{nxt.name}", kernel, gemm_inputs or mm_inputs, list(nxt.outputs), {},
                        [node, nxt], f"{COMPILER}.dense_bias", requires={"matmul", "add"})
                done.add(id(nxt))
                nxt = next_node(nxt)
        if node.op_type == "Conv" and nxt is not None and nxt.op_type == "Add" and {"conv", "add"} <= ops:
            conv_inputs = _conv_bias(node, nxt, graph)
            if conv_inputs is not None:
                op = Op(f"{node.name}+{nxt.name}", "conv", conv_inputs, list(nxt.outputs), dict(node.attrs),
                        [node, nxt], f"{COMPILER}.conv2d_bias", requires={"conv", "add"})
                done.add(id(nxt))
                nxt = next_node(nxt)
        fused = _fused_activation(op.kernel, nxt, ops, graph) if nxt is not None else None
        if node.op_type in ("Conv", "Gemm", "MatMul", "BatchNormalization", "Add", "Sum") and fused \
                and op.requires <= ops:
            base = {"Conv": "conv2d_bias" if op.pattern or len(node.inputs) > 2 and node.inputs[2] else "conv2d",
                    "Gemm": "dense_bias", "MatMul": "dense_bias" if op.pattern else "dense",
                    "BatchNormalization": "batch_norm", "Add": "add", "Sum": "sum"}
            act, act_attrs = fused
            attrs = {**op.attrs, "activation": act, **({"activation_attrs": act_attrs} if act_attrs else {})}
            op = Op(f"{op.name}+{nxt.name}", op.kernel, op.inputs, list(nxt.outputs), attrs, op.nodes + [nxt],
                    f"{COMPILER}.{base[node.op_type]}_{act}", requires=op.requires | {act})
            done.add(id(nxt))
        result.append(op)
    for op in result:
        if op.kernel in QNN_COMPOSITES and not op.pattern:
            act = op.attrs.get("activation")
            op.pattern = f"{COMPILER}.{QNN_COMPOSITES[op.kernel]}" + (f"_{act}" if act else "")
    return merge_shuffles(result, graph, uses) if {"reshape", "transpose", "conv"} <= ops else result


def _shuffle_groups(r1: Op, t: Op, r2: Op, graph: Graph) -> int:
    """g when Reshape (N, C, S...) → (N, g, C/g, S...), Transpose swapping axes 1 and 2, Reshape back to
    (N, C, S...) shuffle the channels in g groups (ShuffleNet's channel shuffle); else 0."""
    if r1.kernel != "reshape" or t.kernel != "transpose" or r2.kernel != "reshape" or r1.pattern or \
            t.pattern or r2.pattern:
        return 0
    shapes = [graph.tensors.get(name) for name in (r1.inputs[0], r1.outputs[0], t.outputs[0], r2.outputs[0])]
    if any(info is None for info in shapes):
        return 0
    x, split, swapped, back = (info.shape for info in shapes)
    if len(x) < 3 or back != x or len(split) != len(x) + 1 or split[0] != x[0] or split[3:] != x[2:]:
        return 0
    g, cg = split[1], split[2]
    perm = [0, 2, 1] + list(range(3, len(split)))
    if g * cg != x[1] or g < 2 or swapped != (x[0], cg, g) + tuple(x[2:]) or list(t.attrs.get("perm") or []) != perm:
        return 0
    return int(g)


def merge_shuffles(ops: list[Op], graph: Graph, uses: dict) -> list[Op]:
    """A channel shuffle (``_shuffle_groups``) read by a Conv alone becomes that Conv's ``input_shuffle``
    attribute (``examplejson.shuffle_conv2d``): two reshapes and a transpose fewer per ShuffleNet unit,
    and a depthwise conv shuffles in the layout copy it makes anyway (no copy of its own)."""
    producer = {o: op for op in ops for o in op.outputs if o}
    merged: set[int] = set()
    for conv in ops:
        if conv.kernel != "conv" or "input_shuffle" in conv.attrs or conv.nodes[0].op_type != "Conv":
            continue
        chain = [conv]
        for _ in range(3):  # back through the second Reshape, the Transpose and the first Reshape
            before = producer.get(chain[0].inputs[0]) if chain[0].inputs else None
            if before is None or len(before.outputs) != 1 or uses.get(before.outputs[0]) != 1 or \
                    before.outputs[0] in chain[0].inputs[1:]:
                break
            chain.insert(0, before)
        if len(chain) != 4:
            continue
        g = _shuffle_groups(*chain[:3], graph)
        if not g:
            continue
        r1 = chain[0]
        base = conv.pattern.split(".")[-1] if conv.pattern else "conv2d"
        conv.name = "+".join(op.name for op in chain)
        conv.inputs = [r1.inputs[0]] + conv.inputs[1:]
        conv.attrs = {**conv.attrs, "input_shuffle": g}
        conv.nodes = [n for op in chain for n in op.nodes]
        conv.pattern = f"{COMPILER}.shuffle_{base}"
        conv.requires = conv.requires | {"reshape", "transpose"}
        merged.update(id(op) for op in chain[:3])
    return [op for op in ops if id(op) not in merged]


# ------------------------------------------------------------------------------------ the codegen

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
