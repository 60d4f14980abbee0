"""Run plans of the int8 ops (see ``plans.py``): each step's weights packed once, its requantization worked out
once, the compiled int8 kernels (``qgemm.c``, ``qconv.c``, ``qops.c``) called with their blocks ready.

* ``q_linear_conv``: dense convs of one group as the int8 GEMM of their patches (``rpcsrv_qconv``), depthwise
  convs by ``rpcsrv_qdwconv``; per-tensor or per-output-channel weights, int8 or uint8 activations and
  weights, an int32 bias, a fused Relu/Clip as the output clamp;
* ``q_linear_matmul``, ``q_gemm`` (quantized or float output), ``matmul_integer``, ``matmul_integer_to_float``
  and ``dynamic_quantize_matmul`` by constant 2-D weights: rows of the computed operand times the packed weights
  (``rpcsrv_qgemm``), the activation scale and zero point of the dynamic ops read at each call;
* ``quantize_linear``, ``dequantize_linear``, ``dynamic_quantize_linear`` (per tensor), ``q_linear_add`` (operands
  of one shape), ``q_linear_global_average_pool``, ``max_pool`` of int8 tensors, ``q_linear_sigmoid`` and
  ``q_linear_leaky_relu`` (a 256-entry table made by the table kernel itself).

4-D int8 results are channels-last views (``qpack.py``); the plans read both layouts.  Anything else (per-row
activation parameters, broadcasting adds, grouped convs, other ranks) runs the table kernel, as does any call
whose inputs are not what the plan was made for.
"""

from __future__ import annotations

import numpy as np

from ....loader.opset.quant import QuantParams, clamp_bounds, multiplier
from ..clib import compiled
from ..conv.conv import attrs_geometry
from ..plan_support import address, attribute_values, computed, in_use
from .qchain import Link, long_block, step_fn
from .qpack import F32, I32, Q8, PackedDepthwise, PackedGemm, geometry_blocks, nhwc_strides, qtype_signed, scalar


def _consts(inputs, first: int) -> tuple:
    """Inputs from ``first`` on, all constant (or absent): the tuple of them, or None."""
    rest = tuple(inputs[first:])
    return rest if all(c is None or isinstance(c, np.ndarray) for c in rest) else None


def same(given: tuple, bound: tuple) -> bool:
    """Whether ``given`` are the ``bound`` arrays (tuple equality takes identical items as equal without comparing
    them; arrays that are not identical compare elementwise, and are not taken unless their values are)."""
    try:
        return bool(given == bound)
    except ValueError:  # arrays of several values, not the bound ones
        return False


