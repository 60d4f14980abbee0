"""Run plans of the int8 ops around the products (see ``plans_quant.py`` for the products, ``plans.py`` for the
contract): QuantizeLinear and DequantizeLinear per tensor, DynamicQuantizeMatMul, QLinearAdd of operands of one
shape, QLinearGlobalAveragePool, MaxPool of int8 tensors, and the one-input elementwise ops (QLinearSigmoid,
QLinearLeakyRelu) as a 256-entry table that the op's own table kernel fills once.  4-D int8 results are
channels-last views (``qpack.py``)."""

from __future__ import annotations

import ctypes

import numpy as np

from ....loader.opset.quant import QuantParams, clamp_bounds
from ..clib import compiled
from ..plan_support import address, attribute_values, block, computed, in_use
from ..windows import resolve_pads, spatial_attr
from .plans_quant import _weights_2d, same
from .qchain import Link, f32_bits, long_block, step_fn
from .qpack import F32, Q8, U8, PackedGemm, channels_last, data, nhwc_strides, qtype_signed


def _qparams(scale, zp, default_dtype):
    """Per-tensor constant (scale, zero point, dtype) or None."""
    if not isinstance(scale, np.ndarray) or scale.size != 1 or (zp is not None and (not isinstance(zp, np.ndarray) or
                                                                                    zp.size != 1)):
        return None
    dtype = np.dtype(default_dtype) if zp is None else zp.dtype
    return np.float32(scale.reshape(())), 0 if zp is None else int(zp.reshape(())), dtype


def quantize_plan(kernel, attrs, inputs, shape, dtype):
    """``quantize_linear`` of float32 per tensor (4-D: written channels-last)."""
    spec = computed(inputs[0]) if inputs else None
    if spec is None or spec[1] != F32 or len(inputs) not in (2, 3) or dtype not in Q8 or shape != spec[0] or \
            attrs.get("block_size", 0) or attrs.get("saturate", 1) != 1:
        return None
    params = _qparams(inputs[1], inputs[2] if len(inputs) == 3 else None, U8)
    lib = compiled.library()
    if params is None or params[2] != dtype or lib is None:
        return None
    scale, zp, _ = params
    lo, hi = QuantParams.of(scale, np.asarray(zp, dtype)).bounds
    xshape, four = spec[0], len(spec[0]) == 4
    n, c, hw = (xshape[0], xshape[1], xshape[2] * xshape[3]) if four else (1, 1, int(np.prod(xshape, dtype=np.int64)))
    fn, ready, consts = lib.rpcsrv_quantize_f32, in_use(lib), tuple(inputs[1:])
    yshape = (xshape[0], xshape[2], xshape[3], xshape[1]) if four else xshape

    def quantize(x, *others):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous or \
                not ready() or not same(others, consts):
            return kernel(x, *others, **attrs)
        y = np.empty(yshape, dtype)
        fn(data(x), n, c, hw, scale, zp, lo, hi, int(four), data(y))
        return channels_last(y) if four else y

    step = long_block((n, c, hw, f32_bits(scale), zp, lo, hi, int(four)))
    quantize.link = lambda layouts: Link(step_fn(lib, "quantize"), step[1], (0,), "nhwc" if four else "c") \
        if layouts == ("c",) else None
    quantize.keep = step
    return quantize


def dequantize_plan(kernel, attrs, inputs, shape, dtype):
    """``dequantize_linear`` of int8/uint8 per tensor (a channels-last 4-D input read in place)."""
    spec = computed(inputs[0]) if inputs else None
    if spec is None or spec[1] not in Q8 or len(inputs) not in (2, 3) or dtype != F32 or shape != spec[0] or \
            attrs.get("block_size", 0):
        return None
    params = _qparams(inputs[1], inputs[2] if len(inputs) == 3 else None, spec[1])
    lib = compiled.library()
    if params is None or params[2] != spec[1] or lib is None:
        return None
    scale, zp, _ = params
    xshape, xdtype, four = spec[0], spec[1], len(spec[0]) == 4
    n, c, hw = (xshape[0], xshape[1], xshape[2] * xshape[3]) if four else (1, 1, int(np.prod(xshape, dtype=np.int64)))
    nhwc = nhwc_strides(xshape) if four else None
    fn, ready, consts, signed = lib.rpcsrv_dequantize_q8, in_use(lib), tuple(inputs[1:]), qtype_signed(xdtype)

    def dequantize(x, *others):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != xdtype or not ready() or \
                not same(others, consts):
            return kernel(x, *others, **attrs)
        last = four and x.strides == nhwc
        if not last and not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = np.empty(xshape, F32)
        fn(data(x), n, c, hw, signed, scale, zp, int(last), data(y))
        return y

    return dequantize


