"""Run plans for the ops around the convolutions (see ``plans.py``): pools, Add/Sum with an activation,
GlobalAveragePool, ReduceMean over trailing axes, Sigmoid, Gelu, HardSigmoid, Softmax, views (Flatten, Reshape), a
classifier's Gemm and MatMul by constant weights.  Each is a planner ``(kernel, attrs, inputs, shape, dtype) ->
planned function or None``, as ``plans.PLANNERS`` lists."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from .clib import compiled
from .pool import pool
from .conv.gemm import planned_matmul
from .plan_support import F32, address, block, computed, in_use
from .windows import resolve_pads, spatial_attr


def one_pass(name, kernel, attrs, xshape, shape, lib, c_name, *args):
    """The planned function of a float32 op of one computed input of ``xshape`` whose compiled kernel
    ``lib.<c_name>`` writes a new array of ``shape`` in one call, ``(x, y, *args)`` (GlobalAveragePool,
    Softmax, Sigmoid, Gelu, HardSigmoid): any other input, or a library no longer in use, runs the table
    ``kernel``."""
    fn, ready = getattr(lib, c_name), in_use(lib)

    def planned(x):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous \
                or not ready():
            return kernel(x, **attrs)
        y = np.empty(shape, F32)
        fn(address(x), address(y), *args)
        return y

    planned.__name__ = planned.__qualname__ = name
    return planned


def pool_plan(op, kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 2-D MaxPool (without its indices output) or AveragePool (``pools.c``'s rows or
    ``dwconv.c``'s phase planes, ``rpcsrv_pool_block`` picks; the average's divisors from
    ``pool.average_counts``), or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 else None
    if x_spec is None or x_spec[1] != F32 or len(x_spec[0]) != 4 or dtype != F32 or attrs.get("return_indices"):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    xshape = x_spec[0]
    kernel_shape = attrs.get("kernel_shape")
    if kernel_shape is None or len(kernel_shape) != 2:
        return None
    strides = spatial_attr(attrs.get("strides"), 2, 1, "strides", op)
    dilations = spatial_attr(attrs.get("dilations"), 2, 1, "dilations", op)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    begin, end, out = resolve_pads(op, xshape[2:], list(kernel_shape), strides, dilations, attrs.get("pads"),
                                   auto_pad, attrs.get("ceil_mode", 0))
    if shape != tuple(xshape[:2]) + tuple(out) or min(out) < 1 or min(begin) < 0:
        return None
    if op == "max_pool":
        divisors = None
    else:
        divisors = pool.average_counts(xshape, kernel_shape, strides, dilations, begin, end, out, auto_pad,
                                       attrs.get("count_include_pad", 0), attrs.get("pads"), F32)
        if divisors.shape != tuple(out) or not divisors.flags.c_contiguous or not divisors.all():
            return None
    params, pptr = block(ctypes.c_long, (0 if divisors is None else divisors.ctypes.data, *xshape, *kernel_shape,
                                          *strides, *dilations, begin[0], begin[1], out[0], out[1]))
    fn, ready = lib.rpcsrv_pool_block, in_use(lib)

    def pooled(x, out=None):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous \
                or not ready():
            return kernel(x, **attrs)
        y = np.empty(shape, F32) if out is None else out
        if fn(address(x), address(y), pptr) != 0:
            raise MemoryError(f"{op}: the compiled kernel could not allocate its scratch plane")
        return y

    pooled.__name__ = op
    pooled.keep = (divisors, params)  # what the block points into lives as long as the plan
    pooled.into = True  # ``out=``: a C-contiguous array of the output's shape to write into (concat_fold)
    return pooled


def add_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 Add/Sum of a computed 4-D tensor and either a per-channel constant (C, 1, 1) or
    another computed tensor of its shape, with a fused activation the C code applies (``epilogue.c``'s
    ``rpcsrv_add_act_f32``: one pass), or None."""
    if len(inputs) != 2 or dtype != F32 or len(shape) != 4 or set(attrs) - {"activation", "activation_attrs"}:
        return None
    lib = compiled.library()
    if lib is None:
        return None
    activation, act_attrs = attrs.get("activation"), attrs.get("activation_attrs")
    act, lo, hi = compiled._activation(activation, act_attrs)
    if act == 0 and (activation is not None or act_attrs):
        return None
    specs = [computed(spec) for spec in inputs]
    n, c = shape[:2]
    q = shape[2] * shape[3]
    fn, ready = lib.rpcsrv_add_act_block, in_use(lib)
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    if specs[0] == specs[1] == (shape, F32):  # a residual connection (with or without an activation)
        params, pptr = block(ctypes.c_long, (0, n * c, q, act))

        def residual(a, b):
            if type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != shape or b.shape != shape \
                    or a.dtype != F32 or b.dtype != F32 or not (a.flags.c_contiguous and b.flags.c_contiguous) \
                    or not ready():
                return kernel(a, b, **attrs)
            y = np.empty(shape, F32)
            fn(address(a), address(b), address(y), pptr, fptr)
            return y

        residual.keep = (params, fparams)
        return residual
    k = 0 if specs[0] == (shape, F32) else 1 if specs[1] == (shape, F32) else None
    const = None if k is None else inputs[1 - k]
    if not isinstance(const, np.ndarray) or const.dtype != F32 or const.shape not in ((c, 1, 1), (1, c, 1, 1)):
        return None
    bias = np.ascontiguousarray(const.reshape(c))
    params, pptr = block(ctypes.c_long, (bias.ctypes.data, c, q, act))

    def channel_add(*args):
        x = args[k]
        if args[1 - k] is not const or type(x) is not np.ndarray or x.shape != shape or x.dtype != F32 \
                or not x.flags.c_contiguous or not ready():
            return kernel(*args, **attrs)
        y = np.empty(shape, F32)
        xa, ya = address(x), address(y)
        for i in range(n):
            fn(xa + i * c * q * 4, None, ya + i * c * q * 4, pptr, fptr)
        return y

    channel_add.keep = (bias, params, fparams)
    return channel_add


