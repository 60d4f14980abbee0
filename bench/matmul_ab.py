"""MatMuls by constant weights through the compiled GEMM (``kernels/conv/gemm.c``, ``gemm.planned_matmul``) against
numpy's matmul (OpenBLAS) + the epilogue pass, 1 thread: what ``gemm.takes_matmul``'s rule comes from.

Per shape (``--shapes``): y = x (rows, K) @ w (K, N) + bias, rows 128 and 384 by K, N in {256, 384, 768,
1024, 1536, 3072}, warm (an encoder's activations stay in L2 between its products); ``--few``: 1-64 rows;
medians, the two arms alternating.  Per model (``--models``, e.g. encoder): ``gemm_ab.py``'s paired runs
(``gemm.SWITCH`` on and off alternately, onnxruntime after each pair); ``--layers``: per MatMul step.

    python bench/matmul_ab.py [--shapes] [--few] [--models encoder,torch_encoder] [--layers encoder] [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemm_ab  # noqa: E402  (sets up the import paths)

SIZES = (256, 384, 768, 1024, 1536, 3072)


def pair(rows: int, k: int, n: int, reps: int) -> tuple[float, float]:
    """Median microseconds of (OpenBLAS + epilogue, gemm.c) for one product with a bias, alternating."""
    from rpcsrv.executor.kernels.clib import compiled
    from rpcsrv.executor.kernels.conv import gemm

    lib = compiled.library()
    assert lib is not None, compiled.status()
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((rows, k), np.float32), rng.standard_normal((k, n), np.float32)
    b = rng.standard_normal(n, np.float32)
    bp = gemm.packed_strips(lib, w)

    def ours():
        y = np.empty((rows, n), np.float32)
        lib.rpcsrv_matmul_f32(x.ctypes.data, bp.ctypes.data, b.ctypes.data, y.ctypes.data, rows, k, n, 0, 0.0, 0.0)

    def blas():
        y = np.matmul(x, w)
        lib.rpcsrv_col_bias_act_f32(y.ctypes.data, b.ctypes.data, rows, n, 0, 0.0, 0.0)

    times: dict = {ours: [], blas: []}
    for r in range(reps):
        for fn in (ours, blas) if r % 2 else (blas, ours):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    return float(np.median(times[blas])) * 1e6, float(np.median(times[ours])) * 1e6


def table(shapes) -> None:
    from rpcsrv.executor.kernels.conv import gemm

    print("| rows x K @ K x N | matmul + epilogue us | gemm.c us | ratio | gemm.c GFLOP/s | planned |")
    print("|---|---|---|---|---|---|")
    for rows, k, n in shapes:
        a, o = pair(rows, k, n, max(6, min(60, int(3e9 / (2 * rows * k * n)))))
        print(f"| {rows}x{k} @ {k}x{n} | {a:.1f} | {o:.1f} | {o / a:.2f} | {2 * rows * k * n / o / 1e3:.0f} | "
              f"{'gemm.c' if gemm.takes_matmul(rows, k, n) else 'BLAS'} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", action="store_true", help="rows 128 and 384 by every K, N in SIZES")
    ap.add_argument("--few", action="store_true", help="1-64 rows")
    ap.add_argument("--models", default="", help="comma-separated zoo models (encoder, torch_encoder)")
    ap.add_argument("--layers", default="", help="a zoo model: its MatMul steps one by one, GEMM off and on")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        if args.shapes:
            table([(r, k, n) for r in (128, 384) for k in SIZES for n in SIZES])
        if args.few:
            table([(r, k, n) for k, n in ((384, 384), (256, 1024), (1024, 256), (768, 768), (384, 1536),
                                          (1536, 384)) for r in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)])
    if args.models:
        gemm_ab.models(args.models.split(","), args.rounds)
    if args.layers:
        gemm_ab.layers(args.layers, args.rounds, "matmul")
    return 0


if __name__ == "__main__":
    sys.exit(main())
