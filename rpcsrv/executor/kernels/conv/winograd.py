"""Winograd F(2x2, 3x3) for 3x3 stride-1 2-D convolutions, as 16 batched GEMMs.

Each 2x2 output tile is computed from a 4x4 input tile with 16 multiplies per (input, output) channel
pair instead of 36: 2.25x fewer GEMM flops than im2col.  The three transforms (Lavin & Gray, 2015):

* weights ``U = G g G^T`` (4x4 per (M, C) pair), once per weight array and values (``prepared.py``:
  model weights are constants that live as long as their executor; a weight that can change is
  checked by value);
* inputs ``V = B^T d B`` per tile, as sums and differences of strided views of the padded input (one
  pass over the input per term, written straight into the (16, C, tiles) GEMM operand);
* outputs ``Y = A^T (U V) A``, as sums of the 16 products written into the strided output tiles.

With the compiled kernels (``clib/compiled.py``) both transforms run in C (``winograd.c``: one pass each, 3-5x
faster than these numpy passes, which stay the fallback), and a run plan (``plans_conv.py``) has the output
transform add the bias and apply the fused activation as well.

Float32 rounding grows with the transforms' coefficients; ``tests/kernels/test_winograd.py`` bounds the
error against a direct float64 convolution on random data, and ``usable`` keeps Winograd to the
geometries that bound was tested on and where it was measured faster than im2col.
"""

from __future__ import annotations

import numpy as np

from ..clib import compiled
from ..prepared import prepared
from ..windows import dense_stride1_2d

_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)

#: smallest input/output channel counts and output tile count for which the transforms pay: measured
#: per layer against im2col (1 thread, best of 25): 0.76-0.87x at 28x28 and 14x14 with 64-256 channels
#: and at 56x56 with 48-64, even at 32 channels (56x56), 3x slower at 7x7 (512 channels: 16 tiles, the
#: transformed weights dominate)
MIN_CHANNELS = 48
MIN_TILES = 49
#: fewer output channels pay only on large images (DenseNet's 128 -> 32 convs: 0.55x at 56x56, 1.0x at
#: 28x28, 1.2x at 14x14)
FEW_OUT_CHANNELS, FEW_OUT_MIN_TILES = 16, 400
#: small images (7x7 outputs: 16 tiles) pay with many output channels while the transformed weights
#: (16*M*C floats) stay cache-sized: measured 0.71-0.91x for 160-320 channel layers (Inception's 7x7
#: ones), 1.03-1.19x for 384x384 and 512x512, 1.06-1.47x with fewer than 128 input or output channels
SMALL_MIN_TILES, SMALL_MIN_OUT, SMALL_MIN_IN, SMALL_MAX_WEIGHTS = 16, 160, 128, 110_000
#: with the compiled transforms (``winograd.c``) Winograd pays far more widely, and beats the stacked taps
#: (``taps``) too: measured per layer with bias and relu, 1 thread, caches flushed, compiled Winograd /
#: the path taken before (us): DenseNet's 128 -> 32 at 56, 28, 14, 7: 0.78, 0.59, 0.55, 0.57 of the taps;
#: SqueezeNet's 32 -> 128 at 27 0.61 of im2col; 512 -> 128 at 14 0.53, 1024 -> 256 at 7 0.46 of the taps;
#: 32 -> 32..128 at 7..56 0.47-0.77 of im2col; 48 -> 16 0.59-0.62.  Not with 16 input channels (up to 2.3x
#: slower with 128 outputs), nor on small images with many channels both sides (256x256 at 7x7: 1.06)
COMPILED_MIN_IN, COMPILED_MIN_OUT, COMPILED_SMALL_MAX_WEIGHTS = 32, 16, 32768
#: largest input channels tested against the error bound
MAX_CHANNELS = 1024
#: set False to turn Winograd off (benchmarks compare both)
ENABLED = True


def usable(x: np.ndarray, w: np.ndarray, strides, dilations, group: int) -> bool:
    """Whether ``conv`` should run this layer as Winograd F(2x2, 3x3)."""
    return (_geometry_fits(x, w, strides, dilations, group)
            and ((MIN_CHANNELS <= x.shape[1] and _tiles_pay(w.shape[0], *x.shape[1:])) or _compiled_pays(x, w)))


def preferred(x: np.ndarray, w: np.ndarray, strides, dilations, group: int) -> bool:
    """Whether Winograd should take this layer before the other fast paths (the stacked taps): where the
    compiled transforms are in use and were measured faster (``COMPILED_*``)."""
    return _geometry_fits(x, w, strides, dilations, group) and _compiled_pays(x, w)