def dynamic_matmul_plan(kernel, attrs, inputs, shape, dtype):
    """com.microsoft ``DynamicQuantizeMatMul`` of computed float32 rows by constant int8 weights: the rows
    quantized as DynamicQuantizeLinear does (``rpcsrv_dynamic_quantize``), then the int8 GEMM with float output."""
    spec = computed(inputs[0]) if inputs else None
    get = lambda i: inputs[i] if i < len(inputs) else None  # noqa: E731
    b, bs, bz, bias = get(1), get(2), get(3), get(4)
    if spec is None or spec[1] != F32 or dtype != F32 or not _weights_2d(b, spec[0][-1]):
        return None
    n = b.shape[1]
    if not isinstance(bs, np.ndarray) or bs.size not in (1, n) or \
            (bz is not None and (not isinstance(bz, np.ndarray) or bz.size not in (1, n))) or \
            (bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != F32 or bias.shape != (n,))) or \
            shape != spec[0][:-1] + (n,):
        return None
    lib = compiled.library()
    with attribute_values():
        relu = attrs.get("activation") == "relu"
    if lib is None or set(attrs) - {"activation"} or attrs.get("activation") not in (None, "relu"):
        return None
    packed = PackedGemm(lib, b, 0 if bz is None else bz, None, bs.reshape(-1).astype(F32), F32, fbias=bias,
                        relu=relu)
    quantize, count = lib.rpcsrv_dynamic_quantize, int(np.prod(spec[0], dtype=np.int64))
    params = np.empty(2, F32)
    gemm, xshape, ready = lib.rpcsrv_qgemm, spec[0], in_use(lib)
    rows, kdim, consts = count // spec[0][-1], spec[0][-1], tuple(inputs[1:])

    def dynamic_matmul(x, *others, holder=None, first=True, last=True):
        if holder is not None and first:  # (nothing from an earlier call is ever read)
            holder[0] = None
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous or \
                not ready() or not same(others, consts):
            return kernel(x, *others, **attrs)
        kept = holder[0] if holder is not None else None
        if kept is not None and (kept[0] is x or kept[1] == data(x)):  # quantized by a step before, from this
            # very array or one of its shape over the same memory (a Reshape's view; the kept one holds it alive)
            q, p = kept[2], kept[3]
        else:
            q, p = np.empty(xshape, U8), params.copy()
            quantize(data(x), count, data(q), address(p))
            if holder is not None:
                holder[0] = (x, data(x), q, p)  # (one tuple: a thread reading it sees one step's whole)
        if holder is not None and last:
            holder[0] = None
        y = np.empty(shape, F32)
        if gemm(packed.ptr, data(q), rows, kdim, 0, int(p[1]), float(p[0]), data(y), n) != 0:
            raise MemoryError("int8 GEMM: the compiled kernel could not allocate its scratch")
        return y

    def sharing(holder: list, first: bool, last: bool):
        """The step reading its input's quantized rows from ``holder`` when a step before it in this call made them
        from the same array (else making them, and leaving them there unless ``last``); ``first`` empties it."""
        def shared(x, *others):
            return dynamic_matmul(x, *others, holder=holder, first=first, last=last)

        shared.holder = holder
        return shared

    dynamic_matmul.keep, dynamic_matmul.sharing = packed, sharing
    return dynamic_matmul


