"""Run plans of 2-D float32 convs with constant weights (and bias), and of the conv forms the ExampleJSON rewrites
make: which kernel runs a conv step, decided once per graph node (``plans.py``: what a plan is).

:func:`conv_plan` reads the step (:func:`read_step`) and picks, in this order: a conv that is not depthwise
reading ShuffleNet's shuffle (:func:`shuffled_conv_plan`); 3x3 convs that take Winograd (:func:`winograd_plan`);
depthwise convs and dense convs with few taps per output, stems (:func:`rows_plan`); 1x1 stride-1 unpadded convs
of one image (``plans_pointwise.py``: plain, with ``residual_fold``'s Add, with ``scale_fold``'s
squeeze-and-excitation scale); other dense convs of one image no fast path takes (:func:`im2col_plan`).  Each
``*_plan`` builds one planned function of the step's inputs, which runs the table kernel (the step's ``general``)
on inputs it was not made for.  Returns and raises follow ``plan_support``'s contract: None or ``NotPlannable``
for a step no plan takes, anything else is a bug.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Callable, Optional

import numpy as np

from ..clib import compiled
from ..plan_support import F32, address, attribute_values, block, computed, in_use
from .. import prepared
from . import gemm, winograd
from .conv import attrs_geometry, fast_path
from .depthwise import channel_shuffle
from .conv_step import ConvStep
from .plans_pointwise import pointwise_plan, residual_pointwise_plan, scaled_pointwise_plan

#: dense convs with at most this many taps per output (C * KH * KW) run the C rows kernel (``dwconv.c``):
#: stems (3 channels, 3x3: 27).  Measured against im2col + GEMM, 1 thread, cold caches, us: 3 -> 32 3x3 s2
#: at 224 545 / 713, 3 -> 16 302 / 517, 4 -> 32 at 56 156 / 245; even at 72 (8 -> 64 at 56, 522 / 557);
#: a 7x7 stem (147) is a draw, 32 -> 64 3x3 (288) 1.18x slower
ROWS_MAX_TAPS = 32
#: other dense convs of one image whose weights take at most this many values run im2col a band of output
#: rows at a time (:func:`im2col_plan`), bands of about ``CHUNK_ELEMENTS`` column values (1 MB).  Measured, 1
#: thread, caches flushed, against one im2col: 7x7 s2 stems 3 -> 64 0.78-0.87, 3 -> 96 0.92; AlexNet's 11x11
#: s4 0.92; 64 -> 64 3x3 s2 0.90; 16 -> 64 3x3 at 55 0.96; 5x5 16 -> 32, 32 -> 64 0.86-0.87.  Larger weights
#: (128 -> 128 3x3 s2: 1.02, 256 -> 256 1.03) do not pay: OpenBLAS packs them again for every band, so they
#: take one.  The compiled im2col against numpy's (the table kernel, both with the GEMM, bias and relu; 1
#: thread, caches flushed, ms): ResNet-50's 3x3 s2 128 at 56 2.80 / 3.16, 256 at 28 2.80 / 3.02, 512 at 14
#: 3.29 / 3.52, 3x3 512 at 7 3.29 / 3.51; Inception's 128 -> 192 s2 at 14 0.39 / 0.54, 96 s2 at 28 0.48 /
#: 0.64; the 7x7 stem 3.01 / 3.41 (numpy's banded im2col); ResNet-50's strided 1x1s 0.91-0.96
CHUNK_MAX_WEIGHTS, CHUNK_ELEMENTS = 40_000, 1 << 18


def fused_pays(taps: int) -> bool:
    """Whether ``gemm.c`` packs a conv of ``taps`` (KH * KW) taps straight from the input, or from the bands'
    column matrix (``im2col.c``).  Measured in ResNet-50 (1 thread, paired, us): the same within 1-4% either
    way (3x3 s2 2506 / 2624, stem 2825 / 2866, 1x1 s2 at 56 2145 / 2103); alone, 5x5, 7x7 and 11x11 kernels
    of few channels 0.89-0.92x (ZFNet 1.02x faster whole), strided 1x1s 1.02-1.05x slower."""
    return taps > 1


def general_kernel(kernel, attrs) -> Callable[..., Any]:
    """The table's kernel on a conv step's inputs (x, w[, b], *rest), for inputs the plan was not made for."""

    def general(x, w_in, b_in=None, *r):
        return kernel(x, w_in, b_in, *r, **attrs)

    return general


def read_step(kernel, attrs, inputs, shape, dtype, scaled: bool = False, res: bool = False) -> Optional[ConvStep]:
    """The conv step of a float32 2-D conv with constant weights (and bias), or None / ``NotPlannable`` (bad
    attribute values).  ``scaled``: the conv of ``scale_fold`` reading (x, s, w[, b]) for conv(x * s, w[, b]), s
    (1, C, 1, 1) computed.  ``res``: the 1x1 conv of ``residual_fold`` reading (x, w, b, r) for
    act(conv(x, w, b) + r), r computed."""
    sshape = None
    if res:  # the residual last, after the bias (None when absent)
        if len(inputs) != 4 + scaled or computed(inputs[-1]) != (shape, F32):
            return None
        inputs = inputs[:-1] if inputs[-2] is not None else inputs[:-2]
    if scaled:
        s_spec = computed(inputs[1]) if len(inputs) in (3, 4) else None
        if s_spec is None or s_spec[1] != F32:
            return None
        sshape, inputs = s_spec[0], [inputs[0]] + inputs[2:]
    shuffle = attrs.get("input_shuffle", 1)
    if len(inputs) not in (2, 3) or dtype != F32 or type(shuffle) is not int:
        return None
    x_spec = computed(inputs[0])
    w, b = inputs[1], inputs[2] if len(inputs) == 3 else None
    if x_spec is None or not isinstance(w, np.ndarray) or not (b is None or isinstance(b, np.ndarray)):
        return None
    xshape, xdtype = x_spec
    if xdtype != F32 or w.dtype != F32 or len(xshape) != 4 or w.ndim != 4 or (b is not None and b.dtype != F32):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    with attribute_values():
        group, strides, dilations, begin, end, out = attrs_geometry(xshape, w.shape, attrs)
    n, c = xshape[:2]
    m = w.shape[0]
    if shape != (n, m) + out or (b is not None and b.size != m) or shuffle < 1 or c % shuffle:
        return None
    activation, act_attrs = attrs.get("activation"), attrs.get("activation_attrs")
    with attribute_values():
        act, lo, hi = compiled._activation(activation, act_attrs)
    if act == 0 and (activation is not None or act_attrs):
        return None  # an activation the C code does not apply: the general kernel's job
    bias = None if b is None else np.ascontiguousarray(b.reshape(m))
    return ConvStep(kernel, attrs, general_kernel(kernel, attrs), xshape, shape, sshape, w, b, bias,
                    None if bias is None else bias.ctypes.data, group, shuffle, strides, dilations, begin, end, out,
                    act, lo, hi, lib)


def conv_plan(kernel, attrs, inputs, shape, dtype, scaled: bool = False, res: bool = False):
    """A plan for a float32 2-D conv with constant weights (and bias) (``scaled``, ``res``: :func:`read_step`),
    or None; ``NotPlannable`` for attribute values the table kernel reports."""
    if attrs.get("input_shuffle", 1) != 1 and not (scaled or res):
        shuffled = shuffled_conv_plan(kernel, attrs, inputs, shape, dtype)
        if shuffled is not None:
            return shuffled
    step = read_step(kernel, attrs, inputs, shape, dtype, scaled, res)
    if step is None:
        return None
    w, xshape, group, strides, dilations, begin, end, out = step.w, step.xshape, step.group, step.strides, \
        step.dilations, step.begin, step.end, step.out
    n, c, h, wd = xshape
    m = w.shape[0]
    depthwise = w.shape[1] == 1 and group == c and group > 1
    if step.shuffle != 1 and not (depthwise and m == c):
        return None  # ShuffleNet's shuffle: only the depthwise kernels read it in place
    if res and not (group == 1 and w.shape[2:] == (1, 1)):
        return None  # the residual: only the 1x1 plan adds it in its epilogue
    if scaled:
        if group != 1 or math.prod(step.sshape) != c or step.sshape[-2:] != (1, 1):
            return None
    elif min(begin + end) >= 0 and (_takes(winograd, xshape, w, strides, dilations, group)
                                    or winograd.four_takes(_stand_in(xshape), w, strides, dilations, group)):
        return winograd_plan(step)
    elif depthwise or (group == 1 and w.shape[2:] != (1, 1) and c * w.shape[2] * w.shape[3] <= ROWS_MAX_TAPS):
        return rows_plan(step)
    if (group == 1 or not scaled) and n == 1 and w.shape[2:] == (1, 1) and strides == (1, 1) \
            and begin == (0, 0) and out == (h, wd):
        if res and not scaled:
            return residual_pointwise_plan(step)
        if not scaled:
            return pointwise_plan(step)
        return scaled_pointwise_plan(step, res)
    if not (scaled or res) and group == 1 and n == 1 and (w.shape[2:] != (1, 1) or strides != (1, 1)) \
            and min(begin + end) >= 0 \
            and fast_path(_stand_in(xshape), w, strides, dilations, 1) is None:
        return im2col_plan(step)
    return None


def shuffled_conv_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a conv that is not depthwise reading ShuffleNet's shuffle (``input_shuffle``, ShuffleNetV2's
    last 1x1 conv): the shuffled copy the table kernel makes first (``channel_shuffle``), then the plain
    conv's plan; or None (a depthwise conv reads the shuffle in place: :func:`rows_plan`)."""
    g, x_spec = attrs["input_shuffle"], computed(inputs[0]) if inputs else None
    if type(g) is not int or g < 2 or x_spec is None or len(x_spec[0]) != 4 or x_spec[0][1] % g:
        return None
    group = attrs.get("group", 1)
    with attribute_values():
        one_channel = x_spec[0][1] // group <= 1
    if one_channel and group != 1:
        return None
    inner = conv_plan(kernel, {k: v for k, v in attrs.items() if k != "input_shuffle"}, inputs, shape, dtype)
    return None if inner is None else lambda x, *rest: inner(channel_shuffle(x, g), *rest)


