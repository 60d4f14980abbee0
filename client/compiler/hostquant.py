"""Host C for the int8 ops the accelerator leaves: QuantizeLinear, DequantizeLinear and the QLinear ops
(ONNX's and onnxruntime's ``com.microsoft`` ones), with the arithmetic of ``docs/quantization.md``.

Every result is quantized as ONNX says: ``nearbyintf`` (round half to even, the default rounding mode),
plus the zero point, saturated to the output type, or clamped to a fused activation's range
(``quant.clamp_bounds``).  Integer products accumulate exactly in int32; the requantize multiplier
``in_scale * w_scale / out_scale`` is a float32 worked out here with numpy (``quant.multiplier``: per
output channel with per-channel weights) and written as an exact hexadecimal literal, and ``acc * m`` is
a float32 product, as onnxruntime computes it.  Sigmoid and LeakyRelu are 256-entry tables of the output
integers, made here (as onnxruntime makes them).  Scales and zero points are compiled in (they must be
constants); the data tensors (activations, weights, biases) are the function's arguments.

Each op is a :class:`~.hostops.HostOp` row of :data:`HOST_OPS`, the same shape as the float ops'
(``hostops.py``; ``hostgen.py`` joins the tables).
"""

from __future__ import annotations

import numpy as np

from rpcsrv.loader.opset.quant import QuantParams, clamp_bounds, dequantize, multiplier, quantize

from .hostops import HostOp, batch_offsets, binary_loop, int_table, numel
from .ir import Graph
from .quantize import kernel_of, node_quant

#: C helpers every int8 function uses (appended to ``hostgen.PRELUDE``)
PRELUDE = r"""
/* ONNX's quantize step on a scaled value: round half to even, add the zero point, saturate to [lo, hi] */
static inline float host_q(float v, float zp, float lo, float hi) {
  float q = nearbyintf(v) + zp;
  if (q != q) return zp;
  return q < lo ? lo : (q > hi ? hi : q);
}
"""


def _f(v) -> str:
    """A float32 value as an exact C literal."""
    return float(np.float32(v)).hex() + "f"


def _floats(name: str, values) -> str:
    vals = ", ".join(_f(v) for v in np.asarray(values, np.float32).reshape(-1)) or "0"
    return f"  static const float {name}[] = {{{vals}}};"


def _params(node, graph: Graph) -> dict[str, QuantParams]:
    return node_quant(kernel_of(node), node.inputs, node.attrs, graph)


def _zp(p: QuantParams) -> str:
    return str(int(np.asarray(p.zero_point).reshape(-1)[0]))


def _bounds(node, y: QuantParams) -> tuple[int, int]:
    return clamp_bounds(node.attrs.get("activation"), node.attrs.get("activation_attrs"), y)


def _store(value: str, y: QuantParams, bounds) -> str:
    lo, hi = bounds
    return f"host_q({value}, {_zp(y)}.0f, {lo}.0f, {hi}.0f)"


def _need(node, graph: Graph, roles: tuple[str, ...], per_channel: tuple[str, ...] = (), wide=("b", "c")) -> str:
    """Why the op's parameters do not suit the host C ("" when they do); ``wide``: roles that may be int32."""
    params = _params(node, graph)
    missing = [r for r in roles if r not in params]
    if missing:
        return f"{node.op_type}'s scales and zero points must be constants ({', '.join(missing)} are not)"
    wide = [r for r in roles if params[r].per_channel and r not in per_channel]
    if wide:
        return f"{node.op_type} with per-channel {', '.join(wide)} has no host implementation"
    if any(params[r].dtype == np.dtype(np.int32) for r in roles if r not in wide):
        return f"{node.op_type} on int32 has no host implementation (int8, uint8)"
    return ""


def _data(*positions: int):
    def inputs(node, graph: Graph) -> list[str]:
        return [node.inputs[k] for k in positions if k < len(node.inputs) and node.inputs[k]]
    return inputs


def _channel(shape, axis: int) -> tuple[int, int]:
    """(channels, inner size) of a per-axis parameter along ``axis`` of ``shape``."""
    axis %= len(shape)
    return shape[axis], numel(shape[axis + 1:])


# QuantizeLinear / DequantizeLinear (per tensor or per axis)

