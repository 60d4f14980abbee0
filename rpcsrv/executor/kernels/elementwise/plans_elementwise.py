"""Run plans of element-wise ops (see ``plans.py``): Add/Sum of a 4-D tensor and a per-channel constant or a
residual with a fused activation, Sigmoid, Gelu (erf form) and HardSigmoid.  Each is a planner ``(kernel, attrs,
inputs, shape, dtype) -> planned function or None`` under ``plan_support``'s contract."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..clib import compiled
from ..plan_support import F32, address, attribute_values, block, computed, in_use, one_pass


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
    with attribute_values():
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
    with attribute_values():
        alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return one_pass("hard_sigmoid", kernel, attrs, shape, shape, lib, "rpcsrv_affine_clip_f32", math.prod(shape),
                    alpha, beta, 0.0, 1.0)


#: op -> planner
PLANNERS = {"add": add_plan, "sum": add_plan, "sigmoid": sigmoid_plan, "gelu": gelu_plan,
            "hard_sigmoid": hard_sigmoid_plan}
