"""The compiled 1x1 GEMM (``kernels/conv/gemm.c``) against numpy's matmul (OpenBLAS) + the epilogue pass, 1 thread.

Per shape (``--shapes``): MobileNetV2's and ResNet-50's 1x1 convs, y = clip(w @ x + bias, 0, 6), the L2
flushed before each call (in a model the previous layer has just streamed other data through it); medians,
the two arms alternating.  Per model (``--models``): one loaded executor runs with the GEMM on and off
alternately (``gemm.SWITCH``, read at each call; the order flips each round), onnxruntime after each pair;
per conv step of one model (``--layers``), the same pairs through the executor's step hook.

    python bench/gemm_ab.py [--shapes] [--models mobilenetv2,resnet50] [--layers efficientnet] [--rounds 15]
                            [--min-columns 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_bench  # noqa: E402  (sets up the import paths)

#: (in channels, out channels, side): MobileNetV2's 1x1 convs, then ResNet-50's
MOBILENETV2 = [(32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28),
               (32, 192, 28), (192, 32, 28), (192, 64, 14), (64, 384, 14), (384, 64, 14), (384, 96, 14),
               (96, 576, 14), (576, 96, 14), (576, 160, 7), (160, 960, 7), (960, 160, 7), (960, 320, 7),
               (320, 1280, 7)]
RESNET50 = [(64, 256, 56), (256, 64, 56), (256, 128, 56), (512, 128, 28), (128, 512, 28), (1024, 256, 14),
            (256, 1024, 14), (2048, 512, 7), (512, 2048, 7)]


def shapes(reps_flops: float = 2e8) -> None:
    from rpcsrv.executor.kernels.clib import compiled
    from rpcsrv.executor.kernels.conv import gemm

    lib = compiled.library()
    assert lib is not None, compiled.status()
    flush = np.ones(1 << 20, np.float32)  # 4 MB: more than a core's L2
    print("| 1x1 conv | matmul + epilogue us | gemm.c us | ratio | planned |\n|---|---|---|---|---|")
    for k, m, side in MOBILENETV2 + RESNET50:
        q = side * side
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((k, q), np.float32), rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal(m, np.float32)
        wp = gemm.packed_weights(lib, w)
        y = np.empty((m, q), np.float32)

        def ours():
            lib.rpcsrv_gemm_f32(wp.ctypes.data, x.ctypes.data, None, None, b.ctypes.data, y.ctypes.data, m, k, q,
                                2, 0.0, 6.0)

        def blas():
            z = np.matmul(w, x)
            lib.rpcsrv_bias_act_f32(z.ctypes.data, b.ctypes.data, m, q, q, 2, 0.0, 6.0)

        times: dict = {ours: [], blas: []}
        for r in range(max(6, min(200, int(reps_flops / (m * k * q))))):
            for fn in (ours, blas) if r % 2 else (blas, ours):
                np.add(flush, 1, out=flush)
                start = time.perf_counter()
                fn()
                times[fn].append(time.perf_counter() - start)
        a, o = (float(np.median(times[f])) * 1e6 for f in (blas, ours))
        print(f"| {k}->{m} @{side} | {a:.1f} | {o:.1f} | {o / a:.2f} | {'gemm.c' if gemm.takes(m, k, q) else 'BLAS'} |",
              flush=True)


def models(names: list[str], rounds: int, key: str = "on") -> None:
    """Whole runs of each model, ``gemm.SWITCH[key]`` on and off in turns (``zoo_bench.paired``), onnxruntime
    after each pair."""
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute
    from rpcsrv.executor.kernels.conv import gemm

    print("| model | onnxruntime ms | BLAS + epilogue ms | gemm.c ms | BLAS / ort | gemm / ort | gain |")
    print("|---|---|---|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory() as tmp, compute.fixed_threads(1), threadpool_limits(1, "blas"):
            for name in names:
                eng = zoo_bench.Engines(name, Path(tmp))
                sess = eng.session(1)
                t = zoo_bench.paired({arm: (lambda arm=arm: gemm.SWITCH.__setitem__(key, arm), eng._run)
                                      for arm in (True, False)}, rounds, lambda: sess.run(None, eng.feeds))
                print(f"| {name} | {t['ort']:.2f} | {t[False]:.2f} | {t[True]:.2f} | {t[False] / t['ort']:.2f}x | "
                      f"{t[True] / t['ort']:.2f}x | {t[False] / t[True]:.3f}x |", flush=True)
    finally:
        gemm.SWITCH[key] = True


def layers(name: str, rounds: int, op: str = "conv", key: str = "on", take=None, describe=None) -> None:
    """Per step of one model that ``take(node)`` accepts (default: ``op`` in its op name), through the
    executor's step hook, medians with ``gemm.SWITCH[key]`` off and on, alternating; each row named by
    ``describe(node, value)`` (default: the output's shape)."""
    import collections

    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute, module
    from rpcsrv.executor.kernels.conv import gemm

    take = take or (lambda node: op in str(node.op))
    describe = describe or (lambda node, value: getattr(value, "shape", None))
    times: dict = {True: collections.defaultdict(list), False: collections.defaultdict(list)}
    shapes: dict = {}

    def hook(graph, node, value, seconds):
        if take(node):
            times[gemm.SWITCH[key]][(graph, node.id)].append(seconds)
            shapes[(graph, node.id)] = describe(node, value)

    print(f"| {name} {op} step | BLAS + epilogue us | gemm.c us | ratio |\n|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory() as tmp, compute.fixed_threads(1), threadpool_limits(1, "blas"):
            eng = zoo_bench.Engines(name, Path(tmp))
            token = module.STEP_HOOK.set(hook)
            try:
                for r in range(rounds):
                    for arm in (True, False) if r % 2 else (False, True):
                        gemm.SWITCH[key] = arm
                        eng._run()
            finally:
                module.STEP_HOOK.reset(token)
    finally:
        gemm.SWITCH[key] = True
    total = [0.0, 0.0]
    for k in times[True]:
        off, on = (float(np.median(times[arm][k])) * 1e6 for arm in (False, True))
        total[0], total[1] = total[0] + off, total[1] + on
        print(f"| {shapes[k]} | {off:.1f} | {on:.1f} | {on / off:.2f} |")
    print(f"| **all these {op} steps** | **{total[0] / 1e3:.3f} ms** | **{total[1] / 1e3:.3f} ms** | "
          f"**{total[1] / total[0]:.3f}** |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", action="store_true", help="the per-shape table")
    ap.add_argument("--models", default="", help="comma-separated zoo models (zoo_bench.ZOO, MOBILE)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", default="", help="a zoo model: its conv steps one by one, GEMM off and on")
    ap.add_argument("--min-columns", type=int, help="gemm.MIN_COLUMNS for the plans made here (the rule)")
    args = ap.parse_args(argv)
    if args.min_columns is not None:
        from rpcsrv.executor.kernels.conv import gemm

        gemm.MIN_COLUMNS = args.min_columns
    if args.shapes:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1, "blas"):
            shapes()
    if args.models:
        models(args.models.split(","), args.rounds)
    if args.layers:
        layers(args.layers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
