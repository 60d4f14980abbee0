"""2-D stride-1 convolutions with few output channels as one GEMM over all kernel taps, then shifted adds.

im2col copies every input channel once per kernel tap (C*K rows) before its product; when the conv
has few outputs against its inputs (DenseNet's 128 -> 32 3x3 convs) that copy costs more than the
product.  Here the input is padded once into a flat per-channel layout of padded rows (width ``WP``),
and one product ``(K*M, C) @ (C, L)`` computes every tap's contribution at every padded position.
Output position ``o = oy*WP + ox`` then sums tap ``(dy, dx)``'s plane at ``o + dy*WP + dx``: K shifted
adds of M planes, M*K values per output instead of C*K copied ones.  The columns past each output row
(``WP - OW`` of them) are computed and dropped; the result is a cropped view.

``usable`` routes a conv here where that was measured faster than im2col and Winograd (1 thread,
``bench/taps_bench.py``); the tap-stacked weights are prepared once per weight array (``prepared``).
"""

from __future__ import annotations

import numpy as np

from ..prepared import prepared
from ..windows import dense_stride1_2d

#: at most this many output channels per input channel (M <= C * RATIO), where the K shifted adds of M
#: planes stay cheaper than im2col's K copies of C
MAX_OUT_PER_IN = 0.5
#: smallest output image (positions): below it the per-tap passes are too short to pay
MIN_POSITIONS = 49
#: set False to turn the path off (benchmarks compare paths)
ENABLED = True


def usable(x: np.ndarray, w: np.ndarray, strides, dilations, group: int) -> bool:
    """Whether ``conv`` should run this layer as a stacked-taps GEMM."""
    return (ENABLED and dense_stride1_2d(x, strides, dilations, group) and w.shape[2] * w.shape[3] > 1
            and w.shape[0] <= x.shape[1] * MAX_OUT_PER_IN and x.shape[2] * x.shape[3] >= MIN_POSITIONS)


def stacked(w: np.ndarray) -> np.ndarray:
    """(K*M, C) weights, tap-major: rows ``k*M .. k*M+M`` are tap k's (M, C) matrix."""
    m, c, kh, kw = w.shape
    return prepared(w, "taps", None, lambda: np.ascontiguousarray(w.transpose(2, 3, 0, 1).reshape(kh * kw * m, c)))


def taps_conv(x: np.ndarray, w: np.ndarray, begin, end) -> np.ndarray:
    """Conv of x (N, C, H, W) with w (M, C, KH, KW), stride 1, pads ``begin``/``end`` (H, W): (N, M, OH, OW)."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    hp, wp = h + begin[0] + end[0], wd + begin[1] + end[1]
    oh, ow = hp - kh + 1, wp - kw + 1
    q = oh * wp
    # padded rows, flat per channel, with kw - 1 values of slack for the last row's right-most taps
    xp = np.zeros((n, c, hp * wp + kw - 1), np.float32)
    xp[:, :, :hp * wp].reshape(n, c, hp, wp)[:, :, begin[0]:begin[0] + h, begin[1]:begin[1] + wd] = x
    z = np.matmul(stacked(w), xp).reshape(n, kh * kw, m, -1)
    y = z[:, 0, :, :q].copy()
    for k in range(1, kh * kw):
        dy, dx = divmod(k, kw)
        off = dy * wp + dx
        y += z[:, k, :, off:off + q]
    return y.reshape(n, m, oh, wp)[:, :, :, :ow]
