"""Host C for the heavier ops a vendor's accelerator most often lacks: Gemm, MatMul,
BatchNormalization, LayerNormalization, Gather and Resize (see :mod:`.hostgen` for the calling
convention every host function follows).

Each op is one :class:`HostOp` row of :data:`HOST_OPS`: which of the node's inputs the function takes
at run time (the rest, such as Resize's scales, are compiled in), why a node cannot be compiled
(attributes or shapes the C does not implement), and the C statements of the body.  Everything that
depends on shapes alone (batch offsets of a broadcast MatMul, Resize's source rows and weights) is
worked out here in Python, so that the C stays a few plain loops over static tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .onnx_import import Graph


def numel(shape) -> int:
    return int(math.prod(shape))


def c_number(v: float) -> str:
    return repr(float(v))


def int_table(name: str, values) -> str:
    vals = ", ".join(str(int(v)) for v in values) or "0"
    return f"  static const int64_t {name}[] = {{{vals}}};"


def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def binary_loop(expr: str, ins, graph: Graph, oshape, o: str) -> list[str]:
    """The loop of an element-wise two-input op with numpy broadcasting: ``expr`` of ``a`` and ``b`` (read
    as double for floating inputs, int64 otherwise) stored to ``o[i]``."""
    n = numel(oshape)
    shapes = [graph.tensors[t].shape for t in ins]
    if all(tuple(s) == tuple(oshape) for s in shapes):
        return [f"  for (int64_t i = 0; i < {n}; ++i) {{ {_ctype_math(graph, ins)} a = v0[i], b = v1[i]; "
                f"{o}[i] = {expr}; }}"]
    rank = len(oshape)
    lines = [int_table("oshape", oshape or [1])]
    for k, s in enumerate(shapes):
        padded = (1,) * (rank - len(s)) + tuple(s)
        st = strides(padded)
        lines.append(int_table(f"s{k}", [0 if d == 1 else st[j] for j, d in enumerate(padded)] or [0]))
    lines += [f"  for (int64_t i = 0; i < {n}; ++i) {{",
              "    int64_t r = i, p0 = 0, p1 = 0;",
              f"    for (int d = {rank - 1}; d >= 0; --d) {{ int64_t c = r % oshape[d]; r /= oshape[d]; "
              "p0 += c * s0[d]; p1 += c * s1[d]; }",
              f"    {_ctype_math(graph, ins)} a = v0[p0], b = v1[p1]; {o}[i] = {expr};", "  }"]
    return lines


def _ctype_math(graph: Graph, ins) -> str:
    return "double" if graph.tensors[ins[0]].dtype in ("float32", "float64") else "int64_t"


def _reals(name: str, values) -> str:
    vals = ", ".join(repr(float(v)) for v in values) or "0"
    return f"  static const double {name}[] = {{{vals}}};"


def _attr(node, name: str, default):
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class HostOp:
    """One op's host C: ``inputs(node, graph)`` the run-time tensors, ``reason(node, graph)`` why not
    ("" when it can), ``body(node, ins, out, graph, o)`` the C statements (``v0``.. the inputs, ``o``
    the output pointer)."""

    attrs: frozenset
    inputs: Callable
    reason: Callable
    body: Callable


def _present(node, graph: Graph) -> list[str]:
    return [t for t in node.inputs if t]


def _shape(graph: Graph, name: str) -> list[int]:
    return list(graph.tensors[name].shape)


# Gemm: Y = alpha * A' B' + beta * C

def _gemm_reason(node, graph: Graph) -> str:
    a, b = (_shape(graph, t) for t in node.inputs[:2])
    if len(a) != 2 or len(b) != 2:
        return "Gemm needs 2-D A and B"
    if len(node.inputs) > 2 and node.inputs[2] and len(_shape(graph, node.inputs[2])) > 2:
        return "Gemm's C must broadcast to (M, N)"
    return ""


def _gemm_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    a, b = _shape(graph, ins[0]), _shape(graph, ins[1])
    ta, tb = int(_attr(node, "transA", 0)), int(_attr(node, "transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    alpha, beta = c_number(_attr(node, "alpha", 1.0)), c_number(_attr(node, "beta", 1.0))
    ai = f"k * {m} + i" if ta else f"i * {k} + k"
    bi = f"j * {k} + k" if tb else f"k * {n} + j"
    bias = ""
    if len(ins) > 2:
        c = [1] * (2 - len(_shape(graph, ins[2]))) + _shape(graph, ins[2])
        si, sj = (0 if c[0] == 1 else c[1]), (0 if c[1] == 1 else 1)
        bias = f" + {beta} * v2[i * {si} + j * {sj}]"
    return [f"  for (int64_t i = 0; i < {m}; ++i) for (int64_t j = 0; j < {n}; ++j) {{",
            "    double acc = 0;",
            f"    for (int64_t k = 0; k < {k}; ++k) acc += (double)v0[{ai}] * v1[{bi}];",
            f"    {o}[i * {n} + j] = {alpha} * acc{bias};", "  }"]


# MatMul: numpy's matmul, batch dimensions broadcast

def _matmul_dims(graph: Graph, ins):
    a, b = _shape(graph, ins[0]), _shape(graph, ins[1])
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    return a2, b2


def _matmul_reason(node, graph: Graph) -> str:
    a, b = _matmul_dims(graph, node.inputs)
    if a[-1] != b[-2]:
        return "MatMul's inner dimensions differ"
    return ""


def batch_offsets(shape, batch, step: int) -> list[int]:
    """Offset of each (broadcast) batch entry's matrix in a tensor of batch dims ``shape``."""
    padded = [1] * (len(batch) - len(shape)) + list(shape)
    index = np.arange(numel(padded)).reshape(padded) if padded else np.array(0)
    return (np.broadcast_to(index, batch).reshape(-1) * step).tolist()


