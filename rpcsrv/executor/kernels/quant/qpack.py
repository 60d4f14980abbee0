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

from ..plan_support import block

U8, S8, I32, F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)
Q8 = (U8, S8)
#: the output kinds of the C epilogue (qgemm.h: QOUT_*)
OUT_KIND = {U8: 0, S8: 1, I32: 2, F32: 3}
#: qgemm.h's block (QG_*) and qconv.c's geometry block (CG_*) are long arrays in this order
QG_FIELDS = ("n", "k", "kp", "b", "bias", "colsum", "bzp", "mult", "fbias", "out", "yzp", "lo", "hi")
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
    fbias``)."""

    def __init__(self, lib, w: np.ndarray, bzp, bias: Optional[np.ndarray], mult: np.ndarray, out: np.dtype,
                 yzp: int = 0, lo: int = 0, hi: int = 0, fbias: Optional[np.ndarray] = None):
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
        values = dict(n=n, k=k, kp=kp, b=self.packed.ctypes.data, bias=addr(self.bias), colsum=addr(self.colsum),
                      bzp=addr(self.bzp), mult=addr(self.mult), fbias=addr(self.fbias), out=OUT_KIND[np.dtype(out)],
                      yzp=int(yzp), lo=int(lo), hi=int(hi))
        self._block, self.ptr = block(ctypes.c_long, [values[f] for f in QG_FIELDS])
        self.n, self.k = n, k


class PackedDepthwise:
    """A depthwise conv's weights (C, 1, KH, KW) as (KH * KW, C) int16 less their zero points, its int32 bias and
    float32 multipliers per channel, and the output's requantization (``qconv.c``'s DG_* block)."""

    def __init__(self, w: np.ndarray, wzp: np.ndarray, bias: Optional[np.ndarray], mult: np.ndarray, out: np.dtype,
                 yzp: int, lo: int, hi: int):
        c = w.shape[0]
        zps = np.broadcast_to(np.asarray(wzp).reshape(-1), (c,)).astype(np.int16)
        centred = w.astype(np.int16) - zps[:, None, None, None]
        self.w = np.ascontiguousarray(centred[:, 0].transpose(1, 2, 0).reshape(-1, c), np.int16)
        self.bias = np.ascontiguousarray(np.zeros(c, np.int32) if bias is None else bias.reshape(-1), np.int32)
        self.mult = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32).reshape(-1), (c,)), F32)
        self._block, self.ptr = block(ctypes.c_long, (self.w.ctypes.data, self.bias.ctypes.data,
                                                      self.mult.ctypes.data, OUT_KIND[np.dtype(out)], int(yzp),
                                                      int(lo), int(hi)))


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