def _q_reason(node, graph: Graph) -> str:
    if node.attrs.get("block_size", 0) or node.attrs.get("precision", 0):
        return f"{node.op_type} with block_size or precision has no host implementation"
    role = "y" if node.op_type == "QuantizeLinear" else "x"
    data = node.inputs[0] if role == "y" else node.outputs[0]
    if graph.tensors[data].dtype != "float32":
        return f"{node.op_type} to or from {graph.tensors[data].dtype} has no host implementation (float32)"
    return _need(node, graph, (role,), (role,), (role,)) or (
        "" if role == "x" or graph.tensors[node.outputs[0]].dtype in ("int8", "uint8", "int32") else
        "QuantizeLinear to this type has no host implementation")


def _per_axis(p: QuantParams, shape) -> str:
    """The C index of element ``i``'s scale and zero point."""
    if not p.per_channel:
        return "0"
    channels, inner = _channel(shape, p.axis)
    return f"(i / {inner}) % {channels}"


def _q_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    quantizing = node.op_type == "QuantizeLinear"
    p = _params(node, graph)["y" if quantizing else "x"]
    shape = graph.tensors[ins[0]].shape
    at = _per_axis(p, shape)
    lines = [_floats("sc", p.scale), int_table("zp", np.asarray(p.zero_point).reshape(-1))]
    if quantizing:
        lo, hi = p.bounds
        expr = f"host_q(v0[i] / sc[{at}], (float)zp[{at}], {lo}.0f, {hi}.0f)"
    else:
        expr = f"(float)((int64_t)v0[i] - zp[{at}]) * sc[{at}]"
    return lines + [f"  for (int64_t i = 0; i < {numel(shape)}; ++i) {o}[i] = {expr};"]


# QLinearConv (NCHW, 2-D), QLinearMatMul, QGemm: int32 accumulation, then requantize

def _conv_reason(node, graph: Graph) -> str:
    x, w = graph.tensors[node.inputs[0]].shape, graph.tensors[node.inputs[3]].shape
    if len(x) != 4 or len(w) != 4:
        return "QLinearConv on the host takes 2-D convolutions (4-D NCHW data) only"
    return _need(node, graph, ("x", "w", "y"), ("w",))