def q_add_plan(kernel, attrs, inputs, shape, dtype):
    """``q_linear_add`` of two computed operands of the node's shape, per tensor: one pass over both layouts."""
    if len(inputs) not in (7, 8) or dtype not in Q8:
        return None
    sa, sb = computed(inputs[0]), computed(inputs[3])
    pa = _qparams(inputs[1], inputs[2], dtype)
    pb = _qparams(inputs[4], inputs[5], dtype)
    pc = _qparams(inputs[6], inputs[7] if len(inputs) == 8 else None, dtype)
    lib = compiled.library()
    if sa is None or sb is None or sa != (shape, dtype) or sb != (shape, dtype) or None in (pa, pb, pc) or \
            pa[2] != dtype or pb[2] != dtype or pc[2] != dtype or lib is None:
        return None
    with attribute_values():
        lo, hi = clamp_bounds(attrs.get("activation"), attrs.get("activation_attrs"),
                              QuantParams.of(pc[0], np.asarray(pc[1], dtype)))
    nhwc = nhwc_strides(shape) if len(shape) == 4 else None
    fn, ready, count, signed = lib.rpcsrv_qadd, in_use(lib), int(np.prod(shape, dtype=np.int64)), qtype_signed(dtype)
    consts = (inputs[1], inputs[2], inputs[4], inputs[5], *inputs[6:])

    def q_add(a, as_, az, b, bs, bz, *c):
        if type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != shape or b.shape != shape or \
                a.dtype != dtype or b.dtype != dtype or not ready() or \
                not same((as_, az, bs, bz, *c), consts):
            return kernel(a, as_, az, b, bs, bz, *c, **attrs)
        last = nhwc is not None and a.strides == nhwc
        if last and b.strides != nhwc:
            b = channels_last(np.ascontiguousarray(b.transpose(0, 2, 3, 1)))
        elif not last:
            a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        y = np.empty((shape[0], shape[2], shape[3], shape[1]) if last else shape, dtype)
        fn(data(a), data(b), data(y), count, signed, pa[0], pa[1], pb[0], pb[1], pc[0], pc[1], lo, hi)
        return channels_last(y) if last else y

    step = long_block((count, signed, f32_bits(pa[0]), pa[1], f32_bits(pb[0]), pb[1], f32_bits(pc[0]), pc[1], lo, hi))
    q_add.link = lambda layouts: Link(step_fn(lib, "add"), step[1], (0, 3), layouts[0]) \
        if layouts[0] == layouts[1] else None
    q_add.keep = step
    return q_add


def q_gap_plan(kernel, attrs, inputs, shape, dtype):
    """``q_linear_global_average_pool`` of a 4-D int8 tensor (channels first, as the op's attribute says)."""
    spec = computed(inputs[0]) if inputs else None
    if spec is None or len(inputs) != 5 or spec[1] not in Q8 or len(spec[0]) != 4 or dtype != spec[1] or \
            attrs.get("channels_last", 0):
        return None
    px, py = _qparams(inputs[1], inputs[2], spec[1]), _qparams(inputs[3], inputs[4], spec[1])
    lib = compiled.library()
    n, c, h, w = spec[0]
    if px is None or py is None or px[2] != dtype or py[2] != dtype or shape != (n, c, 1, 1) or lib is None:
        return None
    lo, hi = QuantParams.of(py[0], np.asarray(py[1], dtype)).bounds
    mult = np.float32(px[0]) / (np.float32(py[0]) * np.float32(h * w))
    nhwc, xshape, consts = nhwc_strides(spec[0]), spec[0], tuple(inputs[1:])
    fn, ready, signed = lib.rpcsrv_qgap, in_use(lib), qtype_signed(dtype)

    def q_gap(x, *others):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != dtype or not ready() or \
                not same(others, consts):
            return kernel(x, *others, **attrs)
        if x.strides != nhwc:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        y = np.empty(shape, dtype)
        fn(data(x), n, h * w, c, signed, px[1], mult, py[1], lo, hi, data(y))
        return y

    step = long_block((n, h * w, c, signed, px[1], f32_bits(mult), py[1], lo, hi))
    q_gap.link = lambda layouts: Link(step_fn(lib, "gap"), step[1], (0,), "c") if layouts == ("nhwc",) else None
    q_gap.keep = step
    return q_gap


