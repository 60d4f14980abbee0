"""ONNX Conv (1-D/2-D/3-D, strides, pads/auto_pad, dilations, groups) and ConvTranspose.

Conv is an im2col product: the input is copied once into a (N, C*K, Q) column matrix (see
``im2col``: no copy for 1x1 convs, contiguous row runs for stride 1) and multiplied by the (M, C*K)
weight matrix with one BLAS call, which leaves the result directly in NCHW order.  The bias rides
in the product as an extra weight column when C*K is small against Q (a stem conv) or, for 1x1 convs
that read their input in place, when copying the input with a ones row per group costs less than the
add (``_gemm_conv``); else it is one broadcast add.  A fused relu runs in place.  Attributes are
checked and pads resolved once per geometry (``_geometry``).  Depthwise convolutions (one input channel per group) are
no GEMM: 1-D and 2-D ones run in ``depthwise`` (whole-array multiply-adds in a rows layout, 2-3x faster
than over a window view), 3-D ones accumulate ``kernel_size`` broadcast multiply-adds over the window
view (``_depthwise``); both beat a per-group loop of tiny matrix products.  3x3 stride-1 float32 convs
with enough channels and outputs run as Winograd F(2x2, 3x3) (``winograd``: 2.25x fewer flops).
Float16 is computed in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import numpy as np

from ..clib import compiled
from . import taps, winograd
from .depthwise import channel_shuffle, depthwise_conv
from .im2col import columns
from ..registry import apply_activation, bad, register
from ..windows import pad_spatial, resolve_pads, spatial_attr, windows


@register("conv")
def conv(x, w, b=None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None,
         pads=None, strides=None, activation=None, activation_attrs=None, input_shuffle: int = 1):
    """ONNX Conv; ``kernel_shape`` is optional and must match the weights when given.

    ``input_shuffle`` (rpcsrv, the compiler's channel-shuffle composite): X's channels are first shuffled
    in that many groups, as ShuffleNet's Reshape → Transpose → Reshape does; a depthwise conv does it
    in its layout copy, others on a shuffled copy of X."""
    x, w = np.asarray(x), np.asarray(w)
    k = x.ndim - 2
    n = x.shape[0] if x.ndim else 0
    m, cg = w.shape[:2] if w.ndim >= 2 else (0, 0)
    kernel = w.shape[2:]
    strides, dilations, begin, end, out = _geometry(x.shape, w.shape, group, _tup(kernel_shape), _tup(pads),
                                                    _tup(strides), _tup(dilations), auto_pad)
    dtype = x.dtype
    ct = np.dtype(np.float32) if dtype == np.float16 else dtype
    x, w = x.astype(ct, copy=False), w.astype(ct, copy=False)
    bias = None if b is None else np.asarray(b).astype(ct, copy=False).reshape(m)
    if input_shuffle < 1 or x.shape[1] % input_shuffle:
        raise bad("conv", f"input_shuffle must be a divisor of C={x.shape[1]} (>= 1), got {input_shuffle}")
    depthwise = cg <= 1 and group != 1 and k <= 2  # the 1-D/2-D depthwise branch below
    if input_shuffle > 1 and not depthwise:
        x = channel_shuffle(x, input_shuffle)
    fast = fast_path(x, w, strides, dilations, group)
    if fast is not None:
        y = fast.run(x, w, begin, end)
        if bias is not None:
            y += bias.reshape(m, 1, 1)
        y = apply_activation(y, activation, activation_attrs, "conv")
    elif cg > 1 or group == 1:  # ungrouped, or grouped with several channels per group: one (batched) GEMM
        y = _gemm_conv(x, w, bias, kernel, strides, dilations, begin, end, out, activation, activation_attrs,
                       group)
    elif depthwise:
        y, lib = None, compiled.library() if k == 2 else None
        if lib is not None:  # the C kernel (``compiled``), bias and activation fused
            y = compiled.depthwise_conv2d(channel_shuffle(x, input_shuffle) if input_shuffle > 1 else x, w, bias,
                                          strides, dilations, begin, out, activation, activation_attrs, lib)
            if y is not None and activation is not None and not compiled.fuses(activation, activation_attrs):
                y = apply_activation(y, activation, activation_attrs, "conv")
        if y is None:
            y = apply_activation(depthwise_conv(x, w, bias, strides, dilations, begin, end, out, input_shuffle),
                                 activation, activation_attrs, "conv")
    else:
        win = windows(pad_spatial(x, begin, end, 0), kernel, strides, dilations, out)  # (N, C, O..., K...)
        y = _depthwise(win, w, n, group, m // group, k, math.prod(out))
        y = y.reshape((n, m) + tuple(out))
        if bias is not None:
            y += bias.reshape((m,) + (1,) * k)
        y = apply_activation(y, activation, activation_attrs, "conv")
    return y.astype(dtype, copy=False)


class FastPath(NamedTuple):
    """A path that beats im2col on the layers its module's ``usable`` accepts (measured per layer):
    ``run(x, w, begin, end)`` computes the conv, ``prepare(w)`` what it derives from the weights
    (cached).  Looked up in the module at each call, so the module stays the one place to change."""

    module: Any
    run_name: str
    prepare_name: str

    def usable(self, *args) -> bool:
        return self.module.usable(*args)

    def run(self, *args) -> np.ndarray:
        return getattr(self.module, self.run_name)(*args)

    def prepare(self, w: np.ndarray) -> Any:
        return getattr(self.module, self.prepare_name)(w)


FAST_PATHS = (FastPath(taps, "taps_conv", "stacked"), FastPath(winograd, "winograd_conv", "transformed_weights"))


def fast_path(x, w, strides, dilations, group) -> Optional[FastPath]:
    """The first fast path that takes this layer, or None (im2col or depthwise); Winograd first where its
    compiled transforms beat the others (``winograd.preferred``)."""
    if winograd.preferred(x, w, strides, dilations, group):
        return FAST_PATHS[1]
    for path in FAST_PATHS:
        if path.usable(x, w, strides, dilations, group):
            return path
    return None


def _tup(values):
    """A list attribute as a hashable tuple (None stays None)."""
    return None if values is None else tuple(values)


def attrs_geometry(xshape, wshape, attrs) -> tuple:
    """``(group, strides, dilations, begin, end, out)`` of a conv node's attributes (``group``,
    ``kernel_shape``, ``pads``, ``strides``, ``dilations``, ``auto_pad``) over these shapes, checked as the
    kernel checks them (a run plan calls it inside ``plan_support.attribute_values``)."""
    group = int(attrs.get("group", 1))
    return (group, *_geometry(xshape, tuple(wshape), group, _tup(attrs.get("kernel_shape")), _tup(attrs.get("pads")),
                              _tup(attrs.get("strides")), _tup(attrs.get("dilations")),
                              attrs.get("auto_pad", "NOTSET")))


@functools.lru_cache(maxsize=512)
def _geometry(xshape, wshape, group, kernel_shape, pads, strides, dilations, auto_pad):
    """The checked attributes and resolved pads of one conv geometry, (strides, dilations, begin, end,
    out) as tuples: computed once per geometry (a model has a few dozen), not on every call."""
    if len(xshape) < 3 or len(wshape) != len(xshape):
        raise bad("conv", f"need X (N, C, spatial...) and W of the same rank, got {xshape} and {wshape}")
    k = len(xshape) - 2
    c, (m, cg), kernel = xshape[1], wshape[:2], list(wshape[2:])
    if kernel_shape is not None and [int(v) for v in kernel_shape] != kernel:
        raise bad("conv", f"kernel_shape {list(kernel_shape)} does not match weights {wshape}")
    if group < 1 or c % group or m % group or cg * group != c:
        raise bad("conv", f"group={group} does not fit C={c}, W {wshape}")
    strides = spatial_attr(strides, k, 1, "strides", "conv")
    dilations = spatial_attr(dilations, k, 1, "dilations", "conv")
    begin, end, out = resolve_pads("conv", xshape[2:], kernel, strides, dilations, pads, auto_pad)
    return tuple(strides), tuple(dilations), tuple(begin), tuple(end), tuple(out)


def _gemm_conv(x, w, bias, kernel, strides, dilations, begin, end, out, activation, activation_attrs, group=1):
    """Conv as one (M, C*K) x (C*K, Q) product per image, bias and activation included; grouped convs
    as one batched product of (G, M/G, C/G*K) weights with the (N, G, C/G*K, Q) column matrix (the
    columns of channel c are rows c*K.. so each group's rows are contiguous: no copy per group).

    Returns (N, M, O...): a fresh array, or a cropped view of one when the columns were "flat"
    (their extra positions are computed and dropped; see ``im2col``).
    """
    n, m = x.shape[0], w.shape[0]
    rows, mg = w[0].size, m // group
    # the compiled epilogue (bias and activation in one pass, ``compiled.bias_activation``) when it takes them
    fused = compiled.epilogue_library(x, activation, activation_attrs) if n == 1 else None
    # the bias as one more weight column beats a pass over the result when C*K < Q (and no pass is due anyway)
    ones = group == 1 and bias is not None and rows < math.prod(out) and not (fused and activation is not None)
    cols, grid, along = columns(x, kernel, strides, dilations, begin, end, out, ones_row=ones, out_channels=m)
    q = cols.shape[-1]
    wmat, cols = w.reshape(group, mg, rows), cols.reshape(n, group, cols.shape[1] // group, q)
    if bias is not None and not along and not fused and 2 * m * q > x.shape[1] * q + m * rows \
            and np.may_share_memory(cols, x):
        # columns that are the input itself (1x1): a copy of the input with a ones row per group and of the
        # weights with the bias column, so that the bias rides in the product, cost less than a bias pass
        # over the output when that is larger than both (its rows of q < 4096 values run numpy's slow
        # loops, at about twice the cost per value): 2-5 us per ShuffleNet layer, 40 us where it widens
        # 24 -> 112 channels at 56x56, 80-130 us on ResNet's widening 1x1s
        ones = np.empty((n, group, rows + 1, q), x.dtype)
        ones[:, :, :rows] = cols
        ones[:, :, rows] = 1
        cols, along = ones, True
    if along:  # per call: caching it would cost a comparison pass over the weights (see ``prepared``)
        wmat = np.concatenate([wmat, bias.reshape(group, mg, 1)], axis=2)
    if group == 1:
        y = wmat[0] @ cols[0, 0] if n == 1 else np.matmul(wmat[0], cols[:, 0])
    else:
        y = np.matmul(wmat, cols).reshape(n, m, q)
        y = y[0] if n == 1 else y
    if fused and (activation is not None or (bias is not None and not along)) \
            and compiled.bias_activation(y, None if along else bias, activation, activation_attrs, fused):
        y = y.reshape((n, m) + grid)
        return y if grid == tuple(out) else y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]
    if bias is not None and not along:
        y += bias.reshape(m, 1)
    # relu runs over the whole buffer in one pass; other activations only see real outputs
    whole = grid == tuple(out) or (activation == "relu" and not activation_attrs)
    if whole:
        y = apply_activation(y, activation, activation_attrs, "conv")
    y = y.reshape((n, m) + grid)
    if grid != tuple(out):
        y = y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]
    return y if whole else apply_activation(y, activation, activation_attrs, "conv")


def _depthwise(win, w, n, group, mg, k, osize):
    """Grouped conv with one input channel per group, as broadcast multiply-adds per kernel tap (3-D
    convs; 1-D and 2-D ones run in ``depthwise``).

    Each tap is a strided (N, G, O...) view of the window view, so every pass is a long
    vectorised loop; ``tmp`` avoids allocating a product per tap.
    """
    # win: (N, G, O..., K...); w: (G*Mg, 1, K...) -> per tap a (G, Mg) column of weights
    out_shape = win.shape[2:2 + k]
    wk = w.reshape((group, mg) + w.shape[2:])
    bcast = (1, group, mg) + (1,) * k
    y = np.zeros((n, group, mg) + out_shape, dtype=w.dtype)
    tmp = np.empty_like(y)
    for tap in np.ndindex(*w.shape[2:]):
        plane = win[(Ellipsis,) + tap][:, :, None]  # (N, G, 1, O...)
        np.multiply(plane, wk[(slice(None), slice(None)) + tap].reshape(bcast), out=tmp)
        y += tmp
    return y.reshape(n, group, mg, osize)


@register("conv_transpose")
def conv_transpose(x, w, b=None, *, auto_pad: str = "NOTSET", dilations=None, group: int = 1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None, strides=None):
    """ONNX ConvTranspose: scatter-add of ``x @ W`` taps into the (un)padded output, then cropped."""
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise bad("conv_transpose", f"need X and W of the same rank >= 3, got {x.shape}, {w.shape}")
    k = x.ndim - 2
    n, c = x.shape[:2]
    if w.shape[0] != c or c % group:
        raise bad("conv_transpose", f"W {w.shape} / group={group} does not fit C={c}")
    mg, kernel = w.shape[1], list(w.shape[2:])
    if kernel_shape is not None and [int(v) for v in kernel_shape] != kernel:
        raise bad("conv_transpose", f"kernel_shape {kernel_shape} does not match weights {w.shape}")
    strides = spatial_attr(strides, k, 1, "strides", "conv_transpose")
    dilations = spatial_attr(dilations, k, 1, "dilations", "conv_transpose")
    opad = [0] * k if output_padding is None else [int(v) for v in output_padding]
    ins = x.shape[2:]
    full = [(i - 1) * s + (kk - 1) * d + 1 + op for i, s, kk, d, op in zip(ins, strides, kernel, dilations, opad)]
    if output_shape is not None:
        target = [int(v) for v in output_shape][-k:]
        total = [f - t for f, t in zip(full, target)]  # negative: the output grows with zeros
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(ins, strides)]
        total = [f - t for f, t in zip(full, target)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        p = [0] * (2 * k) if pads is None or auto_pad == "VALID" else [int(v) for v in pads]
        begin = p[:k]
        target = [f - p[i] - p[k + i] for i, f in enumerate(full)]
    ct = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    xg = x.astype(ct).reshape((n, group, c // group) + tuple(ins))
    wg = w.astype(ct).reshape((group, c // group, mg) + tuple(kernel))
    y = np.zeros((n, group, mg) + tuple(full), dtype=ct)
    # contributions of every kernel tap: einsum over input channels, then a strided add
    for tap in np.ndindex(*kernel):
        contrib = np.einsum("ngc...,gcm->ngm...", xg, wg[(slice(None),) * 3 + tap])
        sl = tuple(slice(t * d, t * d + (i - 1) * s + 1, s) for t, d, i, s in zip(tap, dilations, ins, strides))
        y[(slice(None),) * 3 + sl] += contrib
    y = y.reshape((n, group * mg) + tuple(full))
    # crop to [begin, begin + target) of the full output, zero-filling beyond either edge
    grow = [(max(-bg, 0), max(bg + t - f, 0)) for bg, t, f in zip(begin, target, full)]
    if any(g != (0, 0) for g in grow):
        y = np.pad(y, [(0, 0), (0, 0)] + grow)
        begin = [bg + g[0] for bg, g in zip(begin, grow)]
    y = y[(slice(None),) * 2 + tuple(slice(bg, bg + t) for bg, t in zip(begin, target))]
    if b is not None:
        y = y + np.asarray(b).astype(ct).reshape((-1,) + (1,) * k)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)