def _conv_pads(node, x, w, y) -> list[int]:
    pad = node.attrs.get("auto_pad", "NOTSET")
    pads = list(node.attrs.get("pads") or [0, 0, 0, 0])
    if pad in ("NOTSET", ""):
        return pads
    out = []
    for d in range(2):
        s = (node.attrs.get("strides") or [1, 1])[d]
        dil = (node.attrs.get("dilations") or [1, 1])[d]
        total = max((y[2 + d] - 1) * s + (w[2 + d] - 1) * dil + 1 - x[2 + d], 0) if pad != "VALID" else 0
        out.append(total // 2 if pad == "SAME_UPPER" else total - total // 2)
    return out + [0, 0]


def _conv_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    n, c, ih, iw = graph.tensors[ins[0]].shape
    m, cg, kh, kw = graph.tensors[ins[1]].shape
    oh, ow = graph.tensors[out].shape[2:]
    g = int(node.attrs.get("group", 1))
    sh, sw = node.attrs.get("strides") or [1, 1]
    dh, dw = node.attrs.get("dilations") or [1, 1]
    top, left = _conv_pads(node, (n, c, ih, iw), (m, cg, kh, kw), graph.tensors[out].shape)[:2]
    mult = np.broadcast_to(multiplier(p["x"].scale, p["w"].scale, p["y"].scale), (m,))
    wzp = np.broadcast_to(np.asarray(p["w"].zero_point).astype(np.int64), (m,))
    bias = "v2[oc]" if len(ins) > 2 else "0"
    store = _store("(float)acc * mult[oc]", p["y"], _bounds(node, p["y"]))
    return [_floats("mult", mult), int_table("wzp", wzp),
            f"  for (int64_t b = 0; b < {n}; ++b) for (int64_t oc = 0; oc < {m}; ++oc) {{",
            f"    int64_t ic0 = (oc / {m // g}) * {cg};",
            f"    for (int64_t y = 0; y < {oh}; ++y) for (int64_t xo = 0; xo < {ow}; ++xo) {{",
            f"      int32_t acc = {bias};",
            f"      for (int64_t ic = 0; ic < {cg}; ++ic) for (int64_t a = 0; a < {kh}; ++a) {{",
            f"        int64_t yy = y * {sh} - {top} + a * {dh};",
            f"        if (yy < 0 || yy >= {ih}) continue;",
            f"        for (int64_t k = 0; k < {kw}; ++k) {{",
            f"          int64_t xx = xo * {sw} - {left} + k * {dw};",
            f"          if (xx < 0 || xx >= {iw}) continue;",
            f"          acc += ((int32_t)v0[((b * {c} + ic0 + ic) * {ih} + yy) * {iw} + xx] - {_zp(p['x'])}) * "
            f"((int32_t)v1[((oc * {cg} + ic) * {kh} + a) * {kw} + k] - (int32_t)wzp[oc]);",
            "        }", "      }",
            f"      {o}[((b * {m} + oc) * {oh} + y) * {ow} + xo] = {store};",
            "    }", "  }"]


def _matmul_reason(node, graph: Graph) -> str:
    a, b = graph.tensors[node.inputs[0]].shape, graph.tensors[node.inputs[3]].shape
    if len(a) < 2 or len(b) < 2:
        return "QLinearMatMul on the host takes operands of rank 2 or more"
    return _need(node, graph, ("a", "b", "y"), ("b",))


def _matmul_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    a, b = list(graph.tensors[ins[0]].shape), list(graph.tensors[ins[1]].shape)
    m, k, n = a[-2], a[-1], b[-1]
    batch = list(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    mult = np.broadcast_to(multiplier(p["a"].scale, p["b"].scale, p["y"].scale), (n,))
    bzp = np.broadcast_to(np.asarray(p["b"].zero_point).astype(np.int64), (n,))
    store = _store("(float)acc * mult[j]", p["y"], _bounds(node, p["y"]))
    return [int_table("offa", batch_offsets(a[:-2], batch, m * k)),
            int_table("offb", batch_offsets(b[:-2], batch, k * n)), _floats("mult", mult), int_table("bzp", bzp),
            f"  for (int64_t p = 0; p < {numel(batch)}; ++p) for (int64_t i = 0; i < {m}; ++i) "
            f"for (int64_t j = 0; j < {n}; ++j) {{",
            "    int32_t acc = 0;",
            f"    for (int64_t k = 0; k < {k}; ++k) acc += ((int32_t)v0[offa[p] + i * {k} + k] - {_zp(p['a'])}) * "
            f"((int32_t)v1[offb[p] + k * {n} + j] - (int32_t)bzp[j]);",
            f"    {o}[(p * {m} + i) * {n} + j] = {store};",
            "  }"]


def _gemm_reason(node, graph: Graph) -> str:
    if int(node.attrs.get("transA", 0)):
        return "QGemm with transA has no host implementation"
    has_y = len(node.inputs) > 7 and bool(node.inputs[7])
    return _need(node, graph, ("a", "b", "y") if has_y else ("a", "b"), ("b",))


def _gemm_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    m, k = graph.tensors[ins[0]].shape
    tb = int(node.attrs.get("transB", 0))
    n = graph.tensors[out].shape[1]
    alpha = np.float32(node.attrs.get("alpha", 1.0))
    scale = (alpha * np.float32(p["a"].scale) * np.broadcast_to(p["b"].scale, (n,))).astype(np.float32)
    mult = (scale / np.float32(p["y"].scale)).astype(np.float32) if "y" in p else scale
    bzp = np.broadcast_to(np.asarray(p["b"].zero_point).astype(np.int64), (n,))
    bi = f"j * {k} + k" if tb else f"k * {n} + j"
    bias = ""
    if len(ins) > 2:
        c = [1] * (2 - len(graph.tensors[ins[2]].shape)) + list(graph.tensors[ins[2]].shape)
        bias = f" + v2[i * {0 if c[0] == 1 else c[1]} + j * {0 if c[1] == 1 else 1}]"
    store = _store("(float)acc * mult[j]", p["y"], _bounds(node, p["y"])) if "y" in p else "(float)acc * mult[j]"
    return [_floats("mult", mult), int_table("bzp", bzp),
            f"  for (int64_t i = 0; i < {m}; ++i) for (int64_t j = 0; j < {n}; ++j) {{",
            f"    int32_t acc = 0{bias};",
            f"    for (int64_t k = 0; k < {k}; ++k) acc += ((int32_t)v0[i * {k} + k] - {_zp(p['a'])}) * "
            f"((int32_t)v1[{bi}] - (int32_t)bzp[j]);",
            f"    {o}[i * {n} + j] = {store};", "  }"]


# QLinearAdd, QLinearMul: the real values combined in float32, quantized

def _binary_reason(node, graph: Graph) -> str:
    return _need(node, graph, ("a", "b", "y"))


def _binary_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    va = f"((float)(a - {_zp(p['a'])}) * {_f(p['a'].scale)})"
    vb = f"((float)(b - {_zp(p['b'])}) * {_f(p['b'].scale)})"
    value = f"({va} {'+' if node.op_type == 'QLinearAdd' else '*'} {vb}) / {_f(p['y'].scale)}"
    return binary_loop(_store(value, p["y"], _bounds(node, p["y"])), ins, graph, graph.tensors[out].shape, o)


# QLinearConcat: each input requantized to the output's parameters (copied where they are the same)

def _concat_reason(node, graph: Graph) -> str:
    count = (len(node.inputs) - 2) // 3
    return _need(node, graph, ("y",) + tuple(f"x{k}" for k in range(count)))


def _concat_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    oshape = graph.tensors[out].shape
    axis = int(node.attrs["axis"]) % len(oshape)
    outer, inner = numel(oshape[:axis]), numel(oshape[axis + 1:])
    lines, offset = [], 0
    for k, t in enumerate(ins):
        chunk = graph.tensors[t].shape[axis] * inner
        px = p[f"x{k}"]
        dst = f"{o}[q * {oshape[axis] * inner} + {offset} + r]"
        value = "v{k}[q * {chunk} + r]".format(k=k, chunk=chunk)
        if not px.same_as(p["y"]):
            value = _store(f"((float)((int32_t){value} - {_zp(px)}) * {_f(px.scale)}) / {_f(p['y'].scale)}",
                           p["y"], p["y"].bounds)
        lines.append(f"  for (int64_t q = 0; q < {outer}; ++q) for (int64_t r = 0; r < {chunk}; ++r) "
                     f"{dst} = {value};")
        offset += chunk
    return lines


def _concat_inputs(node, graph: Graph) -> list[str]:
    return [node.inputs[k] for k in range(2, len(node.inputs), 3)]


# the pools: exact integer sums

def _pool_reason(node, graph: Graph) -> str:
    if int(node.attrs.get("channels_last", 0)):
        return f"{node.op_type} with channels_last has no host implementation"
    shape = graph.tensors[node.inputs[0]].shape
    if node.op_type == "QLinearAveragePool" and (len(shape) != 4 or node.attrs.get("auto_pad", "NOTSET")
                                                  not in ("NOTSET", "")):
        return "QLinearAveragePool on the host: 2-D pooling with explicit pads only"
    return _need(node, graph, ("x", "y"))


def _gap_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    shape = graph.tensors[ins[0]].shape
    planes, area = numel(shape[:2]), numel(shape[2:])
    mult = np.float32(p["x"].scale) / (np.float32(p["y"].scale) * np.float32(area))
    store = _store(f"(float)acc * {_f(mult)}", p["y"], p["y"].bounds)
    return [f"  for (int64_t q = 0; q < {planes}; ++q) {{",
            f"    int64_t acc = 0; for (int64_t k = 0; k < {area}; ++k) acc += (int64_t)v0[q * {area} + k] - "
            f"{_zp(p['x'])};",
            f"    {o}[q] = {store};", "  }"]


def _avg_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    a = node.attrs
    kh, kw = a["kernel_shape"]
    sh, sw = a.get("strides") or [1, 1]
    pads = list(a.get("pads") or [0, 0, 0, 0])
    _, _, ih, iw = graph.tensors[ins[0]].shape
    n, c, oh, ow = graph.tensors[out].shape
    count = "cnt"
    if int(a.get("count_include_pad", 0)):  # the window as clipped by the pads, not by the input
        count = f"((fmin(y0 + {kh}, {ih + pads[2]}) - y0) * (fmin(x0 + {kw}, {iw + pads[3]}) - x0))"
    real = f"(float)((double)acc / {count} * {float(np.float32(p['x'].scale))!r})"
    store = _store(f"{real} / {_f(p['y'].scale)}", p["y"], p["y"].bounds)
    return [f"  for (int64_t q = 0; q < {n * c}; ++q) for (int64_t y = 0; y < {oh}; ++y) "
            f"for (int64_t xo = 0; xo < {ow}; ++xo) {{",
            f"    int64_t y0 = y * {sh} - {pads[0]}, x0 = xo * {sw} - {pads[1]}, acc = 0, cnt = 0;",
            f"    for (int64_t u = 0; u < {kh}; ++u) for (int64_t v = 0; v < {kw}; ++v) {{",
            "      int64_t yy = y0 + u, xx = x0 + v;",
            f"      if (yy < 0 || yy >= {ih} || xx < 0 || xx >= {iw}) continue;",
            f"      acc += (int64_t)v0[(q * {ih} + yy) * {iw} + xx] - {_zp(p['x'])}; ++cnt;", "    }",
            f"    {o}[(q * {oh} + y) * {ow} + xo] = {store};",
            "  }"]


# Sigmoid, LeakyRelu: a table over the input's integers; Softmax: in float, quantized

def _table_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    lo, hi = p["x"].bounds
    real = dequantize(np.arange(lo, hi + 1).astype(p["x"].dtype), p["x"])
    if node.op_type == "QLinearSigmoid":
        fn = (1.0 / (1.0 + np.exp(-real.astype(np.float64)))).astype(np.float32)
    else:
        alpha = np.float32(node.attrs.get("alpha", 0.01))
        fn = np.where(real >= 0, real, real * alpha).astype(np.float32)
    table = quantize(fn, p["y"])
    return [int_table("lut", table),
            f"  for (int64_t i = 0; i < {numel(graph.tensors[out].shape)}; ++i) {o}[i] = lut[(int64_t)v0[i] - {lo}];"]


def _softmax_body(node, ins, out, graph: Graph, o: str) -> list[str]:
    p = _params(node, graph)
    shape = graph.tensors[ins[0]].shape
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    if int(node.attrs.get("opset", 13)) < 13:  # Softmax-1: the trailing dimensions from axis as one row
        outer, size, inner = numel(shape[:axis]), numel(shape[axis:]), 1
    else:
        outer, size, inner = numel(shape[:axis]), shape[axis], numel(shape[axis + 1:])
    x = f"((double)((int32_t)v0[b + k * {inner}] - {_zp(p['x'])}) * {_f(p['x'].scale)})"
    store = _store(f"(float)(exp({x} - m) / s) / {_f(p['y'].scale)}", p["y"], p["y"].bounds)
    return [f"  for (int64_t q = 0; q < {outer}; ++q) for (int64_t r = 0; r < {inner}; ++r) {{",
            f"    int64_t b = q * {size * inner} + r; double m = -INFINITY, s = 0;",
            f"    for (int64_t k = 0; k < {size}; ++k) if ({x} > m) m = {x};",
            f"    for (int64_t k = 0; k < {size}; ++k) s += exp({x} - m);",
            f"    for (int64_t k = 0; k < {size}; ++k) {o}[b + k * {inner}] = "
            f"{store};", "  }"]


def _unary_reason(node, graph: Graph) -> str:
    return _need(node, graph, ("x", "y"))


_Q_ATTRS = frozenset({"axis", "block_size", "output_dtype", "precision", "saturate"})
_ACT = frozenset({"activation", "activation_attrs"})
HOST_OPS: dict[str, HostOp] = {
    "QuantizeLinear": HostOp(_Q_ATTRS, _data(0), _q_reason, _q_body),
    "DequantizeLinear": HostOp(_Q_ATTRS, _data(0), _q_reason, _q_body),
    "QLinearConv": HostOp(frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}) | _ACT,
                          _data(0, 3, 8), _conv_reason, _conv_body),
    "QLinearMatMul": HostOp(_ACT, _data(0, 3), _matmul_reason, _matmul_body),
    "QGemm": HostOp(frozenset({"alpha", "transA", "transB"}) | _ACT, _data(0, 3, 6), _gemm_reason, _gemm_body),
    "QLinearAdd": HostOp(_ACT, _data(0, 3), _binary_reason, _binary_body),
    "QLinearMul": HostOp(_ACT, _data(0, 3), _binary_reason, _binary_body),
    "QLinearConcat": HostOp(frozenset({"axis"}), _concat_inputs, _concat_reason, _concat_body),
    "QLinearGlobalAveragePool": HostOp(frozenset({"channels_last"}), _data(0), _pool_reason, _gap_body),
    "QLinearAveragePool": HostOp(frozenset({"auto_pad", "ceil_mode", "channels_last", "count_include_pad",
                                            "kernel_shape", "pads", "strides"}), _data(0), _pool_reason, _avg_body),
    "QLinearSigmoid": HostOp(frozenset(), _data(0), _unary_reason, _table_body),
    "QLinearLeakyRelu": HostOp(frozenset({"alpha"}), _data(0), _unary_reason, _table_body),
    "QLinearSoftmax": HostOp(frozenset({"axis", "opset"}), _data(0), _unary_reason, _softmax_body),
}
#: ops of this table whose outputs are integers (the host's float-only rule does not apply to them)
INTEGER_OUT = frozenset(HOST_OPS) - {"DequantizeLinear"} | {"MaxPool", "GlobalMaxPool"}
