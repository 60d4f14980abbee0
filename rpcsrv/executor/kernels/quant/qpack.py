"""What the int8 run plans (``plans_quant.py``) prepare once per step for the compiled int8 kernels
(``qgemm.c``, ``qconv.c``, ``qops.c``): the packed weights with their requantization (:class:`PackedGemm`), the
depthwise weights (:class:`PackedDepthwise`), the parameter blocks, and the channels-last layout int8 tensors
keep between int8 ops.

**Channels-last between int8 ops.** A 4-D int8 tensor an int8 plan writes is declared (N, C, H, W), as the
graph says, but its memory is (N, H, W, C): the plan returns ``y.transpose(0, 3, 1, 2)`` of a C-contiguous
(N, H, W, C) array.  Every reader sees the right values (numpy's strides say where each one is); the int8 plans
recognise the layout by its strides (:func:`layout`) and read it in place, so a chain of int8 convs never
transposes, and a reader that needs another layout (a float op, a subgraph output) copies as numpy does.

**Requantization.** Each packed GEMM carries, per output column: the int32 bias, the column sums of its weights
(the activation zero point's term, worked out per call from them), the weight zero points when any is not 0,
and the float32 multiplier ``in_scale * w_scale / out_scale`` (:func:`rpcsrv.loader.opset.quant.multiplier`, in
float32 as onnxruntime computes it).  uint8 weights become int8 as they are packed (w - 128; their zero points
too), which changes no product of zero-point-centred values.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from ..plan_support import address, block

U8, S8, I32, F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
Q8 = (U8, S8)
QTYPE_BOUNDS = {U8: (0, 255), S8: (-128, 127)}
#: the output kinds of the C epilogue (qgemm.h: QOUT_*)
OUT_KIND = {U8: 0, S8: 1, I32: 2, F32: 3}
#: qgemm.h's block (QG_*) and qconv.c's geometry block (CG_*) are long arrays in this order
QG_FIELDS = ("n", "k", "kp", "b", "bias", "colsum", "bzp", "mult", "fbias", "out", "yzp", "lo", "hi", "sat")
CG_FIELDS = ("n", "h", "w", "c", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "oh", "ow", "signed", "za",
             "nchw")


def nhwc_strides(shape: tuple, itemsize: int = 1) -> tuple:
    """The strides of a (N, C, H, W) view of C-contiguous (N, H, W, C) memory."""
    n, c, h, w = shape
    return (h * w * c * itemsize, itemsize, w * c * itemsize, c * itemsize)


def contiguous_strides(shape: tuple, itemsize: int = 1) -> tuple:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def layout(x: np.ndarray, nhwc: tuple, nchw: tuple) -> Optional[str]:
    """"nhwc" when ``x`` is the channels-last view of its declared shape, "nchw" when C-contiguous, else None."""
    s = x.strides
    if s == nhwc:
        return "nhwc"
    if s == nchw or x.flags.c_contiguous:
        return "nchw"
    return None


def data(x: np.ndarray) -> int:
    """The address of the memory of ``x``: C-contiguous, or the channels-last view of a C-contiguous (N, H, W, C)
    array (then its base's, which starts where the view does; ``ctypes.data`` of a view cost 2 us)."""
    base = x.base
    if x.ndim == 4 and type(base) is np.ndarray and base.ndim == 4 and base.flags.c_contiguous and \
            base.shape == (x.shape[0], x.shape[2], x.shape[3], x.shape[1]) and not x.flags.c_contiguous:
        return address(base)
    return address(x)


def channels_last(y: np.ndarray) -> np.ndarray:
    """The (N, C, H, W) view of a C-contiguous (N, H, W, C) array."""
    return y.transpose(0, 3, 1, 2)


def qtype_signed(dtype: np.dtype) -> int:
    return int(np.dtype(dtype) == S8)


def scalar(a) -> Optional[np.ndarray]:
    """A one-element constant as a 0-d array, else None (per-row or per-column parameters)."""
    a = np.asarray(a)
    return a.reshape(()) if a.size == 1 else None


class PackedGemm:
    """B (k x n: ``w[kk, j]``) packed for the int8 GEMM with its requantization; ``ptr`` is the block's address.

    ``bzp``: the weights' zero points (scalar or per column); ``bias``: int32 per column (or None); ``mult``:
    float32 per column (the multiplier, or the float scale of a float output); ``out``: the result's dtype
    (uint8/int8 requantized with ``yzp`` and the clamp ``lo``..``hi``, int32 sums, or float32 ``acc * mult +
    fbias``, with ``relu`` then ``max(0, ...)``)."""

    def __init__(self, lib, w: np.ndarray, bzp, bias: Optional[np.ndarray], mult: np.ndarray, out: np.dtype,
                 yzp: int = 0, lo: int = 0, hi: int = 0, fbias: Optional[np.ndarray] = None, relu: bool = False):
        k, n = w.shape
        flip, signed = 0, w
        bz = np.broadcast_to(np.asarray(bzp, np.int64).reshape(-1), (n,)).astype(np.int64)
        if w.dtype == U8:
            flip, bz, signed = 0x80, bz - 128, (w ^ np.uint8(0x80)).view(S8)
        self.colsum = np.ascontiguousarray(signed.astype(np.int32).sum(axis=0), np.int32)
        self.bzp = np.ascontiguousarray(bz, np.int32) if np.any(bz) else None
        self.bias = None if bias is None else np.ascontiguousarray(np.broadcast_to(bias.reshape(-1), (n,)), np.int32)
        self.mult = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32).reshape(-1), (n,)), F32)
        self.fbias = None if fbias is None else np.ascontiguousarray(np.broadcast_to(fbias.reshape(-1), (n,)), F32)
        self.packed = np.empty(lib.rpcsrv_qgemm_packed_size(k, n), S8)
        src = np.ascontiguousarray(w)
        lib.rpcsrv_qgemm_pack(src.ctypes.data, k, n, n, 1, flip, self.packed.ctypes.data)
        kp = (k + 3) // 4 * 4
        addr = lambda a: 0 if a is None else a.ctypes.data  # noqa: E731
        # the clamp is the type's own and no sum times its multiplier reaches 2^30 (|x - x_zp|, |w - w_zp| <= 255):
        # the kernels may narrow with saturation instead of clamping first
        most = k * 255 * 255 + (0 if self.bias is None else int(np.abs(self.bias.astype(np.int64)).max(initial=0)))
        sat = np.dtype(out) in Q8 and (lo, hi) == QTYPE_BOUNDS[np.dtype(out)] and \
            most * float(np.abs(self.mult).max(initial=0)) < 2.0 ** 30
        if np.dtype(out) == F32:  # (the block's field says, for a float output, whether a Relu is fused)
            sat = relu
        values = dict(n=n, k=k, kp=kp, b=self.packed.ctypes.data, bias=addr(self.bias), colsum=addr(self.colsum),
                      bzp=addr(self.bzp), mult=addr(self.mult), fbias=addr(self.fbias), out=OUT_KIND[np.dtype(out)],
                      yzp=int(yzp), lo=int(lo), hi=int(hi), sat=int(sat))
        self._block, self.ptr = block(ctypes.c_long, [values[f] for f in QG_FIELDS])
        self.n, self.k = n, k


