"""Run plans of ``linalg.py``'s ops (see ``plans.py``): MatMul by constant weights and Gemm by constant weights
(a classifier's one row, or a Linear layer's many), through ``gemm.c`` where it measured faster
(``conv/gemm.py``), else OpenBLAS and the compiled epilogue.  Each is a planner ``(kernel, attrs, inputs, shape,
dtype) -> planned function or None`` under ``plan_support``'s contract."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from .clib import compiled
from .conv.gemm import planned_matmul
from .plan_support import F32, address, attribute_values, block, computed, in_use


def matmul_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 MatMul of a computed (..., K) input by constant (K, N) weights, with the compiler's
    bias (N,) and fused activation if any: one GEMM over the input's rows, then the bias and activation in
    one pass (``epilogue.c``; numpy: a broadcast add, then the activation), or None."""
    a_spec = computed(inputs[0]) if len(inputs) in (2, 3) else None
    b, c = inputs[1], inputs[2] if len(inputs) == 3 else None
    if a_spec is None or a_spec[1] != F32 or len(a_spec[0]) < 2 or dtype != F32 or not isinstance(b, np.ndarray) \
            or b.dtype != F32 or b.ndim != 2 or not (c is None or (isinstance(c, np.ndarray) and c.dtype == F32
                                                                 and c.shape == (b.shape[1],))):
        return None
    ashape, (k, n) = a_spec[0], b.shape
    with attribute_values():
        act, lo, hi = compiled._activation(attrs.get("activation"), attrs.get("activation_attrs"))
    lib = compiled.library()
    if ashape[-1] != k or shape != ashape[:-1] + (n,) or lib is None or min(shape) < 1 \
            or (act == 0 and (attrs.get("activation") is not None or attrs.get("activation_attrs"))):
        return None
    rows = math.prod(ashape[:-1])
    bias = None if c is None else np.ascontiguousarray(c)
    cptr = None if bias is None else bias.ctypes.data
    fn, ready = lib.rpcsrv_col_bias_act_f32 if (act or bias is not None) else None, in_use(lib)
    # gemm.c on the shapes where it measured faster (gemm.takes_matmul): the product, bias and activation in
    # its tiles; None (or None from it: more BLAS threads): OpenBLAS and the epilogue pass below
    tiled = planned_matmul(lib, b, bias, rows, act, lo, hi)

    def matmul(a, b_in, c_in=None):
        if b_in is not b or c_in is not c or type(a) is not np.ndarray or a.shape != ashape or a.dtype != F32 \
                or not a.flags.c_contiguous or not ready():
            return kernel(a, b_in, c_in, **attrs)
        y = None if tiled is None else tiled(a)
        if y is not None:
            return y.reshape(shape)
        y = np.matmul(a.reshape(rows, k), b)
        if fn is not None:
            fn(address(y), cptr, rows, n, act, lo, hi)
        return y.reshape(shape)

    matmul.keep = (bias, tiled)
    return matmul


def gemm_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 Gemm of one computed row with constant weights (a classifier): the product, then
    the bias and the fused activation in one compiled pass (``epilogue.c``); of more rows, ``gemm.c``'s MatMul
    where it takes them; or None."""
    if len(inputs) not in (2, 3) or dtype != F32 or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 \
            or attrs.get("beta", 1.0) != 1.0 or set(attrs) - {"alpha", "beta", "transA", "transB", "activation",
                                                               "activation_attrs"}:
        return None
    a_spec, w, c = computed(inputs[0]), inputs[1], inputs[2] if len(inputs) == 3 else None
    if a_spec is None or a_spec[1] != F32 or len(a_spec[0]) != 2 or a_spec[0][0] < 1 \
            or not isinstance(w, np.ndarray) or w.dtype != F32 or w.ndim != 2:
        return None
    n, rows = shape[1] if len(shape) == 2 else -1, a_spec[0][0]
    if c is not None and (not isinstance(c, np.ndarray) or c.dtype != F32 or c.size != n or c.ndim > 2
                          or c.shape[-1] != n):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    with attribute_values():
        act, lo, hi = compiled._activation(attrs.get("activation"), attrs.get("activation_attrs"))
    if act == 0 and (attrs.get("activation") is not None or attrs.get("activation_attrs")):
        return None
    trans = bool(attrs.get("transB", 0))
    wmat = w.T if trans else w
    if wmat.shape != (a_spec[0][1], n) or shape != (rows, n):
        return None
    # many rows (a Linear layer exported as Gemm: PyTorch's attention output projection): gemm.c's MatMul on
    # the shapes it takes (gemm.takes_matmul), else (and with more BLAS threads) the table kernel as before
    tiled = planned_matmul(lib, wmat, None if c is None else np.ascontiguousarray(c.reshape(n)), rows, act, lo,
                           hi) if rows > 1 else None
    if rows > 1 and tiled is None:
        return None
    # transB (an (N, K) classifier, as exported): the matrix times the row as a vector (BLAS's gemv over the
    # weights' contiguous rows), not the row times the transposed view, which numpy hands to a one-row GEMM:
    # 1 thread, cold caches, 1280 x 960: 335 against 484 us; in place of a transposed copy (251 us, but the
    # weights' size again in memory)
    k = a_spec[0][1]
    bias = None if c is None else np.ascontiguousarray(c.reshape(n))
    params, pptr = block(ctypes.c_long, (0, 1, n, act))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    fn, ready, ashape = lib.rpcsrv_add_act_block, in_use(lib), a_spec[0]

    def gemm(a, w_in, c_in=None):
        if w_in is not w or c_in is not c or type(a) is not np.ndarray or a.shape != ashape or a.dtype != F32 \
                or not ready():
            return kernel(a, w_in, c_in, **attrs)
        if rows > 1:
            y = tiled(a) if a.flags.c_contiguous else None
            return kernel(a, w_in, c_in, **attrs) if y is None else y
        y = np.matmul(w, a.reshape(k)).reshape(1, n) if trans else np.matmul(a, wmat)
        if bias is not None or act:  # y + bias (a row of n), then the activation, in place
            ya = address(y)
            fn(ya, 0 if bias is None else bias.ctypes.data, ya, pptr, fptr)
        return y

    gemm.keep = (bias, params, fparams, tiled)
    return gemm


#: op -> planner
PLANNERS = {"matmul": matmul_plan, "gemm": gemm_plan}
