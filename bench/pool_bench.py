"""Pooling kernels and stem convs of the light model zoo, each against its own floor (issue 16).

For every pool geometry the zoo models use, the kernel (``rpcsrv.executor.kernels.pool.pool``) is timed
against one plain copy of its input (``x.copy()``: every pool reads the whole input at least once and
its padded copy writes it once).  For every stem conv (3 input channels) the whole conv is timed against
its bare GEMM on a prepared column matrix (the floor without im2col), and the column building alone.
Best of ``--repeat`` runs, rotating the variants, BLAS pinned to 1 thread.

    python bench/pool_bench.py [--repeat 50] [--only pool|conv]

Findings (1 thread, shared 2-core machine, numpy 2.4, OpenBLAS SkylakeX capped by OPENBLAS_CORETYPE/L2_SIZE):

* numpy runs a contiguous float32 maximum/add at ~0.1 ns per element, a stride-2 one at ~1 ns and passes
  in rows of < ~100 values at 0.4-0.5 ns (per-row cost); ``pool._pool_reduce`` therefore reduces with whole-
  buffer shifted passes.  In-process A/B against the strided-tap version: 0.68-0.95x the time per layer;
  the pools stay 6-25x a plain copy of their input (pad, 4 passes, a strided crop, edge columns).
* stem convs: conv ~= columns + GEMM; the GEMM (the floor) is 60-75% of it at 60-80 GFLOP/s, and the
  column matrix is written at memory speed (7.4 MB for 7x7 s2: ~1 ms).  Tried without a win: columns from
  stride phases (one contiguous run per tap and channel: 10-40% slower to build, the matrix write
  dominates), GEMM over cache-sized column blocks, the transposed product, K padded to 16.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rpcsrv.executor.kernels.conv import conv as conv_mod  # noqa: E402
from rpcsrv.executor.kernels.pool import pool  # noqa: E402
from rpcsrv.executor.kernels.conv.im2col import columns  # noqa: E402

#: (op, model, input shape, kernel, strides, pads): the pools of the light zoo
POOLS = [
    ("max", "shufflenet", (1, 24, 112, 112), 3, 2, (1, 1, 1, 1)),
    ("avg", "shufflenet", (1, 24, 56, 56), 3, 2, (1, 1, 1, 1)),
    ("avg", "shufflenet", (1, 136, 28, 28), 3, 2, (1, 1, 1, 1)),
    ("avg", "shufflenet", (1, 272, 14, 14), 3, 2, (1, 1, 1, 1)),
    ("max", "resnet50/densenet", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1)),
    ("max", "inception_v1", (1, 64, 112, 112), 3, 2, (0, 0, 0, 0)),
    ("max", "inception_v2", (1, 64, 112, 112), 3, 2, (0, 0, 1, 1)),
    ("max", "inception_v2", (1, 192, 56, 56), 3, 2, (0, 0, 1, 1)),
    ("avg", "inception_v2", (1, 256, 28, 28), 3, 1, (1, 1, 1, 1)),
    ("avg", "inception_v2", (1, 576, 14, 14), 3, 1, (1, 1, 1, 1)),
    ("max", "inception_v1", (1, 512, 13, 13), 3, 1, (1, 1, 1, 1)),
    ("max", "squeezenet", (1, 64, 111, 111), 3, 2, (0, 0, 0, 0)),
    ("avg", "densenet121", (1, 128, 56, 56), 2, 2, (0, 0, 0, 0)),
    ("max", "vgg19", (1, 64, 224, 224), 2, 2, (0, 0, 0, 0)),
]

#: (model, x shape, w shape, stride, pad): the stem convs
STEMS = [
    ("shufflenet", (1, 3, 224, 224), (24, 3, 3, 3), 2, 1),
    ("squeezenet", (1, 3, 224, 224), (64, 3, 3, 3), 2, 0),
    ("resnet50 etc.", (1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
]


def best(fns, repeat):
    """Best time (ms) of each callable, rotating their order every round."""
    times = [float("inf")] * len(fns)
    for r in range(repeat):
        for i in range(len(fns)):
            j = (i + r) % len(fns)
            t = time.perf_counter()
            fns[j]()
            times[j] = min(times[j], time.perf_counter() - t)
    return [t * 1e3 for t in times]


def bench_pools(repeat):
    rng = np.random.default_rng(0)
    print(f"{'op':4} {'model':18} {'input':20} {'k/s':5} {'pads':10} {'kernel ms':>9} {'copy ms':>8} {'ratio':>6}")
    for op, model, shape, k, s, pads in POOLS:
        x = rng.standard_normal(shape).astype(np.float32)
        kw = dict(kernel_shape=[k, k], strides=[s, s], pads=list(pads))
        fn = pool.max_pool if op == "max" else pool.average_pool
        t_k, t_c = best([lambda: fn(x, **kw), x.copy], repeat)
        print(f"{op:4} {model:18} {str(shape[1:]):20} {k}/{s}   {str(pads):10} {t_k:9.3f} {t_c:8.3f} {t_k / t_c:6.2f}")


def bench_stems(repeat):
    rng = np.random.default_rng(0)
    print(f"{'model':14} {'w':16} {'conv ms':>8} {'cols ms':>8} {'gemm ms':>8} {'GFLOP/s':>8}")
    for model, xs, ws, s, p in STEMS:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        strides, dil, begin, end, out = conv_mod._geometry(xs, ws, 1, None, (p,) * 4, (s, s), None, "NOTSET")
        cols = columns(x, ws[2:], strides, dil, begin, end, out, ones_row=True, out_channels=ws[0])[0]
        wmat = np.concatenate([w.reshape(ws[0], -1), b[:, None]], axis=1)
        kw = dict(strides=[s, s], pads=[p] * 4, activation="relu")
        t_conv, t_cols, t_gemm = best([
            lambda: conv_mod.conv(x, w, b, **kw),
            lambda: columns(x, ws[2:], strides, dil, begin, end, out, ones_row=True, out_channels=ws[0]),
            lambda: wmat @ cols[0]], repeat)
        flops = 2 * ws[0] * np.prod(ws[1:]) * np.prod(out)
        print(f"{model:14} {str(ws):16} {t_conv:8.3f} {t_cols:8.3f} {t_gemm:8.3f} {flops / t_conv / 1e6:8.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--only", choices=["pool", "conv"])
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        if args.only != "conv":
            bench_pools(args.repeat)
        if args.only != "pool":
            bench_stems(args.repeat)


if __name__ == "__main__":
    main()
