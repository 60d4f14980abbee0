"""The im2col plan's GEMM by ``gemm.c`` against numpy's matmul (OpenBLAS) + the epilogue pass, 1 thread.

The dense convs no fast path takes (``plans_conv.im2col_plan``): stride-2 3x3s, 3x3s on 7x7 maps, 7x7 stems,
strided 1x1 shortcuts, AlexNet's and ZFNet's large kernels.  Per shape (``--shapes``): the planned conv,
bias and ReLU, the L2 flushed before each call, the arms alternating (``gemm.SWITCH["im2col"]``, read at
each call), medians.  Per model (``--models``): one loaded executor, the arms alternating (the order flips
each round), onnxruntime after each pair.  Per step (``--layers``): the same pairs through the executor's
step hook, the convs that are not 1x1 stride 1 (the im2col plan's, and Winograd's: ratio ~1).

    python bench/im2gemm_ab.py [--shapes] [--models resnet50,alexnet] [--layers resnet50] [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemm_ab  # noqa: E402  (sets up the import paths: zoo_bench)

#: (name, in channels, out channels, side, kernel, stride, pad)
SHAPES = [("resnet50 3x3 s2 @56", 128, 128, 56, 3, 2, 1), ("resnet50 3x3 s2 @28", 256, 256, 28, 3, 2, 1),
          ("resnet50 3x3 s2 @14", 512, 512, 14, 3, 2, 1), ("resnet50 3x3 @7", 512, 512, 7, 3, 1, 1),
          ("resnet50 7x7 s2 stem", 3, 64, 224, 7, 2, 3), ("resnet50 1x1 s2 @56", 256, 512, 56, 1, 2, 0),
          ("resnet50 1x1 s2 @28", 512, 1024, 28, 1, 2, 0), ("resnet50 1x1 s2 @14", 1024, 2048, 14, 1, 2, 0),
          ("alexnet 11x11 s4", 3, 64, 224, 11, 4, 2), ("alexnet 5x5 @27", 64, 192, 27, 5, 1, 2),
          ("zfnet 7x7 s2", 3, 96, 224, 7, 2, 1), ("zfnet 5x5 s2 @55", 96, 256, 55, 5, 2, 0),
          ("inception 3x3 s2 @28", 128, 160, 28, 3, 2, 1), ("inception 3x3 s2 @28 96", 96, 96, 28, 3, 2, 1),
          ("inception 3x3 s2 @14", 128, 192, 14, 3, 2, 1), ("5x5 16->32 @28", 16, 32, 28, 5, 1, 2)]


KEY = ["im2col"]  # the gemm.SWITCH entry the arms flip


def shapes(reps_flops: float = 4e8) -> None:
    from rpcsrv.executor.kernels.conv import gemm
    from rpcsrv.executor.kernels import plans
    from rpcsrv.executor.kernels.conv.conv import conv

    flush = np.ones(1 << 20, np.float32)  # 4 MB: more than a core's L2
    print("| conv | matmul + epilogue us | gemm.c us | ratio |\n|---|---|---|---|")
    for name, c, m, side, kk, stride, pad in SHAPES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, side, side), np.float32)
        w = rng.standard_normal((m, c, kk, kk), np.float32)
        b = rng.standard_normal(m, np.float32)
        attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "activation": "relu"}
        out = (side + 2 * pad - kk) // stride + 1
        fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], (1, m, out, out), np.float32)
        assert fn is not None and fn.__name__ == "im2col_chunks", name
        times: dict = {True: [], False: []}
        for r in range(max(8, min(100, int(reps_flops / (m * c * kk * kk * out * out))))):
            for arm in (True, False) if r % 2 else (False, True):
                gemm.SWITCH[KEY[0]] = arm
                np.add(flush, 1, out=flush)
                start = time.perf_counter()
                fn(x, w, b)
                times[arm].append(time.perf_counter() - start)
        gemm.SWITCH[KEY[0]] = True
        a, o = (float(np.median(times[f])) * 1e6 for f in (False, True))
        print(f"| {name} ({c}->{m}) | {a:.0f} | {o:.0f} | {o / a:.2f} |", flush=True)


def _im2col_step(node) -> bool:
    """The conv steps the im2col plan (or Winograd) runs: not 1x1 stride 1."""
    return "conv" in str(node.op) and (tuple(node.attrs.get("kernel_shape", (1, 1))) != (1, 1)
                                       or tuple(node.attrs.get("strides", (1, 1))) != (1, 1))


def _kernel_strides_shape(node, value) -> tuple:
    return (tuple(node.attrs.get("kernel_shape", ())), tuple(node.attrs.get("strides", ())),
            getattr(value, "shape", None))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", action="store_true", help="the per-shape table")
    ap.add_argument("--models", default="", help="comma-separated zoo models")
    ap.add_argument("--layers", default="", help="a zoo model: its non-1x1 conv steps, gemm.c off and on")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--switch", default="im2col", help="the arms: gemm.c or OpenBLAS (im2col); gemm.c packing "
                    "from the input or from the banded column matrix (fused)")
    args = ap.parse_args(argv)
    KEY[0] = args.switch
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute

    if args.shapes:
        with compute.fixed_threads(1), threadpool_limits(1, "blas"):
            shapes()
    if args.models:
        gemm_ab.models(args.models.split(","), args.rounds, KEY[0])
    if args.layers:
        gemm_ab.layers(args.layers, args.rounds, "conv", KEY[0], _im2col_step, _kernel_strides_shape)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