def global_average_pool_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 4-D GlobalAveragePool (``epilogue.c``'s row means), or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 and not attrs else None
    if x_spec is None or x_spec[1] != F32 or len(x_spec[0]) != 4 or dtype != F32 or not all(x_spec[0]):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    xshape = x_spec[0]
    rows, q = xshape[0] * xshape[1], xshape[2] * xshape[3]
    return one_pass("global_average_pool", kernel, attrs, xshape, shape, lib, "rpcsrv_row_mean_f32", rows, q)


def reduce_mean_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 ReduceMean over the trailing axes of a computed input (a PyTorch export's
    ``x.mean([2, 3])``, ShuffleNetV2's and others' global pool), axes an attribute or a constant input, by
    the same row means as GlobalAveragePool, or None."""
    x_spec = computed(inputs[0]) if inputs else None
    if x_spec is None or x_spec[1] != F32 or dtype != F32 or len(inputs) > 2 or not all(x_spec[0]):
        return None
    xshape, raw = x_spec[0], attrs.get("axes")
    if len(inputs) == 2:
        if raw is not None or not isinstance(inputs[1], np.ndarray) or inputs[1].dtype.kind != "i":
            return None
        raw = inputs[1].reshape(-1).tolist()
    rank = len(xshape)
    axes = sorted({int(a) % rank for a in raw} if raw is not None and all(-rank <= int(a) < rank for a in raw)
                  else ())
    if not axes or axes != list(range(rank - len(axes), rank)) or set(attrs) - {"axes", "keepdims"}:
        return None  # no axes (all, or none with noop_with_empty_axes), or not the trailing ones
    rows, q = math.prod(xshape[:axes[0]]), math.prod(xshape[axes[0]:])
    want = xshape[:axes[0]] + ((1,) * len(axes) if attrs.get("keepdims", 1) else ())
    lib = compiled.library()
    if lib is None or shape != want:
        return None
    fn, ready = lib.rpcsrv_row_mean_f32, in_use(lib)
    axes_const = inputs[1] if len(inputs) == 2 else None

    def reduce_mean(x, *axes_input):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous \
                or (axes_input[0] is not axes_const if axes_input else axes_const is not None) or not ready():
            return kernel(x, *axes_input, **attrs)
        y = np.empty(shape, F32)
        fn(address(x), address(y), rows, q)
        return y

    return reduce_mean


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


def softmax_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 Softmax along the last axis (``sigmoid.c``: each row's max, exponentials, sum
    and scale while the row is in cache; numpy makes five passes over the tensor), or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 and set(attrs) <= {"axis"} else None
    if x_spec is None or x_spec != (shape, F32) or dtype != F32 or not shape or min(shape) < 1:
        return None
    axis = attrs.get("axis", -1)
    if type(axis) is not int or axis not in (-1, len(shape) - 1):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    n = shape[-1]
    rows = math.prod(shape) // n
    return one_pass("softmax", kernel, attrs, shape, shape, lib, "rpcsrv_softmax_f32", rows, n)


def sigmoid_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 Sigmoid (``sigmoid.c``; squeeze-and-excitation gates: small tensors, where the
    table kernel's checks and conversions are most of the cost), or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 and not attrs else None
    if x_spec is None or x_spec != (shape, F32) or dtype != F32:
        return None
    lib = compiled.library()
    if lib is None:
        return None
    return one_pass("sigmoid", kernel, attrs, shape, shape, lib, "rpcsrv_sigmoid_f32", math.prod(shape), 0)


def gelu_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 Gelu of the erf form (ONNX's, or PyTorch's erf pattern the compiler fuses into one
    ``Gelu``): ``sigmoid.c``'s one pass, or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 and attrs.get("approximate", "none") == "none" else None
    if x_spec is None or x_spec != (shape, F32) or dtype != F32 or set(attrs) - {"approximate"}:
        return None
    lib = compiled.library()
    if lib is None:
        return None
    return one_pass("gelu", kernel, attrs, shape, shape, lib, "rpcsrv_gelu_f32", math.prod(shape))


def hard_sigmoid_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 HardSigmoid (``epilogue.c``'s affine clip), or None."""
    x_spec = computed(inputs[0]) if len(inputs) == 1 and set(attrs) <= {"alpha", "beta"} else None
    if x_spec is None or x_spec != (shape, F32) or dtype != F32:
        return None
    lib = compiled.library()
    if lib is None:
        return None
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return one_pass("hard_sigmoid", kernel, attrs, shape, shape, lib, "rpcsrv_affine_clip_f32", math.prod(shape),
                    alpha, beta, 0.0, 1.0)


def view_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a Flatten, or a Reshape to a constant shape, of a computed input: a view of the declared
    shape (the table kernel works out the same from the attributes and the shape input at every call)."""
    x_spec = computed(inputs[0]) if inputs else None
    if x_spec is None or x_spec[1] != dtype or math.prod(x_spec[0]) != math.prod(shape) or any(
            computed(spec) is not None for spec in inputs[1:]):
        return None
    xshape = x_spec[0]

    def view(x, *rest):
        if type(x) is not np.ndarray or x.shape != xshape or rest and rest[0] is not inputs[1]:
            return kernel(x, *rest, **attrs)
        return x.reshape(shape)

    return view


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