def _matmul_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    a, b = _matmul_dims(graph, ins)
    m, k, n = a[-2], a[-1], b[-1]
    batch = list(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    nb = numel(batch)
    return [int_table("offa", batch_offsets(a[:-2], batch, m * k)),
            int_table("offb", batch_offsets(b[:-2], batch, k * n)),
            f"  for (int64_t p = 0; p < {nb}; ++p) for (int64_t i = 0; i < {m}; ++i) "
            f"for (int64_t j = 0; j < {n}; ++j) {{",
            "    double acc = 0;",
            f"    for (int64_t k = 0; k < {k}; ++k) acc += (double)v0[offa[p] + i * {k} + k] * "
            f"v1[offb[p] + k * {n} + j];",
            f"    {o}[(p * {m} + i) * {n} + j] = acc;", "  }"]


# BatchNormalization (inference) and LayerNormalization

def _bn_reason(node, graph: Graph) -> str:
    if int(_attr(node, "training_mode", 0)):
        return "BatchNormalization in training mode has no host implementation"
    if not int(_attr(node, "spatial", 1)):
        return "BatchNormalization with spatial=0 has no host implementation"
    if len(_shape(graph, node.inputs[0])) < 2:
        return "BatchNormalization needs a channel axis"
    return ""


def _bn_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    shape = _shape(graph, ins[0])
    channels, inner = shape[1], numel(shape[2:])
    eps = c_number(_attr(node, "epsilon", 1e-5))
    return [f"  for (int64_t p = 0; p < {shape[0]}; ++p) for (int64_t c = 0; c < {channels}; ++c) {{",
            f"    double s = v1[c] / sqrt((double)v4[c] + {eps}), t = v2[c] - v3[c] * s;",
            f"    int64_t base = (p * {channels} + c) * {inner};",
            f"    for (int64_t i = 0; i < {inner}; ++i) {o}[base + i] = v0[base + i] * s + t;", "  }"]


def _ln_reason(node, graph: Graph) -> str:
    shape = _shape(graph, node.inputs[0])
    axis = int(_attr(node, "axis", -1)) % len(shape)
    inner = numel(shape[axis:])
    for t in _present(node, graph)[1:]:
        if numel(_shape(graph, t)) != inner:
            return "LayerNormalization's scale and bias must cover the normalized dims (no broadcasting)"
    return ""


def _ln_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    shape = _shape(graph, ins[0])
    axis = int(_attr(node, "axis", -1)) % len(shape)
    outer, inner = numel(shape[:axis]), numel(shape[axis:])
    eps = c_number(_attr(node, "epsilon", 1e-5))
    bias = " + v2[i]" if len(ins) > 2 else ""
    return [f"  for (int64_t p = 0; p < {outer}; ++p) {{",
            f"    const __typeof__(*v0)* x = v0 + p * {inner}; double mean = 0, var = 0;",
            f"    for (int64_t i = 0; i < {inner}; ++i) mean += x[i];",
            f"    mean /= {inner};",
            f"    for (int64_t i = 0; i < {inner}; ++i) var += (x[i] - mean) * (x[i] - mean);",
            f"    double inv = 1.0 / sqrt(var / {inner} + {eps});",
            f"    for (int64_t i = 0; i < {inner}; ++i) {o}[p * {inner} + i] = (x[i] - mean) * inv * v1[i]{bias};",
            "  }"]


# Gather: numpy's take along one axis, indices checked at run time

def _gather_reason(node, graph: Graph) -> str:
    if graph.tensors[node.inputs[1]].dtype not in ("int32", "int64"):
        return "Gather's indices must be int32 or int64"
    return ""


def _gather_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    data = _shape(graph, ins[0])
    axis = int(_attr(node, "axis", 0)) % len(data)
    outer, size, inner = numel(data[:axis]), data[axis], numel(data[axis + 1:])
    count = numel(_shape(graph, ins[1]))
    return [f"  for (int64_t p = 0; p < {outer}; ++p) for (int64_t j = 0; j < {count}; ++j) {{",
            f"    int64_t at = v1[j] < 0 ? v1[j] + {size} : v1[j];",
            f"    if (at < 0 || at >= {size}) {{ TVMAPISetLastError(\"Gather: index out of range\"); return -1; }}",
            f"    memcpy((void*)({o} + (p * {count} + j) * {inner}), v0 + (p * {size} + at) * {inner}, "
            f"{inner} * sizeof(*v0));", "  }"]


# Resize: 2-D nearest or (bi)linear on NCHW, source rows/columns and weights precomputed

RESIZE_COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = {"round_prefer_floor": lambda x: math.ceil(x - 0.5), "round_prefer_ceil": lambda x: math.floor(x + 0.5),
           "floor": math.floor, "ceil": math.ceil}


def _resize_inputs(node, graph: Graph) -> list[str]:
    return [node.inputs[0]]


def _resize_scales(node, graph: Graph) -> list[float]:
    ishape, oshape = _shape(graph, node.inputs[0]), _shape(graph, node.outputs[0])
    given = node.inputs[2] if len(node.inputs) > 2 else ""
    if given and given in graph.constants and np.asarray(graph.constants[given]).size:
        return [float(s) for s in np.asarray(graph.constants[given]).reshape(-1)]
    return [o / i for o, i in zip(oshape, ishape)]


def _resize_reason(node, graph: Graph) -> str:
    mode = _attr(node, "mode", "nearest")
    coord = _attr(node, "coordinate_transformation_mode", "half_pixel")
    ishape, oshape = _shape(graph, node.inputs[0]), _shape(graph, node.outputs[0])
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r} has no host implementation (nearest, linear)"
    if coord not in RESIZE_COORDS:
        return f"Resize coordinate_transformation_mode {coord!r} has no host implementation"
    if mode == "nearest" and _attr(node, "nearest_mode", "round_prefer_floor") not in NEAREST:
        return "Resize nearest_mode has no host implementation"
    if int(_attr(node, "antialias", 0)) or int(_attr(node, "exclude_outside", 0)) \
            or _attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch" or node.attrs.get("axes"):
        return "Resize with antialias, exclude_outside, axes or an aspect-ratio policy has no host implementation"
    for t in node.inputs[1:]:
        if t and t not in graph.constants:
            return "Resize's roi, scales and sizes must be constants"
    if len(ishape) != 4 or ishape[:2] != oshape[:2]:
        return "Resize on the host takes 4-D NCHW input and resizes H and W only"
    return ""


