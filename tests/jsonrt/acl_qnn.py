"""Libraries shaped like classic TVM's export of a QNN graph partitioned for Arm Compute Library, written from the
format (TVM v0.19.0: ``arm_compute_lib.py`` patterns, ``codegen.cc`` serializer, ``acl_runtime.cc`` reader): one
``arm_compute_lib`` JSON-runtime module per kernel (ACL's runtime takes one per function), data NHWC, conv kernels
OHWI (IHWO depthwise), the qnn composites' parameters as scalar constants in the serializer's order, the bias as
``(1, 1, 1, C)`` int32, constants ``<symbol>_const_<k>`` in a const loader; and TVM's own arithmetic for them
(qnn.conv2d / qnn.dense / qnn.add lowered, requantize's fixed point rounded half up), written here from TVM's
source with Python integers, for the tests to judge the board by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from jsonrt_helpers import HostGraph
from rpcsrv.loader import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob
from rpcsrv.loader.jsonrt import JSONRuntimeModule
from rpcsrv.loader.jsonrt_graph import GraphBuilder, dump_json_graph
from rpcsrv.loader.location import symbol_content


@dataclass
class Tensor:
    """A graph-executor entry: node id, shape, dtype."""

    nid: int
    shape: tuple
    dtype: str


class AclLibrary:
    """Builds the module tree: ``input``, then ``kernel`` per ACL function, then ``blob(outputs)``."""

    def __init__(self):
        self.graph = HostGraph()
        self.modules: list[JSONRuntimeModule] = []
        self.consts: dict[str, np.ndarray] = {}

    def input(self, name: str, shape, dtype: str) -> Tensor:
        return Tensor(self.graph.input(name, tuple(shape), dtype), tuple(shape), dtype)

    def kernel(self, op: str, args: list, shape, dtype: str, **attrs) -> Tensor:
        """One ACL function of one kernel node ``op``; ``args``: Tensors (the function's parameters) and arrays
        (its constants), in the serializer's order."""
        symbol = f"tvmgen_default_arm_compute_lib_main_{len(self.modules)}"
        b = GraphBuilder(symbol)
        entries, params, names = [], [], []
        for arg in args:
            if isinstance(arg, Tensor):
                entries.append(b.input(f"{symbol}_i{len(params)}", arg.shape, arg.dtype))
                params.append(arg.nid)
            else:
                arr = np.asarray(arg)
                name = f"{symbol}_const_{len(names)}"
                entries.append(b.const(name, arr.shape, arr.dtype.name))
                self.consts[name] = arr
                names.append(name)
        out = b.kernel(op, entries, tuple(shape), dtype, **attrs)
        self.modules.append(JSONRuntimeModule(symbol, dump_json_graph(b.graph([out])), b.const_names(),
                                              type_key="arm_compute_lib"))
        return Tensor(self.graph.op(symbol, params, [(tuple(shape), dtype)]), tuple(shape), dtype)

    def blob(self, outputs: list[Tensor]) -> bytes:
        by_symbol = {m.symbol: list(m.const_names) for m in self.modules}
        consts = ConstLoaderModule(dict(self.consts), by_symbol, imports=[*self.modules, HostLibraryModule([])])
        root = GraphExecutorFactoryModule(self.graph.json([t.nid for t in outputs]), {}, "default", imports=[consts])
        return symbol_content(build_blob(root))


def conv_attrs(kernel_hw, strides, pads, groups, channels, depthwise=False) -> dict:
    """What ``SetCallNodeAttribute`` writes for ACL's qnn.conv2d (the conv's attrs; padding top, left, bottom,
    right)."""
    return dict(strides=list(strides), padding=list(pads), dilation=[1, 1], groups=groups, channels=channels,
                kernel_size=list(kernel_hw), data_layout="NHWC", kernel_layout="IHWO" if depthwise else "OHWI",
                out_layout="", out_dtype="int32")


def qparams(x_zp, w_zp, x_scale, w_scale) -> list[np.ndarray]:
    """The qnn conv/dense parameters as ACL's JSON holds them: zero points int32, scales float32, scalars."""
    return [np.int32(x_zp), np.int32(w_zp), np.float32(x_scale), np.float32(w_scale)]


# ------------------------------------------------------------------ TVM's QNN arithmetic, with Python integers

def tvm_requantize(acc: np.ndarray, in_scale, in_zp, out_scale, out_zp, dtype) -> np.ndarray:
    """qnn.requantize as ``RequantizeLowerInt`` computes it: ``x - in_zp``, times the fixed-point multiplier
    (``GetFixedPointMultiplierShift``: frexp, the significand times 2**31 rounded half away from zero) rounded half
    up (``FixedPointMultiply``), skipped when the scales are equal; plus ``out_zp``; clipped (None: int32, not)."""
    x = np.asarray(acc, np.int64) - int(in_zp)
    if np.float32(in_scale) != np.float32(out_scale):
        mant, exp = math.frexp(float(np.float32(in_scale)) / float(np.float32(out_scale)))
        sig = Fraction(mant) * 2 ** 31
        sig = int(sig) + (1 if sig - int(sig) >= Fraction(1, 2) else 0)
        m = Fraction(sig, 2 ** 31) * Fraction(2) ** exp
        x = np.array([math.floor(Fraction(int(v)) * m + Fraction(1, 2)) for v in x.reshape(-1)],
                     np.int64).reshape(x.shape)
    x = x + int(out_zp)
    if dtype is None:
        return x
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max).astype(dtype)


def tvm_qnn_conv(x_nhwc, w_ohwi, x_zp, w_zp, strides, pads, groups=1, bias=None, relu=False) -> np.ndarray:
    """qnn.conv2d (+ bias_add, + relu) to the int32 accumulator, NHWC data, OHWI kernels (``groups`` equal to the
    channels: depthwise, kernel IHWO)."""
    top, left, bottom, right = pads
    xp = np.pad(np.asarray(x_nhwc, np.int64) - x_zp, ((0, 0), (top, bottom), (left, right), (0, 0)))
    w = np.asarray(w_ohwi, np.int64) - w_zp
    if groups == 1:
        win = sliding_window_view(xp, w.shape[1:3], axis=(1, 2))[:, ::strides[0], ::strides[1]]  # N OH OW C KH KW
        acc = np.einsum("nhwcij,oijc->nhwo", win, w)
    else:  # depthwise: IHWO with I == 1
        win = sliding_window_view(xp, w.shape[1:3], axis=(1, 2))[:, ::strides[0], ::strides[1]]
        acc = np.einsum("nhwcij,ijc->nhwc", win, w[0])
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64).reshape(-1)
    return np.maximum(acc, 0) if relu else acc


def tvm_qnn_dense(x, w_units_in, x_zp, w_zp, bias=None) -> np.ndarray:
    acc = (np.asarray(x, np.int64) - x_zp) @ (np.asarray(w_units_in, np.int64) - w_zp).T
    return acc + np.asarray(bias, np.int64).reshape(-1) if bias is not None else acc


def tvm_qnn_add(a, b, a_scale, a_zp, b_scale, b_zp, scale, zp, dtype) -> np.ndarray:
    """qnn.add canonicalized: each side requantized to the output's parameters unless they are the same, summed,
    minus the output zero point, clipped."""
    def side(q, s, z):
        same = np.float32(s) == np.float32(scale) and int(z) == int(zp)
        return np.asarray(q, np.int64) if same else tvm_requantize(q, s, z, scale, zp, None)
    info = np.iinfo(dtype)
    return np.clip(side(a, a_scale, a_zp) + side(b, b_scale, b_zp) - int(zp), info.min, info.max).astype(dtype)