def q_conv_plan(kernel, attrs, inputs, shape, dtype):
    """A plan for a 2-D ``q_linear_conv`` of constant weights: dense (one group) or depthwise."""
    spec, rest = computed(inputs[0]) if inputs else None, _consts(inputs, 1)
    if spec is None or rest is None or len(inputs) not in (8, 9) or any(c is None for c in rest[:7]):
        return None
    (xshape, xdtype), (xs, xz, w, ws, wz, ys, yz) = spec, rest[:7]
    b = rest[7] if len(rest) == 8 else None
    xs, xz, ys, yz = scalar(xs), scalar(xz), scalar(ys), scalar(yz)
    if len(xshape) != 4 or xdtype not in Q8 or dtype not in Q8 or w.ndim != 4 or w.dtype not in Q8 or \
            None in (xs, xz, ys, yz) or xz.dtype != xdtype or yz.dtype != dtype or wz.dtype != w.dtype or \
            ws.size not in (1, w.shape[0]) or wz.size != ws.size or (b is not None and (b.dtype != I32 or
                                                                                      b.size != w.shape[0])):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    with attribute_values():
        group, strides, dilations, begin, _end, out = attrs_geometry(xshape, w.shape, attrs)
        lo, hi = clamp_bounds(attrs.get("activation"), attrs.get("activation_attrs"), QuantParams.of(ys, yz))
    n, c, m = xshape[0], xshape[1], w.shape[0]
    if shape != (n, m) + tuple(out) or min(begin) < 0:
        return None
    mult = multiplier(xs, ws.reshape(-1), ys)
    # a stride-2 stem whose patches the in-place tiles cannot read (channels not a multiple of 4: an image's 3)
    # runs over its space-to-depth copy, whose pixels they can (qconv_s2d.c)
    s2d = group == 1 and tuple(strides) == (2, 2) and tuple(dilations) == (1, 1) and min(w.shape[2:]) >= 3 and \
        c % 4 != 0 and w.dtype == np.int8 and not np.any(wz) and lib.rpcsrv_qconv_in_place(qtype_signed(xdtype))
    if s2d:
        w, xgeom = space_to_depth_weights(w), (n, 4 * c, out[0] + (w.shape[2] + 1) // 2 - 1,
                                               out[1] + (w.shape[3] + 1) // 2 - 1)
        strides, dilations, cbegin = (1, 1), (1, 1), (0, 0)
    else:
        xgeom, cbegin = xshape, begin
    if group == 1:
        k = xgeom[1] * w.shape[2] * w.shape[3]
        packed = PackedGemm(lib, w.transpose(2, 3, 1, 0).reshape(k, m), wz, b, mult, dtype, int(yz), lo, hi)
        name = "s2dconv" if s2d else "conv"
    elif group == c == m and w.shape[1] == 1:
        packed = PackedDepthwise(w, wz, b, mult, dtype, int(yz), lo, hi, int(xz))
        name = "dwconv"
    else:
        return None
    (nhwc_geom, nhwc_ptr), (nchw_geom, nchw_ptr) = geometry_blocks(xgeom, w.shape[2:], strides, dilations, cbegin,
                                                                     out, qtype_signed(xdtype), int(xz))
    nhwc, yshape, ptr = nhwc_strides(xshape), (n, out[0], out[1], m), packed.ptr
    xbase, state = (n, xshape[2], xshape[3], c), compiled._state  # (plan_support.in_use's check, inline)
    if s2d:  # (the copy's geometry is channels-last; the block says in which layout x comes)
        steps = {lay: long_block((ptr, nhwc_ptr, n, xshape[2], xshape[3], c, begin[0], begin[1], xgeom[2], xgeom[3],
                                  int(xz), first)) for lay, first in (("nhwc", 0), ("c", 1))}
    else:
        steps = {lay: long_block((ptr, geom)) for lay, geom in (("nhwc", nhwc_ptr), ("c", nchw_ptr))}
    fn, nhwc_blk, nchw_blk = getattr(lib, f"rpcsrv_qstep_{name}"), steps["nhwc"][1], steps["c"][1]

    def q_conv(x, *others):  # (checks inline: the commonest int8 step)
        try:
            fits = type(x) is np.ndarray and x.shape == xshape and x.dtype == xdtype and others == rest and \
                state.get("lib") is lib
        except ValueError:  # not the bound arrays (qpack.same)
            fits = False
        if not fits:
            return kernel(x, *others, **attrs)
        base = x.base
        if x.strides == nhwc and type(base) is np.ndarray and base.shape == xbase and base.flags.c_contiguous:
            blk, xaddr = nhwc_blk, address(base)  # a channels-last view: its base starts where it does
        else:
            x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            blk, xaddr = nchw_blk, address(x)
        y = np.empty(yshape, dtype)
        if fn(blk, xaddr, 0, address(y)) != 0:
            raise MemoryError("q_linear_conv: the compiled kernel could not allocate its scratch")
        return y.transpose(0, 3, 1, 2)

    q_conv.link = lambda layouts: Link(step_fn(lib, name), steps[layouts[0]][1], (0,), "nhwc")
    q_conv.keep = (packed, nhwc_geom, nchw_geom, steps)
    return q_conv


class Arg(int):
    """The index of an input whose one value a planned product reads at each call (a dynamic scale or zero point)."""


def _per_call(spec, index, cast, absent):
    """A one-element input as a number (constant), an :class:`Arg` (computed), ``absent`` (no input), or None."""
    if spec is None:
        return absent
    if isinstance(spec, np.ndarray):
        return cast(spec.reshape(())) if spec.size == 1 else None
    found = computed(spec)
    return Arg(index) if found is not None and int(np.prod(found[0], dtype=np.int64)) == 1 else None


def _rows_plan(kernel, attrs, inputs, shape, dtype, a_index, packed, lib, za, ascale):
    """The planned call of a product of the computed operand ``inputs[a_index]`` (rows of K) by ``packed``;
    ``za``/``ascale``: the activation's zero point and scale, ints/floats, or input indices read per call."""
    spec = computed(inputs[a_index])
    ashape, adtype = spec
    rows, kdim = int(np.prod(ashape[:-1], dtype=np.int64)), ashape[-1]
    signed, fn = qtype_signed(adtype), lib.rpcsrv_qgemm
    ready, n = in_use(lib), packed.n
    fixed = {k: v for k, v in enumerate(inputs) if k != a_index and isinstance(v, np.ndarray)}
    dynamic = isinstance(za, Arg) or isinstance(ascale, Arg)

    def product(*args):
        a = args[a_index]
        if type(a) is not np.ndarray or a.shape != ashape or a.dtype != adtype or not ready() or \
                any(args[k] is not v for k, v in fixed.items()):
            return kernel(*args, **attrs)
        if dynamic:
            zp = int(args[za]) if isinstance(za, Arg) else za
            sc = float(args[ascale]) if isinstance(ascale, Arg) else ascale
        else:
            zp, sc = za, ascale
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        y = np.empty(shape, dtype)
        if fn(packed.ptr, address(a), rows, kdim, signed, zp, sc, address(y), n) != 0:
            raise MemoryError("int8 GEMM: the compiled kernel could not allocate its scratch")
        return y

    product.keep = packed
    return product


def space_to_depth_weights(w: np.ndarray) -> np.ndarray:
    """A stride-2 conv's weights (M, C, KH, KW) as the stride-1 conv's over the input's 2x2 space-to-depth copy
    (``qconv_s2d.c``): (M, 4C, ceil(KH / 2), ceil(KW / 2)), channel (2p + q) C + c of tap (u, v) being the weight of
    tap (2u + p, 2v + q) of channel c (0 past the kernel)."""
    m, c, kh, kw = w.shape
    u, v = (kh + 1) // 2, (kw + 1) // 2
    padded = np.zeros((m, c, 2 * u, 2 * v), w.dtype)
    padded[:, :, :kh, :kw] = w
    return np.ascontiguousarray(padded.reshape(m, c, u, 2, v, 2).transpose(0, 3, 5, 1, 2, 4).reshape(m, 4 * c, u, v))


def _weights_2d(b, kdim):
    return b is not None and isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype in Q8 and b.shape[0] == kdim


def q_matmul_plan(kernel, attrs, inputs, shape, dtype):
    """``q_linear_matmul`` by constant weights: per-tensor a, b per tensor or per column, quantized output."""
    spec = computed(inputs[0]) if len(inputs) == 8 else None
    rest = _consts(inputs, 1)
    if spec is None or rest is None or any(c is None for c in rest) or spec[1] not in Q8 or dtype not in Q8:
        return None
    as_, az, b, bs, bz, ys, yz = rest
    as_, az, ys, yz = scalar(as_), scalar(az), scalar(ys), scalar(yz)
    if None in (as_, az, ys, yz) or not _weights_2d(b, spec[0][-1]) or len(spec[0]) < 1 or \
            bs.size not in (1, b.shape[1]) or bz.size != bs.size or shape != spec[0][:-1] + (b.shape[1],):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    with attribute_values():
        lo, hi = clamp_bounds(attrs.get("activation"), attrs.get("activation_attrs"), QuantParams.of(ys, yz))
    packed = PackedGemm(lib, b, bz, None, multiplier(as_, bs.reshape(-1), ys), dtype, int(yz), lo, hi)
    return _rows_plan(kernel, attrs, inputs, shape, dtype, 0, packed, lib, int(az), 1.0)


def q_gemm_plan(kernel, attrs, inputs, shape, dtype):
    """com.microsoft ``QGemm`` of a computed ``a`` (not transposed) by constant ``b``: quantized or float output."""
    spec, rest = computed(inputs[0]) if inputs else None, _consts(inputs, 1)
    if spec is None or rest is None or len(rest) < 6 or any(c is None for c in rest[:5]) or spec[1] not in Q8 or \
            len(spec[0]) != 2:
        return None
    as_, az, b, bs, bz = rest[:5]
    c = rest[5] if len(rest) > 5 else None
    ys, yz = (rest[6], rest[7]) if len(rest) > 7 else (rest[6] if len(rest) > 6 else None, None)
    with attribute_values():
        alpha, trans_a = float(attrs.get("alpha", 1.0)), int(attrs.get("transA", 0))
        trans_b = int(attrs.get("transB", 0))
    if trans_a or scalar(as_) is None or scalar(az) is None or b is None or b.ndim != 2 or b.dtype not in Q8:
        return None
    bk = b.T if trans_b else b
    n = bk.shape[1]
    if bk.shape[0] != spec[0][1] or bs.size not in (1, n) or bz.size != bs.size or \
            (c is not None and (c.dtype != I32 or c.size not in (1, n))) or shape != (spec[0][0], n):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    mult = (np.float32(alpha) * np.float32(scalar(as_)) * bs.reshape(-1).astype(F32)).astype(F32)
    if ys is None:
        if dtype != F32:
            return None
        packed = PackedGemm(lib, np.ascontiguousarray(bk), bz, c, mult, F32)
    else:
        ys, yz = scalar(ys), scalar(yz) if yz is not None else None
        if ys is None or yz is None or yz.dtype != dtype or dtype not in Q8:
            return None
        with attribute_values():
            lo, hi = clamp_bounds(attrs.get("activation"), attrs.get("activation_attrs"), QuantParams.of(ys, yz))
        packed = PackedGemm(lib, np.ascontiguousarray(bk), bz, c, (mult / np.float32(ys)).astype(F32), dtype,
                            int(yz), lo, hi)
    return _rows_plan(kernel, attrs, inputs, shape, dtype, 0, packed, lib, int(scalar(az)), 1.0)


def integer_matmul_plan(kernel, attrs, inputs, shape, dtype):
    """``matmul_integer`` (int32 sums), ``matmul_integer_to_float`` (float32, the activation's scale and zero
    point computed or constant) by constant 2-D weights."""
    spec = computed(inputs[0]) if inputs else None
    if spec is None or spec[1] not in Q8 or len(inputs) < 2 or not _weights_2d(inputs[1], spec[0][-1]):
        return None
    b, n = inputs[1], inputs[1].shape[1]
    lib = compiled.library()
    if lib is None or shape != spec[0][:-1] + (n,):
        return None
    get = lambda i: inputs[i] if i < len(inputs) else None  # noqa: E731
    if dtype == I32:  # matmul_integer(a, b, a_zp?, b_zp?)
        az, bz = get(2), get(3)
        if (az is not None and (not isinstance(az, np.ndarray) or az.size != 1)) or \
                (bz is not None and (not isinstance(bz, np.ndarray) or bz.size not in (1, n))):
            return None
        packed = PackedGemm(lib, b, 0 if bz is None else bz, None, np.ones(n, F32), I32)
        return _rows_plan(kernel, attrs, inputs, shape, dtype, 0, packed, lib, 0 if az is None else int(az), 1.0)
    # matmul_integer_to_float(a, b, a_scale, b_scale, a_zp?, b_zp?, bias?)
    a_scale, bs, az, bz, bias = get(2), get(3), get(4), get(5), get(6)
    if dtype != F32 or not isinstance(bs, np.ndarray) or bs.size not in (1, n) or \
            (bz is not None and (not isinstance(bz, np.ndarray) or bz.size not in (1, n))) or \
            (bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != F32 or bias.shape != (n,))):
        return None
    za, ascale = _per_call(az, 4, int, 0), _per_call(a_scale, 2, float, None)
    if za is None or ascale is None:
        return None
    packed = PackedGemm(lib, b, 0 if bz is None else bz, None, bs.reshape(-1).astype(F32), F32, fbias=bias)
    return _rows_plan(kernel, attrs, inputs, shape, dtype, 0, packed, lib, za, ascale)


PLANNERS_GEMM = {"q_linear_conv": q_conv_plan, "q_linear_matmul": q_matmul_plan, "q_gemm": q_gemm_plan,
                 "matmul_integer": integer_matmul_plan, "matmul_integer_to_float": integer_matmul_plan}
