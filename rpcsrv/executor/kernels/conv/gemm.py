"""The compiled 1x1-conv GEMM (``gemm.c``) for the run plans: the weights packed once, per plan; the bias, a
residual and the fused activation applied to each tile as it is stored, a squeeze-and-excitation scale to the
input as it is packed.  ``plans_conv.py``'s pointwise plans call it on the shapes :func:`takes`, and run numpy's
matmul (OpenBLAS) + the separate epilogue pass everywhere else.  ``plans_linalg.matmul_plan`` runs MatMuls by
constant weights (transformer encoders' Linear layers) on it the same way (:func:`planned_matmul`,
:func:`takes_matmul`): the weights packed once into its column strips, the input's rows per call into its
row panels, the bias per column.

Why: OpenBLAS computes these products near the core's peak, and so does ``gemm.c`` (~75 GFLOP/s of the 83
here, 1 thread); what the pair loses inside a model is (a) the second pass over outputs that no longer fit in
cache (MobileNetV2's expand 1x1s at 112x112 and 56x56 write 1.8-4.8 MB), and (b) OpenBLAS packs the weights
again at every call, from memory by then: the late 14x14 and 7x7 layers have the largest weights (up to
1.6 MB).  MobileNetV2's convs took 0.92x of their time inside its run, MobileNetV3's 0.90x (docs/executor.md,
"The 1x1 convs' own GEMM").  The cost: the packed copy of the weights (MobileNetV2's peak RSS 38 -> 48 MB).
The kernel is single-threaded: with more than one BLAS thread in use (``compute.POLICY``) the plans take
OpenBLAS, which uses them.

The im2col plan (``plans_conv.im2col_plan``: stride-2 3x3s and 1x1s, 3x3s on 7x7 maps, stems, 5x5s, 11x11s)
runs its product here too (:func:`banded`): the column matrix packed straight from the input
(``rpcsrv_gemm_conv``) or from im2col.c's bands (``rpcsrv_gemm_band``).  Per layer inside ResNet-50 0.79-0.97x
of OpenBLAS + epilogue (its 512 -> 512 3x3s at 7x7: 0.79-0.83x, 9.4 MB of weights OpenBLAS packs again per
call); the cost, the packed copy: ResNet-50's peak RSS 276 -> 314 MB (docs/executor.md).
"""

from __future__ import annotations

import ctypes
import math
from typing import Callable, Optional

import numpy as np

from ..clib import compiled
from ..plan_support import F32, address, block

#: the compiled GEMM runs 1x1 convs whose output rows (H * W) are at least this long.  Measured (1 thread,
#: ``bench/gemm_ab.py``): alone, every MobileNetV2 and ResNet-50 1x1 shape 0.74-1.03x of OpenBLAS +
#: epilogue, 7x7 maps included; inside the models every map from 7x7 up ran faster (7x7 and 14x14 layers
#: 0.71-0.94x: OpenBLAS packs the weights again per call, from memory); the squeeze-and-excitation convs on
#: 1x1 maps (a matrix-vector product: 1152 -> 48, 672 -> 28) 1.3-1.6x slower.  Sizes between not measured.
MIN_COLUMNS = 16
#: ``SWITCH["on"] = False``: planned 1x1 convs take OpenBLAS + epilogue at their next call (paired benchmarks);
#: ``SWITCH["im2col"]``: the same for the im2col plan's convs (:func:`banded`)
SWITCH = {"on": True, "im2col": True, "fused": True}


def takes(m: int, k: int, q: int) -> bool:
    """Whether a 1x1 conv of ``k`` input and ``m`` output channels over ``q`` positions runs ``gemm.c``."""
    return q >= MIN_COLUMNS and m >= 1 and k >= 1


def im2col_takes(m: int, k: int, q: int) -> bool:
    """Whether a dense conv planned by im2col (M output channels, K = C * KH * KW, Q output positions) runs its
    GEMM by ``gemm.c``."""
    return q >= MIN_COLUMNS and m >= 1 and k >= 1


def _one_thread(key: str = "on") -> Callable[[], bool]:
    """Whether the BLAS runs one thread now (the compute policy's last setting; unset: the caller's own),
    and the switch ``SWITCH[key]`` is on."""
    from ...compute import POLICY

    blas = POLICY.blas
    return lambda: SWITCH[key] and (blas.current or 1) <= 1


