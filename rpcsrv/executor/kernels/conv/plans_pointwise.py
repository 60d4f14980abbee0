"""Run plans of 1x1 convs over one image as a matrix product: the plain one (:func:`pointwise_plan`), with
``residual_fold``'s Add (:func:`residual_pointwise_plan`) and with ``scale_fold``'s squeeze-and-excitation scale
(:func:`scaled_pointwise_plan`), each from the checked step ``plans_conv.read_step`` makes."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from ..plan_support import F32, address, block, in_use
from . import gemm
from .conv_step import ConvStep


class _Pointwise(NamedTuple):
    """What the 1x1 plans share: the weights as a matrix, the product's views, ``gemm.c``'s plan (or None), the
    epilogue's parameter blocks, and the checks and finishes of a call."""

    wmat: np.ndarray
    q: int  # H * W
    xview: tuple  # the input as the product reads it (grouped: one batch per group)
    tiled: Optional[Callable[..., Any]]  # gemm.planned, or None: OpenBLAS and the epilogue pass
    keep: tuple  # what the blocks' pointers point into
    ready: Callable[..., bool]  # (x, w_in, b_in): the inputs the plan was made for, the library in use
    finish: Callable[..., np.ndarray]  # (y): the bias and activation pass, as the node's shape
    finish_residual: Optional[Callable[..., np.ndarray]]  # (y, r): bias, residual and activation (``res``)
    r_ready: Optional[Callable[..., bool]]  # (r): the residual the plan was made for (``res``)


def _pointwise_parts(step: ConvStep, res: bool) -> _Pointwise:
    """The shared part of the 1x1 plans: grouped (ShuffleNet's) as one batched product of (G, M/G, C/G) weights
    with the (G, C/G, H*W) input; ``gemm.c`` (group 1, on the shapes where it measured faster than matmul +
    epilogue, ``gemm.takes``) with the bias, residual and activation in its tiles."""
    w, b, xshape, shape, group, bptr, act, lo, hi, lib = step.w, step.b, step.xshape, step.shape, step.group, \
        step.bptr, step.act, step.lo, step.hi, step.lib
    c, h, wd = xshape[1:]
    m = w.shape[0]
    wmat = np.ascontiguousarray(w.reshape(m, c) if group == 1 else w.reshape(group, m // group, c // group))
    q = h * wd
    xview = (c, q) if group == 1 else (group, c // group, q)
    epilogue = lib.rpcsrv_bias_act_block if (act or step.bias is not None) else None
    tiled = gemm.planned(lib, wmat, bptr, (m, q), act, lo, hi) if group == 1 else None
    params, pptr = block(ctypes.c_long, (bptr or 0, m, q, act))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    lib_ready = in_use(lib)

    def ready(x, w_in, b_in) -> bool:
        return w_in is w and b_in is b and type(x) is np.ndarray and x.shape == xshape and x.dtype == F32 \
            and x.flags.c_contiguous and lib_ready()

    def finish(y):
        if epilogue is not None:
            epilogue(address(y), pptr, fptr)
        return y.reshape(shape)

    finish_residual = r_ready = None
    if res:  # bias, residual and activation in one pass over the product, in place
        add_act = lib.rpcsrv_add_act_block

        def finish_residual(y, r):
            ya = address(y)
            add_act(ya, address(r), ya, pptr, fptr)
            return y.reshape(shape)

        def r_ready(r) -> bool:
            return type(r) is np.ndarray and r.shape == shape and r.dtype == F32 and r.flags.c_contiguous

    return _Pointwise(wmat, q, xview, tiled, (params, fparams), ready, finish, finish_residual, r_ready)


def pointwise_plan(step: ConvStep):
    """A 1x1 stride-1 unpadded conv of one image: the product of the weights with the input read in place, then
    the compiled epilogue; or ``gemm.c`` (:func:`_pointwise_parts`)."""
    parts = _pointwise_parts(step, False)
    wmat, xview, tiled, ready, finish, general, shape = parts.wmat, parts.xview, parts.tiled, parts.ready, \
        parts.finish, step.general, step.shape
    yview = (step.w.shape[0], parts.q) if step.group == 1 else (step.group, step.w.shape[0] // step.group, parts.q)

    def pointwise(x, w_in, b_in=None, out=None):
        if not ready(x, w_in, b_in):
            return general(x, w_in, b_in)
        y = tiled and tiled(x, out=out)
        if y is None:
            y = finish(np.matmul(wmat, x.reshape(xview), out=None if out is None else out.reshape(yview)))
        return y.reshape(shape) if out is None else out

    pointwise.keep, pointwise.into = (wmat, step.bias, *parts.keep, tiled), True
    return pointwise


def residual_pointwise_plan(step: ConvStep):
    """The 1x1 conv of ``residual_fold`` (x, w, b, r): the bias, the residual and the activation in one pass
    over the product, or in ``gemm.c``'s tiles."""
    parts = _pointwise_parts(step, True)
    wmat, xview, tiled, ready, finish_residual, r_ready, general, shape = parts.wmat, parts.xview, parts.tiled, \
        parts.ready, parts.finish_residual, parts.r_ready, step.general, step.shape

    def residual_pointwise(x, w_in, b_in, r):
        if not ready(x, w_in, b_in) or not r_ready(r):
            return general(x, w_in, b_in, r)
        y = tiled and tiled(x, None, r)
        if y is not None:
            return y.reshape(shape)
        return finish_residual(np.matmul(wmat, x.reshape(xview)), r)

    residual_pointwise.keep = (wmat, step.bias, *parts.keep, tiled)
    return residual_pointwise


def scaled_pointwise_plan(step: ConvStep, res: bool):
    """The 1x1 conv of ``scale_fold`` (x, s, w[, b][, r] with ``res``): the squeeze-and-excitation scale where it
    multiplies fewer values, the weights' M*C or the input's C*H*W (the small late maps of
    MobileNetV3/EfficientNet: 960 -> 160 at 7x7 scales 47k inputs, not 154k weights); with ``gemm.c``, applied as
    the input is packed."""
    parts = _pointwise_parts(step, res)
    wmat, q, tiled, ready, finish, finish_residual, r_ready = parts.wmat, parts.q, parts.tiled, parts.ready, \
        parts.finish, parts.finish_residual, parts.r_ready
    kernel, attrs, sshape, shape, c = step.kernel, step.attrs, step.sshape, step.shape, step.xshape[1]
    on_weights = step.w.shape[0] <= q

    def scaled_pointwise(x, s, w_in, b_in=None, *r):  # r: the residual (res) or nothing
        if not ready(x, w_in, b_in) or type(s) is not np.ndarray or s.shape != sshape or s.dtype != F32 \
                or len(r) != res or (res and not r_ready(r[0])):
            return kernel(x, s, w_in, b_in, *r, **attrs)
        # the scale applied as the input is packed
        y = tiled(x, s, r[0] if res else None) if tiled is not None and s.flags.c_contiguous else None
        if y is not None:
            return y.reshape(shape)
        if on_weights:
            y = np.matmul(wmat * s.reshape(1, c), x.reshape(c, q))
        else:
            y = np.matmul(wmat, x.reshape(c, q) * s.reshape(c, 1))
        return finish_residual(y, r[0]) if res else finish(y)

    scaled_pointwise.keep = (wmat, step.bias, *parts.keep, tiled)
    return scaled_pointwise