def q_maxpool_plan(kernel, attrs, inputs, shape, dtype):
    """``max_pool`` of a 4-D int8/uint8 tensor (no indices output), channels-last in and out."""
    spec = computed(inputs[0]) if len(inputs) == 1 else None
    if spec is None or spec[1] not in Q8 or len(spec[0]) != 4 or dtype != spec[1] or attrs.get("return_indices"):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    xshape = spec[0]
    with attribute_values():
        kernel_shape = [int(k) for k in attrs.get("kernel_shape")]
        strides = spatial_attr(attrs.get("strides"), 2, 1, "strides", "max_pool")
        dilations = spatial_attr(attrs.get("dilations"), 2, 1, "dilations", "max_pool")
        begin, _end, out = resolve_pads("max_pool", xshape[2:], kernel_shape, strides, dilations, attrs.get("pads"),
                                        attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0))
    if len(kernel_shape) != 2 or shape != tuple(xshape[:2]) + tuple(out) or min(begin) < 0 or min(out) < 1:
        return None
    geom, gptr = block(ctypes.c_long, (*kernel_shape, *strides, *dilations, begin[0], begin[1], out[0], out[1]))
    n, c, h, w = xshape
    nhwc, yshape = nhwc_strides(xshape), (n, out[0], out[1], c)
    fn, ready, signed = lib.rpcsrv_qmaxpool, in_use(lib), qtype_signed(dtype)

    def q_maxpool(x):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != dtype or not ready():
            return kernel(x, **attrs)
        if x.strides != nhwc:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        y = np.empty(yshape, dtype)
        fn(data(x), n, h, w, c, signed, gptr, data(y))
        return channels_last(y)

    step = long_block((n, h, w, c, signed, gptr))
    q_maxpool.link = lambda layouts: Link(step_fn(lib, "maxpool"), step[1], (0,), "nhwc") \
        if layouts == ("nhwc",) else None
    q_maxpool.keep = (geom, step)
    return q_maxpool


def q_table_plan(kernel, attrs, inputs, shape, dtype):
    """A one-input elementwise int8 op (QLinearSigmoid, QLinearLeakyRelu) as its 256-entry table, made by its own
    table kernel over every integer of the input type; the input's layout kept."""
    spec = computed(inputs[0]) if inputs else None
    if spec is None or spec[1] not in Q8 or shape != spec[0] or any(not isinstance(a, np.ndarray) for a in inputs[1:]
                                                                    if a is not None):
        return None
    lib = compiled.library()
    if lib is None:
        return None
    info = np.iinfo(spec[1])
    with attribute_values():
        table = np.asarray(kernel(np.arange(info.min, info.max + 1).astype(spec[1]), *inputs[1:], **attrs))
    if table.dtype != dtype or table.shape != (256,):
        return None
    table = np.ascontiguousarray(table).view(U8)
    fn, ready, xshape, xdtype = lib.rpcsrv_qlut, in_use(lib), spec[0], spec[1]
    consts, count, signed = tuple(inputs[1:]), int(np.prod(spec[0], dtype=np.int64)), qtype_signed(spec[1])
    nhwc = nhwc_strides(xshape) if len(xshape) == 4 else None

    def q_table(x, *others):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != xdtype or not ready() or \
                not same(others, consts):
            return kernel(x, *others, **attrs)
        last = nhwc is not None and x.strides == nhwc
        if not last and not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = np.empty((xshape[0], xshape[2], xshape[3], xshape[1]) if last else xshape, dtype)
        fn(data(x), count, signed, address(table), data(y))
        return channels_last(y) if last else y

    q_table.keep = table
    return q_table


PLANNERS_QOPS = {"quantize_linear": quantize_plan, "dequantize_linear": dequantize_plan,
                 "dynamic_quantize_matmul": dynamic_matmul_plan, "q_linear_add": q_add_plan,
                 "q_linear_global_average_pool": q_gap_plan, "q_linear_sigmoid": q_table_plan,
                 "q_linear_leaky_relu": q_table_plan}
