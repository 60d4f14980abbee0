"""The fold of QDQ chains into int8 ops: one declaration of what a chain is, for every graph that has them.

onnxruntime's QDQ format (``quantize_static(..., quant_format=QDQ)``) keeps float ops and wraps them:
``DequantizeLinear`` on each quantized operand, the float op, ``QuantizeLinear`` on its result.  A chain

    DQ(x), DQ(w) [, DQ(bias) or a float bias] -> Conv [-> Relu | Clip] -> Q

computes what one int8 op computes (``q_linear_conv`` with a fused activation), and so do Gemm, MatMul,
Add, Mul, Concat, the average pools, Sigmoid, LeakyRelu and Softmax (:data:`FOLDS`).  Ops that only move
or select values (MaxPool, Reshape, Transpose, ...: :data:`PASS_THROUGH`) run on the integers themselves
when the chain's Q has its DQ's parameters.  The client's compiler folds the chains of the graphs it
imports, so that codegens see int8 ops; the board folds what a library's ExampleJSON subgraphs still
hold when it loads them.  Both call :func:`fold_qdq` on their own graph through :class:`QNode`.

A chain is folded only when every scale and zero point it reads is constant, activations and results are
quantized per tensor (weights per tensor or per output channel), the float op's result and its
activation's are read by the next node of the chain alone (and are no graph output), and the Q writes
int8 or uint8 with ONNX's rounding (``saturate`` 1, no ``block_size``).  Anything else stays as it is: its
DQ and Q nodes run as themselves, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from .quant import QTYPES, QuantParams

#: float op -> its int8 op (``fold_qdq`` builds the inputs: ``_BUILDERS``)
FOLDS = {"conv": "q_linear_conv", "matmul": "q_linear_matmul", "gemm": "q_gemm", "add": "q_linear_add",
         "mul": "q_linear_mul", "concat": "q_linear_concat",
         "global_average_pool": "q_linear_global_average_pool", "average_pool": "q_linear_average_pool",
         "sigmoid": "q_linear_sigmoid", "leaky_relu": "q_linear_leaky_relu", "softmax": "q_linear_softmax"}
#: int8 ops whose result a trailing Relu or Clip folds into (a clamp of the output)
ACTIVATED = {"q_linear_conv", "q_linear_matmul", "q_gemm", "q_linear_add", "q_linear_mul"}
#: ops that compute the same on the integers as on the values they stand for, when input and output share
#: their parameters: the DQ'd data is input 0, the other inputs (shapes, axes, indices) are not quantized
PASS_THROUGH = frozenset({"max_pool", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "identity",
                          "depth_to_space", "space_to_depth", "slice", "gather", "expand", "tile"})


@dataclass
class QNode:
    """What the fold reads of one node: its op's name in the language (``ops.py``), its inputs and
    outputs (references to tensors: names, IDs; a falsy reference is an absent input), its attributes."""

    op: str
    inputs: Sequence[Any]
    outputs: Sequence[Any]
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Fold:
    """One chain made one node: ``node`` takes the place of ``replace[-1]`` (the chain's Q: it writes the
    Q's outputs) and the nodes of ``replace`` go; the DQ nodes of ``drop`` go too (nothing else reads them);
    ``constants`` are new constant tensors ``node`` reads (reference -> array)."""

    replace: list[int]
    drop: list[int]
    node: QNode
    constants: dict = field(default_factory=dict)


class _Graph:
    def __init__(self, nodes: Sequence[QNode], value: Callable[[Any], Any], keep: Iterable[Any],
                 new_ref: Callable[[str, np.ndarray], Any], opset: int):
        self.nodes, self.value, self.keep, self.new_ref, self.opset = nodes, value, set(keep), new_ref, opset
        self.producer: dict[Any, int] = {}
        self.readers: dict[Any, list[int]] = {}
        for k, n in enumerate(nodes):
            for o in n.outputs:
                if o:
                    self.producer[o] = k
            for i in n.inputs:
                if i:
                    self.readers.setdefault(i, []).append(k)
        self.constants: dict[Any, np.ndarray] = {}

    def sole_reader(self, ref: Any) -> Optional[int]:
        readers = self.readers.get(ref, [])
        return readers[0] if len(readers) == 1 and ref not in self.keep else None

    def const(self, ref: Any) -> Optional[np.ndarray]:
        if not ref:
            return None
        v = self.value(ref)
        return None if v is None else np.asarray(v)

    def dq(self, ref: Any) -> Optional[tuple[int, QuantParams]]:
        """The DQ node that makes ``ref`` and its parameters, when they are constant and it is no blocked DQ."""
        k = self.producer.get(ref)
        if k is None:
            return None
        n = self.nodes[k]
        if n.op != "dequantize_linear" or n.attrs.get("block_size", 0) or len(n.inputs) < 2:
            return None
        params = self.params(n.inputs[1], n.inputs[2] if len(n.inputs) > 2 else None, n.attrs.get("axis", 1))
        return None if params is None else (k, params)

    def params(self, scale_ref: Any, zp_ref: Any, axis: int) -> Optional[QuantParams]:
        scale = self.const(scale_ref)
        zp = self.const(zp_ref) if zp_ref else None
        if scale is None or (zp_ref and zp is None) or (zp is not None and zp.dtype not in QTYPES):
            return None
        try:
            return QuantParams.of(scale, zp, axis)
        except ValueError:
            return None

    def zero_point_ref(self, dq_node: QNode, params: QuantParams) -> Any:
        """The DQ's zero-point input, or a new constant 0 of its type where it has none."""
        if len(dq_node.inputs) > 2 and dq_node.inputs[2]:
            return dq_node.inputs[2]
        return self.add_constant("zero_point", np.zeros((), params.dtype))

    def add_constant(self, hint: str, array: np.ndarray) -> Any:
        ref = self.new_ref(hint, array)
        self.constants[ref] = array
        return ref


def fold_qdq(nodes: Sequence[QNode], value: Callable[[Any], Any], keep: Iterable[Any] = (),
             new_ref: Optional[Callable[[str, np.ndarray], Any]] = None, opset: int = 13) -> list[Fold]:
    """The chains of ``nodes`` (in execution order) to fold, each independent of the others.

    ``value(ref)``: the array of a constant tensor, None for any other; ``keep``: references that must
    stay computed as they are (the graph's outputs); ``new_ref(hint, array)``: a fresh reference for a
    new constant (a quantized bias, a zero point a DQ left out), None to fold only chains that need none;
    ``opset``: the model's ONNX opset (Softmax's axis semantics)."""
    g = _Graph(nodes, value, keep, new_ref or _no_new_refs, opset)
    folds: list[Fold] = []
    taken: set[int] = set()
    for k, n in enumerate(nodes):
        if n.op not in FOLDS and n.op not in PASS_THROUGH:
            continue
        chain = _chain(g, k)
        if chain is None or taken & set(chain[0]):
            continue
        replace, act, q_params, q_node = chain
        before = dict(g.constants)
        try:
            built = _pass_through(g, n, q_params) if n.op in PASS_THROUGH else \
                _BUILDERS[n.op](g, n, q_node, q_params, act)
        except _NoNewRefs:
            built = None
        if built is None:
            g.constants = before
            continue
        op, inputs, attrs, dqs = built
        out = QNode(op, list(inputs), list(q_node.outputs), attrs)
        new = {r: g.constants[r] for r in g.constants if r not in before}
        folds.append(Fold(replace, [], out, new))
        taken.update(replace)
        folds[-1].drop = dqs  # candidates, settled below
    _settle_drops(g, folds)
    return folds


class _NoNewRefs(Exception):
    pass


def _no_new_refs(hint: str, array: np.ndarray) -> Any:
    raise _NoNewRefs(hint)


def _chain(g: _Graph, k: int) -> Optional[tuple[list[int], Optional[QNode], QuantParams, QNode]]:
    """``([float op, activation?, Q], activation, Q's parameters, Q)`` of the chain the float op at ``k``
    starts, or None."""
    n = g.nodes[k]
    if len([o for o in n.outputs if o]) != 1 or not n.outputs[0]:
        return None
    replace = [k]
    at = g.sole_reader(n.outputs[0])
    act = None
    if at is not None and g.nodes[at].op in ("relu", "clip") and FOLDS.get(n.op) in ACTIVATED:
        act = g.nodes[at]
        replace.append(at)
        at = g.sole_reader(act.outputs[0])
    if at is None:
        return None
    q = g.nodes[at]
    if q.op != "quantize_linear" or q.attrs.get("block_size", 0) or q.attrs.get("saturate", 1) != 1 \
            or q.inputs[0] != g.nodes[replace[-1]].outputs[0] or len(q.inputs) < 2:
        return None
    params = g.params(q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else None, q.attrs.get("axis", 1))
    if params is None or params.per_channel or params.dtype == np.dtype(np.int32):
        return None
    if q.attrs.get("output_dtype", 0) not in (0, None) and len(q.inputs) < 3:
        return None  # a type chosen by the attribute alone: no zero point to carry it
    replace.append(at)
    return replace, act, params, q


def _activation(g: _Graph, act: Optional[QNode]) -> Optional[dict]:
    """The fused activation's attributes (``activation``/``activation_attrs``), {} for none, None when its
    bounds are not constant."""
    if act is None:
        return {}
    if act.op == "relu":
        return {"activation": "relu"}
    bounds = {}
    for name, k in (("min", 1), ("max", 2)):
        if len(act.inputs) > k and act.inputs[k]:
            v = g.const(act.inputs[k])
            if v is None or v.size != 1:
                return None
            bounds[name] = float(v.reshape(()))
        elif name in act.attrs:  # Clip-6's attributes
            bounds[name] = float(act.attrs[name])
    return {"activation": "clip", "activation_attrs": bounds}


def _operand(g: _Graph, ref: Any, per_channel_axis: Optional[int] = None) -> Optional[tuple[int, QNode, QuantParams]]:
    """A DQ'd int8/uint8 operand, per tensor (or per channel along ``per_channel_axis`` of its tensor)."""
    found = g.dq(ref)
    if found is None:
        return None
    k, params = found
    if params.dtype == np.dtype(np.int32):
        return None
    if params.per_channel:
        node = g.nodes[k]
        data = g.const(node.inputs[0])
        if per_channel_axis is None or data is None or params.axis % data.ndim != per_channel_axis % data.ndim:
            return None
    return k, g.nodes[k], params


def _triple(g: _Graph, operand: tuple[int, QNode, QuantParams]) -> list:
    _k, node, params = operand
    return [node.inputs[0], node.inputs[1], g.zero_point_ref(node, params)]


def _bias(g: _Graph, ref: Any, scale: np.ndarray) -> tuple[Optional[Any], list[int]]:
    """An int32 bias of ``scale`` (the product of the operands' scales, per channel or not) for the float
    bias ``ref``: the DQ's own int32 tensor when it is quantized so already, else a new constant; the
    DQ's index for dropping.  ``(None, [])`` when the bias is not constant."""
    if not ref:
        return "", []
    found = g.dq(ref)
    if found is not None:
        k, params = found
        q = g.const(g.nodes[k].inputs[0])
        if q is None:
            return None, []
        real = (q.astype(np.float64) - params.zero_point.astype(np.float64)) * params.scale.astype(np.float64)
        same_scale = params.scale.size in (1, scale.size) and bool(np.all(params.scale.reshape(-1) == scale))
        if params.dtype == np.dtype(np.int32) and not np.any(params.zero_point) and same_scale:
            return g.nodes[k].inputs[0], [k]
        dq = [k]
    else:
        real = g.const(ref)
        if real is None:
            return None, []
        dq = []
    bias = np.clip(np.rint(np.asarray(real, np.float64) / scale.astype(np.float64)), -2 ** 31, 2 ** 31 - 1)
    return g.add_constant("bias", bias.astype(np.int32)), dq


def _conv(g, n, q, y, act):
    x = _operand(g, n.inputs[0])
    w = _operand(g, n.inputs[1], per_channel_axis=0)
    fused = _activation(g, act)
    if x is None or w is None or fused is None or x[2].per_channel:
        return None
    scale = (x[2].scale * w[2].scale).astype(np.float32)
    b, dq = _bias(g, n.inputs[2] if len(n.inputs) > 2 else "", np.atleast_1d(scale))
    if b is None:
        return None
    inputs = _triple(g, x) + _triple(g, w) + [q.inputs[1], _out_zero_point(g, q, y)] + ([b] if b else [])
    return "q_linear_conv", inputs, {**n.attrs, **fused}, [x[0], w[0], *dq]


def _matmul(g, n, q, y, act):
    a = _operand(g, n.inputs[0])
    b = _operand(g, n.inputs[1], per_channel_axis=-1)
    fused = _activation(g, act)
    if a is None or b is None or fused is None or a[2].per_channel:
        return None
    return "q_linear_matmul", _triple(g, a) + _triple(g, b) + [q.inputs[1], _out_zero_point(g, q, y)], \
        {**n.attrs, **fused}, [a[0], b[0]]


def _gemm(g, n, q, y, act):
    attrs = dict(n.attrs)
    trans_b = int(attrs.get("transB", 0))
    a = _operand(g, n.inputs[0])
    b = _operand(g, n.inputs[1], per_channel_axis=0 if trans_b else 1)
    fused = _activation(g, act)
    if a is None or b is None or fused is None or a[2].per_channel:
        return None
    alpha, beta = float(attrs.pop("alpha", 1.0)), float(attrs.pop("beta", 1.0))
    scale = (np.float32(alpha / beta) * a[2].scale * b[2].scale).astype(np.float32)
    c, dq = _bias(g, n.inputs[2] if len(n.inputs) > 2 else "", np.atleast_1d(scale))
    if c is None:
        return None
    inputs = _triple(g, a) + _triple(g, b) + [c, q.inputs[1], _out_zero_point(g, q, y)]
    return "q_gemm", inputs, {**attrs, "alpha": alpha, **fused}, [a[0], b[0], *dq]


def _binary(g, n, q, y, act):
    a, b = _operand(g, n.inputs[0]), _operand(g, n.inputs[1])
    fused = _activation(g, act)
    if a is None or b is None or fused is None or a[2].per_channel or b[2].per_channel:
        return None
    return FOLDS[n.op], _triple(g, a) + _triple(g, b) + [q.inputs[1], _out_zero_point(g, q, y)], \
        {**n.attrs, **fused}, [a[0], b[0]]


def _concat(g, n, q, y, _act):
    operands = [_operand(g, r) for r in n.inputs]
    if not operands or any(o is None or o[2].per_channel for o in operands):
        return None
    inputs = [q.inputs[1], _out_zero_point(g, q, y)]
    for o in operands:
        inputs += _triple(g, o)
    return "q_linear_concat", inputs, dict(n.attrs), [o[0] for o in operands]


def _unary(g, n, q, y, _act):
    x = _operand(g, n.inputs[0])
    if x is None or x[2].per_channel:
        return None
    attrs = dict(n.attrs)
    if n.op == "average_pool" and any(d != 1 for d in attrs.pop("dilations", None) or []):
        return None
    if n.op == "softmax":
        attrs["opset"] = g.opset
    return FOLDS[n.op], _triple(g, x) + [q.inputs[1], _out_zero_point(g, q, y)], attrs, [x[0]]


def _pass_through(g: _Graph, n: QNode, y: QuantParams):
    x = _operand(g, n.inputs[0])
    if x is None or not x[2].same_as(y) or (n.op == "max_pool" and len([o for o in n.outputs if o]) != 1):
        return None
    return n.op, [x[1].inputs[0], *n.inputs[1:]], dict(n.attrs), [x[0]]


def _out_zero_point(g: _Graph, q: QNode, params: QuantParams) -> Any:
    if len(q.inputs) > 2 and q.inputs[2]:
        return q.inputs[2]
    return g.add_constant("zero_point", np.zeros((), params.dtype))


_BUILDERS: dict[str, Callable] = {"conv": _conv, "matmul": _matmul, "gemm": _gemm, "add": _binary,
                                  "mul": _binary, "concat": _concat}
for _op in ("global_average_pool", "average_pool", "sigmoid", "leaky_relu", "softmax"):
    _BUILDERS[_op] = _unary


def _settle_drops(g: _Graph, folds: list[Fold]) -> None:
    """Keep in each fold's ``drop`` only the DQ nodes whose outputs nothing reads once every fold is made
    (a DQ may feed several chains, and other nodes)."""
    gone = {k for f in folds for k in f.replace}
    candidates = {k for f in folds for k in f.drop}
    dead = set()
    for k in candidates:
        outs = [o for o in g.nodes[k].outputs if o]
        if all(o not in g.keep and all(r in gone for r in g.readers.get(o, [])) for o in outs):
            dead.add(k)
    seen: set[int] = set()
    for f in folds:
        f.drop = [k for k in dict.fromkeys(f.drop) if k in dead and k not in seen]
        seen.update(f.drop)