#: the order of a block of 32 channels in the AVX-512 depthwise kernel's registers (its byte unpacks work within
#: 128-bit lanes: one register holds channels 0-7 and 16-23, the other 8-15 and 24-31)
DW_ORDER = np.array(list(range(0, 8)) + list(range(16, 24)) + list(range(8, 16)) + list(range(24, 32)))


class PackedDepthwise:
    """A depthwise conv's weights (C, 1, KH, KW) less their zero points, its int32 bias and float32 multipliers per
    channel, and the output's requantization (``qconv.c``'s DG_* block): as (KH * KW, C) int32 for the plain C
    kernel, and for the AVX-512 one as int16 pairs of taps (tap 2p, tap 2p + 1 of each channel side by side, what
    vpdpwssd multiplies and adds) over channels padded to 32, in :data:`DW_ORDER`, with the multipliers in that order
    too and the bias less ``za`` (the activation zero point) times each channel's weight sum (that kernel sums x * w
    over every tap, a padded one reading the zero point)."""

    def __init__(self, w: np.ndarray, wzp: np.ndarray, bias: Optional[np.ndarray], mult: np.ndarray, out: np.dtype,
                 yzp: int, lo: int, hi: int, za: int):
        c = w.shape[0]
        zps = np.broadcast_to(np.asarray(wzp).reshape(-1), (c,)).astype(np.int32)
        centred = w.astype(np.int32) - zps[:, None, None, None]
        self.w = np.ascontiguousarray(centred[:, 0].transpose(1, 2, 0).reshape(-1, c), np.int32)
        self.bias = np.ascontiguousarray(np.zeros(c, np.int32) if bias is None else bias.reshape(-1), np.int32)
        self.mult = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32).reshape(-1), (c,)), F32)
        taps, cp = self.w.shape[0], (c + 31) // 32 * 32
        perm = np.concatenate([DW_ORDER + b for b in range(0, cp, 32)])
        wide = np.zeros((taps + taps % 2, cp), np.int16)
        wide[:taps, :c] = self.w
        self.w16 = np.ascontiguousarray(wide.reshape(-1, 2, cp)[:, :, perm].transpose(0, 2, 1))
        folded = self.bias.astype(np.int64) - za * self.w.astype(np.int64).sum(axis=0)  # (the zero points' taps)
        self.bias16 = np.ascontiguousarray(np.pad(folded.astype(np.int32), (0, cp - c))[perm])
        self.mult16 = np.ascontiguousarray(np.pad(self.mult, (0, cp - c))[perm])
        self._block, self.ptr = block(ctypes.c_long, (self.w.ctypes.data, self.bias.ctypes.data,
                                                      self.mult.ctypes.data, OUT_KIND[np.dtype(out)], int(yzp),
                                                      int(lo), int(hi), self.w16.ctypes.data,
                                                      self.bias16.ctypes.data, self.mult16.ctypes.data, cp))


def geometry_blocks(xshape, kernel, strides, dilations, begin, out, signed: int, za: int) -> tuple:
    """The conv geometry blocks for a channels-last input and a channels-first one: ((ctypes array, address), ...)."""
    n, c, h, w = xshape
    base = [n, h, w, c, kernel[0], kernel[1], strides[0], strides[1], dilations[0], dilations[1], begin[0], begin[1],
            out[0], out[1], signed, za]
    return block(ctypes.c_long, base + [0]), block(ctypes.c_long, base + [1])


def isa(lib) -> str:
    """The int8 micro-kernel this process runs (``qgemm.c`` picks it by the CPU's instructions)."""
    return lib.rpcsrv_qgemm_isa().decode()


def kernels(lib) -> list[tuple[str, bool]]:
    """Every int8 micro-kernel of the library: (name, whether this CPU runs it), best first."""
    found, k = [], 0
    supported = ctypes.c_long()
    while True:
        name = lib.rpcsrv_qgemm_kernel_name(k, ctypes.addressof(supported))
        if name is None:
            return found
        found.append((name.decode(), bool(supported.value)))
        k += 1