def _geometry_fits(x, w, strides, dilations, group) -> bool:
    return (ENABLED and dense_stride1_2d(x, strides, dilations, group) and w.shape[2:] == (3, 3)
            and x.shape[1] <= MAX_CHANNELS)


def _compiled_pays(x: np.ndarray, w: np.ndarray) -> bool:
    m, c, h, wd = w.shape[0], *x.shape[1:]
    if c < COMPILED_MIN_IN or m < COMPILED_MIN_OUT or compiled.library() is None:
        return False
    tiles = ((h + 1) // 2) * ((wd + 1) // 2)
    return tiles >= MIN_TILES or (tiles >= SMALL_MIN_TILES and (m * c <= COMPILED_SMALL_MAX_WEIGHTS or 2 * m <= c))


def _tiles_pay(m: int, c: int, h: int, w: int) -> bool:
    tiles = ((h + 1) // 2) * ((w + 1) // 2)
    if tiles < MIN_TILES:
        return tiles >= SMALL_MIN_TILES and m >= SMALL_MIN_OUT and c >= SMALL_MIN_IN and m * c <= SMALL_MAX_WEIGHTS
    return m >= MIN_CHANNELS or (m >= FEW_OUT_CHANNELS and tiles >= FEW_OUT_MIN_TILES)


def transformed_weights(w: np.ndarray) -> np.ndarray:
    """(16, M, C) float32 ``G g G^T`` of (M, C, 3, 3) weights, computed once per weight array (and again
    only if its values change)."""
    return prepared(w, "winograd", None, lambda: _transform(w))


def _transform(w: np.ndarray) -> np.ndarray:
    u = np.einsum("ij,mcjk,lk->ilmc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), dtype=np.float32)


def _input_transform(xp: np.ndarray, th: int, tw: int) -> np.ndarray:
    """(16, C, N*th*tw) ``B^T d B`` of the 4x4 tiles (stride 2) of the padded input xp (N, C, 2th+2, 2tw+2)."""
    n, c = xp.shape[:2]
    v = np.empty((4, 4, c, n, th, tw), np.float32)
    rows = [xp[:, :, r:r + 2 * th:2, :] for r in range(4)]  # row r of every tile: (N, C, th, Wp)
    t = [rows[0] - rows[2], rows[1] + rows[2], rows[2] - rows[1], rows[1] - rows[3]]
    for r in range(4):
        cols = [t[r][..., s:s + 2 * tw:2] for s in range(4)]  # (N, C, th, tw)
        out = [v[r, s].transpose(1, 0, 2, 3) for s in range(4)]
        np.subtract(cols[0], cols[2], out=out[0])
        np.add(cols[1], cols[2], out=out[1])
        np.subtract(cols[2], cols[1], out=out[2])
        np.subtract(cols[1], cols[3], out=out[3])
    return v.reshape(16, c, n * th * tw)


def _output_transform(m: np.ndarray, n: int, th: int, tw: int) -> np.ndarray:
    """(N, M, 2th, 2tw) ``A^T m A`` from the (16, M, N*th*tw) products."""
    mo = m.shape[1]
    m = m.reshape(4, 4, mo, n, th, tw)
    y = np.empty((n, mo, 2 * th, 2 * tw), np.float32)
    r0 = m[0] + m[1] + m[2]  # (4, M, N, th, tw): the tile's first output row, per column s
    r1 = m[1] - m[2] - m[3]
    for a, r in enumerate((r0, r1)):
        np.add(r[0] + r[1], r[2], out=y[:, :, a::2, 0::2].transpose(1, 0, 2, 3))
        np.subtract(r[1] - r[2], r[3], out=y[:, :, a::2, 1::2].transpose(1, 0, 2, 3))
    return y


def winograd_conv(x: np.ndarray, w: np.ndarray, begin, end) -> np.ndarray:
    """3x3 stride-1 convolution of x (N, C, H, W) with w (M, C, 3, 3), pads ``begin``/``end``: (N, M, OH, OW)."""
    y = compiled_winograd(x, transformed_weights(w), None, begin, end)
    return y if y is not None else _numpy_winograd(x, w, begin, end)


def compiled_winograd(x: np.ndarray, u: np.ndarray, bias, begin, end, act=(0, 0.0, 0.0), lib=None,
                      flipped: bool = False, out=None):
    """The conv with transformed weights ``u`` (16, M, C) by the compiled transforms (``winograd.c``), the
    bias (M,) float32 contiguous or None and the activation (``compiled._activation``'s code, low, high)
    in the output transform: a fresh (N, M, OH, OW) array, or None without the compiled kernels, for other
    dtypes or layouts, or negative pads (the numpy transforms then run).  ``flipped``: ``u`` is (16, C, M),
    the products computed as V^T U^T (see :func:`flip_pays`).  ``out``: a C-contiguous float32 array of the
    output's shape to write into (then returned) instead of a fresh one."""
    return _compiled(2, x, u, bias, begin, end, act, lib, flipped, out)


#: per output tile size: the points of the transformed tile, the compiled input and output transforms
_TRANSFORMS = {2: (16, "rpcsrv_wino_in_f32", "rpcsrv_wino_out_f32", "plane"),
               4: (36, "rpcsrv_wino4_in_f32", "rpcsrv_wino4_out_f32", "planes")}


def _compiled(size: int, x, u, bias, begin, end, act, lib, flipped: bool, out):
    """F(size x size, 3x3) by the compiled transforms (``winograd.c``, ``winograd4.c``): see
    :func:`compiled_winograd`."""
    lib = lib or compiled.library()
    if lib is None or x.dtype != np.float32 or x.ndim != 4 or min(begin) < 0 or min(end) < 0:
        return None
    points, transform_in, transform_out, planes = _TRANSFORMS[size]
    x = np.ascontiguousarray(x)
    n, c, h, wd = x.shape
    oh, ow = h + begin[0] + end[0] - 2, wd + begin[1] + end[1] - 2
    th, tw = (oh + size - 1) // size, (ow + size - 1) // size
    v = np.empty((points, c, n * th * tw), np.float32)
    if getattr(lib, transform_in)(x.ctypes.data, v.ctypes.data, n, c, h, wd, begin[0], begin[1], th, tw):
        raise MemoryError(f"winograd: the compiled input transform could not allocate its {planes}")
    m = u.shape[2 if flipped else 1]
    prod = _products(u, v, m, flipped)
    y = np.empty((n, m, oh, ow), np.float32) if out is None else out  # out: C-contiguous (concat_fold)
    if getattr(lib, transform_out)(prod.ctypes.data, y.ctypes.data, None if bias is None else bias.ctypes.data,
                                   n, m, th, tw, oh, ow, *act):
        raise MemoryError("winograd: the compiled output transform could not allocate its rows")
    return y


#: F(4x4, 3x3) (``winograd4.c``, run plans only): 6x6 input tiles, 4x4 output tiles, 36 GEMMs over a quarter
#: of the tiles, 1.78x fewer flops than F(2x2).  Measured against F(2x2) with the compiled transforms (bias
#: and relu, 1 thread, caches flushed): 0.70-0.79 at 56x56 (32 -> 64, 64 -> 64, 64 -> 192), 0.77-0.84 at
#: 28x28 with 96 -> 96 up to 256 -> 256, 0.91-0.95 with 4096 channel pairs (64 -> 64, 128 -> 32, SqueezeNet's
#: 32 -> 128 at 27x27), 0.96-0.99 with fewer (32 -> 32, 48 -> 48); 0.99-1.33 at 14x14 (16 tiles), 1.57 at
#: 7x7: so from FOUR_MIN_TILES 4x4 tiles with FOUR_MIN_PAIRS channel pairs, or FOUR_MIN_TILES_WIDE with
#: FOUR_MIN_WEIGHTS; not with few channel pairs (16 -> 16 at 56x56: 1.11, 8 -> 32: 1.02; 16 -> 64: 0.82,
#: 32 -> 32 at 112x112: 0.78).  It also takes layers of FOUR_MIN_IN .. COMPILED_MIN_IN input channels that no
#: Winograd took: SqueezeNet's 16 -> 64 at 55x55, 0.74x of the planned im2col (0.58 / 0.78 ms), 24 -> 64 at
#: 56x56 0.64x
FOUR_MIN_TILES, FOUR_MIN_TILES_WIDE, FOUR_MIN_WEIGHTS, FOUR_MIN_PAIRS, FOUR_MIN_IN = 196, 49, 4096, 1024, 16
FOUR_ENABLED = True
_G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)


def four_pays(c: int, m: int, oh: int, ow: int) -> bool:
    """Whether F(4x4, 3x3) beats F(2x2, 3x3) for C -> M channels and an OH x OW output (measured above)."""
    tiles = ((oh + 3) // 4) * ((ow + 3) // 4)
    return FOUR_ENABLED and ((tiles >= FOUR_MIN_TILES and m * c >= FOUR_MIN_PAIRS)
                             or (tiles >= FOUR_MIN_TILES_WIDE and m * c >= FOUR_MIN_WEIGHTS))


def four_takes(x: np.ndarray, w: np.ndarray, strides, dilations, group: int) -> bool:
    """Whether a run plan should take this layer as F(4x4, 3x3) though no Winograd fast path takes it (fewer
    than ``COMPILED_MIN_IN`` input channels), for an input like ``x`` (a stand-in of its shape will do)."""
    m, c, h, wd = w.shape[0], *x.shape[1:]
    return _geometry_fits(x, w, strides, dilations, group) and c >= FOUR_MIN_IN and four_pays(c, m, h, wd)


def transformed_weights4(w: np.ndarray) -> np.ndarray:
    """(36, M, C) float32 ``G g G^T`` of (M, C, 3, 3) weights for F(4x4, 3x3), once per weight array."""
    return prepared(w, "winograd4", None, lambda: np.ascontiguousarray(
        np.einsum("ij,mcjk,lk->ilmc", _G4, w.astype(np.float64), _G4).reshape(36, *w.shape[:2]), np.float32))


def compiled_winograd4(x: np.ndarray, u: np.ndarray, bias, begin, end, act=(0, 0.0, 0.0), lib=None,
                       flipped: bool = False, out=None):
    """As :func:`compiled_winograd`, by F(4x4, 3x3) with ``u`` from :func:`transformed_weights4`."""
    return _compiled(4, x, u, bias, begin, end, act, lib, flipped, out)


#: few tiles, few output channels and not few input channels: the batched products as V^T U^T (``u`` stored
#: (T, C, M), the result written through a transposed view of the (T, M, tiles) array the output transform
#: reads), which OpenBLAS blocks better there.  Measured per planned layer (bias and relu, 1 thread, caches
#: flushed) against U V: 0.83-0.90x for DenseNet's 128 -> 32 and 128 -> 64 at 14x14 (49 tiles), 0.84-0.92x
#: for 96 -> 128, 96 -> 96 and 128 -> 128 there, 0.88x and 0.93x for F(4x4)'s 128 -> 128 and 96 -> 96 at 28x28
#: (49 tiles); not with 64 input channels (64 -> 64 and 64 -> 96 at 28x28: 1.02-1.06x), nor on more tiles
#: (0.98-1.06x at 196) or more output channels (0.93-1.0x for 160 and 256, 1.07x for 512)
FLIP_MAX_TILES, FLIP_MAX_OUT, FLIP_MIN_IN = 49, 128, 96


def flip_pays(c: int, m: int, tiles: int) -> bool:
    """Whether the products should be computed as V^T U^T (``FLIP_*``) for C -> M channels and ``tiles``."""
    return tiles <= FLIP_MAX_TILES and m <= FLIP_MAX_OUT and c >= FLIP_MIN_IN


def _products(u: np.ndarray, v: np.ndarray, m: int, flipped: bool) -> np.ndarray:
    """(T, M, tiles) = U V for u (T, M, C), or (V^T U^T)^T for ``flipped`` u (T, C, M)."""
    if not flipped:
        return np.matmul(u, v)
    prod = np.empty((v.shape[0], m, v.shape[2]), np.float32)
    np.matmul(v.transpose(0, 2, 1), u, out=prod.transpose(0, 2, 1))
    return prod


def _numpy_winograd(x: np.ndarray, w: np.ndarray, begin, end) -> np.ndarray:
    n, c, h, wd = x.shape
    oh, ow = h + begin[0] + end[0] - 2, wd + begin[1] + end[1] - 2
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    xp = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), np.float32)
    # the input inside the padding (a negative pad crops)
    src = x[:, :, max(0, -begin[0]):h - max(0, -end[0]), max(0, -begin[1]):wd - max(0, -end[1])]
    r0, c0 = max(0, begin[0]), max(0, begin[1])
    rows, cols = min(src.shape[2], xp.shape[2] - r0), min(src.shape[3], xp.shape[3] - c0)
    xp[:, :, r0:r0 + rows, c0:c0 + cols] = src[:, :, :rows, :cols]
    prod = np.matmul(transformed_weights(w), _input_transform(xp, th, tw))
    y = _output_transform(prod, n, th, tw)
    return y if (2 * th, 2 * tw) == (oh, ow) else y[:, :, :oh, :ow]