def winograd_plan(step: ConvStep):
    """Winograd, F(4x4, 3x3) where it pays (``winograd.four_pays``), the bias and activation in its output
    transform (``winograd.c``, ``winograd4.c``)."""
    w, b, bias, xshape, begin, end, lib, general = step.w, step.b, step.bias, step.xshape, step.begin, step.end, \
        step.lib, step.general
    c, m, out = xshape[1], w.shape[0], step.out
    four = winograd.four_pays(c, m, *out)
    u = winograd.transformed_weights4(w) if four else winograd.transformed_weights(w)
    flip = winograd.flip_pays(c, m, math.prod((o + 1 + 2 * four) // (2 + 2 * four) for o in out))
    u = np.ascontiguousarray(u.transpose(0, 2, 1)) if flip else u  # (T, C, M): V^T U^T
    for tag in ("winograd",) * (four or flip) + ("winograd4",) * (four and flip):
        prepared.forget(w, tag)  # the forms load_time prepared that this plan does not use: memory
    code, ready = (step.act, step.lo, step.hi), in_use(lib)
    run = winograd.compiled_winograd4 if four else winograd.compiled_winograd

    def winograd_conv(x, w_in, b_in=None, out=None):
        y = None
        if w_in is w and b_in is b and type(x) is np.ndarray and x.shape == xshape and x.dtype == F32 \
                and ready():
            y = run(x, u, bias, begin, end, code, lib, flip, out)
        return general(x, w_in, b_in) if y is None else y

    winograd_conv.keep, winograd_conv.into = (u, bias), True
    return winograd_conv


def rows_plan(step: ConvStep):
    """Depthwise (any channel multiplier, ShuffleNet's shuffle read in place), or a dense conv of few input
    channels (a stem): the C rows kernel (``dwconv.c``); depthwise: ``dwchan.c``'s channels-side-by-side kernel
    where it takes the shape (measured faster on every MobileNet/EfficientNet/ShuffleNet layer,
    ``compiled.CHAN_MAX_PLANE``)."""
    w, b, xshape, shape, strides, dilations, begin, out, lib, general = step.w, step.b, step.xshape, step.shape, \
        step.strides, step.dilations, step.begin, step.out, step.lib, step.general
    n, c, h, wd = xshape
    m = w.shape[0]
    wc = np.ascontiguousarray(w)
    dense = step.group == 1
    chan = not dense and compiled.takes_chan(h, wd, w.shape[2:], strides, dilations, begin, out)
    params, pptr = block(ctypes.c_long, (
        wc.ctypes.data, step.bptr or 0, n, c, h, wd, m if dense else m // c, w.shape[2], w.shape[3], strides[0],
        strides[1], dilations[0], dilations[1], begin[0], begin[1], out[0], out[1], step.act, step.shuffle,
        int(dense)))
    fparams, fptr = block(ctypes.c_float, (step.lo, step.hi))
    fn, ready = lib.rpcsrv_chan_block if chan else lib.rpcsrv_rows_block, in_use(lib)

    def rows(x, w_in, b_in=None, out=None):
        if w_in is not w or b_in is not b or type(x) is not np.ndarray or x.shape != xshape \
                or x.dtype != F32 or not x.flags.c_contiguous or not ready():
            return general(x, w_in, b_in)
        y = np.empty(shape, F32) if out is None else out
        if fn(address(x), address(y), pptr, fptr) != 0:
            raise MemoryError("depthwise conv: the compiled kernel could not allocate its scratch plane")
        return y

    rows.keep = (wc, step.bias, params, fparams)  # what the pointers point into lives as long as the plan
    rows.into = True
    return rows


def im2col_plan(step: ConvStep):
    """im2col (``im2col.c``: one pass from the input, the padding written as zeros) and the GEMM a band of
    output rows at a time, each product written into its columns of the output, then the compiled epilogue.
    Small weights (``CHUNK_MAX_WEIGHTS``) take bands of ``CHUNK_ELEMENTS`` column values: the band's columns
    stay in cache between their copy and their product, where the whole column matrix (a 7x7 stem's: 7.4 MB)
    streams through memory twice; larger ones one band (OpenBLAS would pack the weights again per band).
    With one BLAS thread, on the shapes ``gemm.im2col_takes``: ``gemm.c`` instead (``gemm.banded``), the
    weights packed once, the bias and activation in its tiles; kernels of more than one tap packed straight
    from the input (``rpcsrv_gemm_conv``: no column matrix), strided 1x1s from the bands' columns
    (:func:`fused_pays`)."""
    general, w, b, bptr, xshape, shape, strides, dilations, begin, act, lo, hi, lib = step.general, step.w, \
        step.b, step.bptr, step.xshape, step.shape, step.strides, step.dilations, step.begin, step.act, step.lo, \
        step.hi, step.lib
    c, h, wd = xshape[1:]
    (m, k), (oh, ow) = (w.shape[0], w[0].size), shape[2:]
    wmat = np.ascontiguousarray(w.reshape(m, k))
    band = max(1, CHUNK_ELEMENTS // (k * ow)) if m * k <= CHUNK_MAX_WEIGHTS else oh
    blocks = [block(ctypes.c_long, (c, h, wd, w.shape[2], w.shape[3], strides[0], strides[1], dilations[0],
                                    dilations[1], begin[0], begin[1], ow, r0, min(oh, r0 + band)))
              for r0 in range(0, oh, band)]
    bands = [(p[12] * ow, p[13] * ow, ptr) for p, ptr in blocks]
    params, pptr = block(ctypes.c_long, (bptr or 0, m, oh * ow, act))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    epilogue, lib_ready, columns = lib.rpcsrv_bias_act_block if (bptr or act) else None, in_use(lib), \
        lib.rpcsrv_im2col_f32
    # -- gemm.c (gemm.im2col_takes); None, or .on() False at a call (2 BLAS threads, switched off): OpenBLAS
    tiled = gemm.banded(lib, wmat, bptr, oh * ow, act, lo, hi)
    fused, geometry = fused_pays(w.shape[2] * w.shape[3]), bands[0][2]  # (the rows kernel ignores r0, r1)

    def im2col_chunks(x, w_in, b_in=None, out=None):
        if w_in is not w or b_in is not b or type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 \
                or not x.flags.c_contiguous or not lib_ready():
            return general(x, w_in, b_in)
        y = np.empty((m, oh * ow), F32) if out is None else out.reshape(m, oh * ow)
        xa, ya, on = address(x), address(y), tiled is not None and tiled.on()
        if on and fused and gemm.SWITCH["fused"]:
            tiled.whole(xa, ya, geometry)
            return y.reshape(shape) if out is None else out
        cols = np.empty(k * min(oh, band) * ow, F32)
        ca = address(cols)
        for q0, q1, ptr in bands:
            columns(xa, ca, ptr)
            if on:
                tiled(ca, ya + 4 * q0, q1 - q0)
            else:
                np.matmul(wmat, cols[:k * (q1 - q0)].reshape(k, q1 - q0), out=y[:, q0:q1])
        if epilogue is not None and not on:
            epilogue(ya, pptr, fptr)
        return y.reshape(shape) if out is None else out

    im2col_chunks.keep, im2col_chunks.into = (wmat, params, fparams, blocks, tiled), True
    return im2col_chunks


def _stand_in(xshape) -> np.ndarray:
    """A float32 array of ``xshape`` that takes no memory (asked which fast path a conv would take)."""
    return np.broadcast_to(np.zeros((), F32), xshape)


def _takes(module, xshape, w, strides, dilations, group) -> bool:
    """Whether the general conv would take the fast path of ``module`` for an input of ``xshape`` (asked
    with a zero-stride stand-in of that shape: no memory)."""
    path = fast_path(_stand_in(xshape), w, strides, dilations, group)
    return path is not None and path.module is module


#: op -> planner(kernel, attrs, inputs, shape, dtype): the conv and the forms of it the ExampleJSON rewrites make
PLANNERS = {"conv": conv_plan,
            "scaled_conv": lambda *args: conv_plan(*args, scaled=True),
            "residual_conv": lambda *args: conv_plan(*args, res=True),
            "scaled_residual_conv": lambda *args: conv_plan(*args, scaled=True, res=True)}
