"""The run plan of LayerNormalization over the last axis (float32, constant scale and bias): each row's mean,
variance, normalisation, scale and shift in one C call (``norm.c``), where ``norm.layer_normalization`` makes
seven numpy passes with temporaries.  A plan serves the step of the node's first output only (the runtime
plans no step whose op feeds several nodes), so it returns Y alone; anything the plan was not made for runs
the table kernel (see ``plans.py``; a planner under ``plan_support``'s contract)."""

from __future__ import annotations

import math

import numpy as np

from ..clib import compiled
from ..plan_support import F32, address, attribute_values, computed, in_use


def layer_normalization_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a float32 LayerNormalization over the last axis with constant scale (and bias), or None."""
    x_spec = computed(inputs[0]) if len(inputs) in (2, 3) else None
    if x_spec is None or x_spec != (shape, F32) or dtype != F32 or not shape or min(shape) < 1 \
            or not set(attrs) <= {"axis", "epsilon", "stash_type"} or attrs.get("stash_type", 1) != 1:
        return None
    axis, n = attrs.get("axis", -1), shape[-1]
    if type(axis) is not int or axis not in (-1, len(shape) - 1):
        return None
    scale, b = inputs[1], inputs[2] if len(inputs) == 3 else None
    if not all(isinstance(v, np.ndarray) and v.dtype == F32 and v.size == n and v.shape[-1:] == (n,)
               for v in ([scale] if b is None else [scale, b])):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    gamma = np.ascontiguousarray(scale.reshape(n))
    beta = None if b is None else np.ascontiguousarray(b.reshape(n))
    with attribute_values():
        eps = float(attrs.get("epsilon", 1e-5))
    gptr, bptr = gamma.ctypes.data, None if beta is None else beta.ctypes.data
    rows, fn, ready = math.prod(shape) // n, lib.rpcsrv_layernorm_f32, in_use(lib)

    def layer_normalization(x, scale_in, b_in=None):
        if scale_in is not scale or b_in is not b or type(x) is not np.ndarray or x.shape != shape \
                or x.dtype != F32 or not x.flags.c_contiguous or not ready():
            return kernel(x, scale_in, b_in, **attrs)
        y = np.empty(shape, F32)
        fn(address(x), gptr, bptr, address(y), rows, n, eps)
        return y

    layer_normalization.keep = (gamma, beta)
    return layer_normalization


#: op -> planner
PLANNERS = {"layer_normalization": layer_normalization_plan}