def _source(coord: str, i: int, size_in: int, size_out: int, scale: float) -> float:
    if coord == "align_corners":
        return i * (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    if coord == "asymmetric":
        return i / scale
    if coord == "pytorch_half_pixel" and size_out == 1:
        return 0.0
    return (i + 0.5) / scale - 0.5


def _resize_axis(node, size_in: int, size_out: int, scale: float):
    """(low index, high index, weight of high) for each output position along one axis."""
    mode = _attr(node, "mode", "nearest")
    coord = _attr(node, "coordinate_transformation_mode", "half_pixel")
    lo, hi, w = [], [], []
    for i in range(size_out):
        x = _source(coord, i, size_in, size_out, scale)
        if mode == "nearest":
            at = min(max(NEAREST[_attr(node, "nearest_mode", "round_prefer_floor")](x), 0), size_in - 1)
            lo.append(at), hi.append(at), w.append(0.0)
            continue
        x = min(max(x, 0.0), size_in - 1)
        base = int(math.floor(x))
        lo.append(base), hi.append(min(base + 1, size_in - 1)), w.append(x - base)
    return lo, hi, w


def _resize_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    n, c, ih, iw = _shape(graph, ins[0])
    oh, ow = _shape(graph, out)[2:]
    scales = _resize_scales(node, graph)
    yl, yh, yw = _resize_axis(node, ih, oh, scales[2])
    xl, xh, xw = _resize_axis(node, iw, ow, scales[3])
    return [int_table("yl", yl), int_table("yh", yh), _reals("yw", yw),
            int_table("xl", xl), int_table("xh", xh), _reals("xw", xw),
            f"  for (int64_t p = 0; p < {n * c}; ++p) for (int64_t y = 0; y < {oh}; ++y) "
            f"for (int64_t x = 0; x < {ow}; ++x) {{",
            f"    const __typeof__(*v0)* s = v0 + p * {ih * iw};",
            f"    double top = s[yl[y] * {iw} + xl[x]] * (1 - xw[x]) + s[yl[y] * {iw} + xh[x]] * xw[x];",
            f"    double bot = s[yh[y] * {iw} + xl[x]] * (1 - xw[x]) + s[yh[y] * {iw} + xh[x]] * xw[x];",
            f"    {o}[(p * {oh} + y) * {ow} + x] = top * (1 - yw[y]) + bot * yw[y];", "  }"]


HOST_OPS: dict[str, HostOp] = {
    "Gemm": HostOp(frozenset({"alpha", "beta", "transA", "transB"}), _present, _gemm_reason, _gemm_body),
    "MatMul": HostOp(frozenset(), _present, _matmul_reason, _matmul_body),
    "BatchNormalization": HostOp(frozenset({"epsilon", "momentum", "training_mode", "spatial"}), _present,
                                 _bn_reason, _bn_body),
    "LayerNormalization": HostOp(frozenset({"axis", "epsilon", "stash_type"}), _present, _ln_reason, _ln_body),
    "Gather": HostOp(frozenset({"axis"}), _present, _gather_reason, _gather_body),
    "Resize": HostOp(frozenset({"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                                "exclude_outside", "extrapolation_value", "antialias", "axes",
                                "keep_aspect_ratio_policy"}), _resize_inputs, _resize_reason, _resize_body),
}
#: ops whose input values are only moved, never computed on (any dtype C can copy)
MOVES = ("Gather",)
