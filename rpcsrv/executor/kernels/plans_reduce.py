"""Run plans of ``reduce.py``'s ops (see ``plans.py``): ReduceMean over trailing axes (row means, as
GlobalAveragePool's plan) and Softmax along the last axis.  Each is a planner ``(kernel, attrs, inputs, shape,
dtype) -> planned function or None`` under ``plan_support``'s contract."""

from __future__ import annotations

import math

import numpy as np

from .clib import compiled
from .plan_support import F32, address, attribute_values, computed, in_use, one_pass


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
    with attribute_values():
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


#: op -> planner
PLANNERS = {"reduce_mean": reduce_mean_plan, "softmax": softmax_plan}
