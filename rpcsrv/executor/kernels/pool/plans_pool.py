"""Run plans of the pools (see ``plans.py``): 2-D float32 MaxPool (without its indices output) and AveragePool,
and GlobalAveragePool of 4-D tensors.  Each is a planner ``(kernel, attrs, inputs, shape, dtype) -> planned
function or None`` under ``plan_support``'s contract."""

from __future__ import annotations

import ctypes
import operator

import numpy as np

from ..clib import compiled
from ..plan_support import F32, address, attribute_values, block, computed, in_use, one_pass
from ..windows import resolve_pads, spatial_attr
from . import pool


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
    with attribute_values():
        if kernel_shape is None or len(kernel_shape) != 2:
            return None
        for k in kernel_shape:  # integers, as the C kernel's parameter block takes them
            operator.index(k)
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
        with attribute_values():
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


#: op -> planner
PLANNERS = {"max_pool": lambda *args: pool_plan("max_pool", *args),
            "average_pool": lambda *args: pool_plan("average_pool", *args),
            "global_average_pool": global_average_pool_plan}