def packed_weights(lib: ctypes.CDLL, wmat: np.ndarray) -> np.ndarray:
    """(M, K) float32 weights in ``gemm.c``'s panels (MR rows interleaved along K, zero-padded)."""
    m, k = wmat.shape
    mr = int(lib.rpcsrv_gemm_mr())
    wp = np.empty(-(-m // mr) * mr * k + 8, F32)  # (8: read past the last panel, not used)
    w = np.ascontiguousarray(wmat, F32)
    lib.rpcsrv_gemm_pack_w(w.ctypes.data, wp.ctypes.data, m, k)
    return wp


def planned(lib: ctypes.CDLL, wmat: np.ndarray, bptr: Optional[int], shape: tuple, act: int, lo: float,
            hi: float) -> Optional[Callable[..., Optional[np.ndarray]]]:
    """A function ``(x, s=None, r=None)`` of C-contiguous float32 arrays (the plan checked them) that returns
    y = act(wmat @ (s * x) + r + bias), of ``shape`` (M rows of Q values), by ``gemm.c``, or None while more
    than one BLAS thread runs (then OpenBLAS's turn); or None itself when the shape does not take the kernel
    (:func:`takes`).  Its ``.keep`` holds what its arguments point into (the plan keeps it)."""
    m, k = wmat.shape
    q = math.prod(shape) // m
    if not takes(m, k, q):
        return None
    wp = packed_weights(lib, wmat)
    params, pptr = block(ctypes.c_long, (wp.ctypes.data, bptr or 0, m, k, q, act))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    fn, one_thread = lib.rpcsrv_gemm_block, _one_thread()

    def tiled(x: np.ndarray, s: Optional[np.ndarray] = None, r: Optional[np.ndarray] = None, out=None):
        if not one_thread():
            return None
        y = np.empty(shape, F32) if out is None else out  # out: C-contiguous, ``shape``'s size (concat_fold)
        if fn(address(x), 0 if s is None else address(s), 0 if r is None else address(r), address(y), pptr, fptr):
            raise MemoryError("1x1 conv: the compiled GEMM could not allocate its packing buffer")
        return y

    tiled.keep = (wp, params, fparams)
    return tiled


def banded(lib: ctypes.CDLL, wmat: np.ndarray, bptr: Optional[int], q: int, act: int, lo: float,
           hi: float) -> Optional[Callable[[int, int, int], None]]:
    """For the im2col plan (``plans_conv.im2col_plan``): a function ``(cols, y, n)`` of addresses that writes
    act(wmat @ cols + bias) for a band of ``n`` columns (cols: K rows of n, contiguous) into ``y``, the band's
    first column of the (M, ``q``) output, by ``gemm.c``; its ``.on()`` says whether to call it now (False
    while more than one BLAS thread runs or the switch is off: OpenBLAS's turn).  None when the shape does not
    take it (:func:`im2col_takes`).  Its ``.keep`` holds what its arguments point into."""
    m, k = wmat.shape
    if not im2col_takes(m, k, q):
        return None
    wp = packed_weights(lib, wmat)
    params, pptr = block(ctypes.c_long, (wp.ctypes.data, bptr or 0, m, k, 0, act, q))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    fn, one_thread = lib.rpcsrv_gemm_band, _one_thread("im2col")

    def band(cols: int, y: int, n: int) -> None:
        if fn(cols, y, n, pptr, fptr):
            raise MemoryError("conv: the compiled GEMM could not allocate its packing buffer")

    conv_fn = lib.rpcsrv_gemm_conv

    def whole(x: int, y: int, geometry: int) -> None:
        if conv_fn(x, y, pptr, geometry, fptr):
            raise MemoryError("conv: the compiled GEMM could not allocate its packing buffer")

    band.on, band.whole, band.keep = one_thread, whole, (wp, params, fparams)
    return band


def gemm(x: np.ndarray, wmat: np.ndarray, bias=None, residual=None, scale=None, activation=None,
         activation_attrs=None) -> Optional[np.ndarray]:
    """act(wmat @ (scale * x) + residual + bias) for float32 x (K, Q), wmat (M, K), by ``gemm.c`` (any
    shape, tests and benchmarks; the plans call :func:`planned`): a fresh (M, Q) array, or None when the
    compiled kernels are unavailable or do not apply this activation."""
    lib = compiled.library()
    act, lo, hi = compiled._activation(activation, activation_attrs)
    if lib is None or (act == 0 and (activation is not None or activation_attrs)):
        return None
    m, k = wmat.shape
    q = x.shape[1]
    x = np.ascontiguousarray(x, F32)
    wp = packed_weights(lib, wmat)
    args = [None if a is None else np.ascontiguousarray(a, F32) for a in (scale, residual, bias)]
    y = np.empty((m, q), F32)
    addr = [None if a is None else a.ctypes.data for a in args]
    if lib.rpcsrv_gemm_f32(wp.ctypes.data, x.ctypes.data, addr[0], addr[1], addr[2], y.ctypes.data, m, k, q, act,
                           lo, hi) != 0:
        raise MemoryError("gemm: the compiled kernel could not allocate its packing buffer")
    return y


# -- MatMul by constant weights (a Linear layer: transformer encoders' Q/K/V, output and feed-forward
# products): y (rows, N) = act(x (rows, K) @ w (K, N) + bias[N]), ``rpcsrv_matmul_f32``: the same blocks and
# micro-kernel with the roles swapped, w packed once per plan into the column strips and x's rows packed per
# call into the row panels, the bias per column in the tile epilogue.

#: the compiled MatMul runs products of at least this many rows (tokens), or of 2 and more by weights of
#: at least BIG_WEIGHTS values.  Measured (1 thread, warm, ``bench/matmul_ab.py``): 128 and 384 rows by every
#: K, N in {256, 384, 768, 1024, 1536, 3072}: 0.80-0.93x and 0.88-0.99x of OpenBLAS + epilogue (~108 against
#: ~97 GFLOP/s); 8-64 rows by 384x384, 384x1536, 1536x384: 0.43-0.89x.  Under 8 rows OpenBLAS's small-matrix
#: path wins while the weights stay in L2 (2-5 rows by 384x384: 1.1-1.8x slower here; 2-3 rows by 256x1024
#: or 1024x256 1.4-2.1x) and loses on larger ones (2-7 rows by 768x768, 384x1536, 1536x384: 0.37-0.73x);
#: a single row is BLAS's matrix-vector product (ours 2.2-2.4x slower).
MIN_ROWS = 8
BIG_WEIGHTS = 1 << 19


def takes_matmul(rows: int, k: int, n: int) -> bool:
    """Whether a (rows, k) @ (k, n) MatMul by constant weights runs ``gemm.c``."""
    return k >= 1 and n >= 1 and (rows >= MIN_ROWS or rows >= 2 and k * n >= BIG_WEIGHTS)


def packed_strips(lib: ctypes.CDLL, w: np.ndarray) -> np.ndarray:
    """(K, N) float32 weights in ``gemm.c``'s column strips (KC-row blocks of NR columns, zero-padded)."""
    k, n = w.shape
    nr = int(lib.rpcsrv_gemm_nr())
    bp, wc = np.empty(-(-n // nr) * nr * k, F32), np.ascontiguousarray(w, F32)  # (wc: alive through the call)
    lib.rpcsrv_gemm_pack_b(wc.ctypes.data, bp.ctypes.data, k, n)
    return bp


def planned_matmul(lib: ctypes.CDLL, w: np.ndarray, bias: Optional[np.ndarray], rows: int, act: int, lo: float,
                   hi: float) -> Optional[Callable[[np.ndarray], Optional[np.ndarray]]]:
    """A function ``(x)`` of a C-contiguous float32 array of ``rows`` rows of K values (the plan checked it)
    that returns y = act(x @ w + bias), (rows, N), by ``gemm.c``, or None while more than one BLAS thread
    runs; or None itself when the shape does not take the kernel (:func:`takes_matmul`).  Its ``.keep``
    holds what its block points into."""
    k, n = w.shape
    if not takes_matmul(rows, k, n):
        return None
    bp = packed_strips(lib, w)
    params, pptr = block(ctypes.c_long, (bp.ctypes.data, 0 if bias is None else bias.ctypes.data, rows, k, n, act))
    fparams, fptr = block(ctypes.c_float, (lo, hi))
    fn, one_thread = lib.rpcsrv_matmul_block, _one_thread()

    def tiled(x: np.ndarray) -> Optional[np.ndarray]:
        if not one_thread():
            return None
        y = np.empty((rows, n), F32)
        if fn(address(x), address(y), pptr, fptr):
            raise MemoryError("MatMul: the compiled GEMM could not allocate its packing buffer")
        return y

    tiled.keep = (bp, bias, params, fparams)
    return tiled


def matmul(x: np.ndarray, w: np.ndarray, bias=None, activation=None, activation_attrs=None) -> Optional[np.ndarray]:
    """act(x @ w + bias) for float32 x (rows, K), w (K, N) by ``gemm.c`` (any shape; tests and benchmarks):
    a fresh (rows, N) array, or None when the compiled kernels are unavailable or do not apply this
    activation."""
    lib = compiled.library()
    act, lo, hi = compiled._activation(activation, activation_attrs)
    if lib is None or (act == 0 and (activation is not None or activation_attrs)):
        return None
    (rows, k), n = x.shape, w.shape[1]
    x, bp = np.ascontiguousarray(x, F32), packed_strips(lib, w)
    b = None if bias is None else np.ascontiguousarray(bias, F32)
    y = np.empty((rows, n), F32)
    if lib.rpcsrv_matmul_f32(x.ctypes.data, bp.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data,
                             rows, k, n, act, lo, hi) != 0:
        raise MemoryError("matmul: the compiled kernel could not allocate its packing buffer")
    return y
