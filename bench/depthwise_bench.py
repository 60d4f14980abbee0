"""Depthwise conv per ShuffleNet layer shape (issue 16): each kernel variant against the layer's floor.

For every depthwise Conv geometry of the light-zoo ShuffleNet (3x3, pad 1, stride 1 or 2) and a few
other shapes, times, with 1 BLAS thread, best of ``--repeat`` interleaved rounds (their order shuffled):

* ``copy``: a plain copy of the input (the floor: every variant reads the input and writes an output);
* ``windows``: the former kernel, broadcast multiply-adds over a strided window view (NCHW);
* ``rows``: ``kernels.depthwise`` as configured (rows layout; column phases for stride 2 on wide inputs);
* ``rows-phases`` / ``rows-fullcols``: the same with the columns split into phases at stride 2, or
  computed all and every other one kept (the same code as ``rows`` at stride 1);
* ``rows-products``: the same with a product and a sum per tap instead of one einsum over all taps;
* ``conv``: the whole ``conv`` kernel with bias and fused relu (what the executor calls).

Each variant allocates its buffers per call, as the executor's kernels do.  Called alone in a loop, glibc
gives the freed megabytes back to the system after every call and the next call page-faults them in
again (2-3x slower than inside a model run, where other tensors keep the heap in use), so the bench raises
glibc's trim and mmap thresholds for its own process first (``--cold-heap`` leaves them).

    python bench/depthwise_bench.py [--repeat 30] [--cold-heap]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rpcsrv.executor.kernels.conv import conv as conv_mod  # noqa: E402
from rpcsrv.executor.kernels.conv import depthwise  # noqa: E402
from rpcsrv.executor.kernels.windows import pad_spatial, windows  # noqa: E402

#: (C, H=W, stride): ShuffleNet's depthwise layers (count in the model), then other shapes
LAYERS = [(112, 56, 2), (136, 28, 1), (136, 28, 2), (272, 14, 1), (272, 14, 2), (544, 7, 1),
          (32, 112, 1), (64, 56, 2), (1024, 7, 1)]
COUNT = {(112, 56, 2): 1, (136, 28, 1): 3, (136, 28, 2): 1, (272, 14, 1): 7, (272, 14, 2): 1, (544, 7, 1): 3}


def windows_variant(x, w, stride):
    """The NCHW window-view kernel this module replaced (conv._depthwise)."""
    n, c = x.shape[:2]
    out = [(x.shape[2] + 2 - 3) // stride + 1] * 2
    win = windows(pad_spatial(x, [1, 1], [1, 1], 0), [3, 3], [stride] * 2, [1, 1], out)
    return conv_mod._depthwise(win, w, n, c, 1, 2, out[0] * out[1]).reshape(n, c, *out)


def rows_variant(x, w, stride, phases=None, einsum=True):
    """``kernels.depthwise``: as configured (``phases`` None), with column phases forced on or off."""
    saved = depthwise.COLUMN_PHASES, depthwise.PHASE_MIN_WIDTH, depthwise.EINSUM
    depthwise.EINSUM = einsum
    if phases is not None:
        depthwise.COLUMN_PHASES, depthwise.PHASE_MIN_WIDTH = (frozenset({stride}), 0) if phases else (frozenset(), 0)
    try:
        out = [(x.shape[2] + 2 - 3) // stride + 1] * 2
        return depthwise.depthwise_conv(x, w, None, [stride] * 2, [1, 1], [1, 1], [1, 1], out)
    finally:
        depthwise.COLUMN_PHASES, depthwise.PHASE_MIN_WIDTH, depthwise.EINSUM = saved


def warm_heap() -> None:
    """Keep freed memory in this process's heap (glibc ``mallopt``; nothing happens elsewhere)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        print("(not glibc: heap thresholds left as they are)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cold-heap", action="store_true", help="leave glibc's heap trimming as it is")
    args = ap.parse_args(argv)
    if not args.cold_heap:
        warm_heap()
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    names = ["copy", "windows", "rows", "rows-phases", "rows-fullcols", "rows-products", "conv"]
    print(f"1 BLAS thread, best of {args.repeat}; ms per call; GF/s of the rows variant\n")
    print("| C | HxW | stride | " + " | ".join(names) + " | rows / windows | rows GF/s |")
    print("|---" * (len(names) + 5) + "|")
    total = dict.fromkeys(names, 0.0)
    with threadpool_limits(1, "blas"):
        for c, side, stride in LAYERS:
            x = rng.standard_normal((1, c, side, side), dtype=np.float32)
            w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
            b = rng.standard_normal(c, dtype=np.float32)
            fns = {
                "copy": lambda: x.copy(),
                "windows": lambda: windows_variant(x, w, stride),
                "rows": lambda: rows_variant(x, w, stride),
                "rows-phases": lambda: rows_variant(x, w, stride, phases=True),
                "rows-fullcols": lambda: rows_variant(x, w, stride, phases=False),
                "rows-products": lambda: rows_variant(x, w, stride, einsum=False),
                "conv": lambda: conv_mod.conv(x, w, b, group=c, pads=[1] * 4, strides=[stride] * 2,
                                              activation="relu"),
            }
            want = windows_variant(x, w, stride)
            for name in ("rows", "rows-phases", "rows-fullcols", "rows-products"):
                np.testing.assert_allclose(fns[name](), want, rtol=1e-5, atol=1e-5)
            best = dict.fromkeys(names, float("inf"))
            for _ in range(args.repeat):
                for name in rng.permutation(names):  # shuffled: no variant always after the same one
                    t = time.perf_counter()
                    fns[name]()
                    best[name] = min(best[name], time.perf_counter() - t)
            for name in names:
                total[name] += best[name] * COUNT.get((c, side, stride), 0)
            flops = 2 * 9 * want.size
            print(f"| {c} | {side}x{side} | {stride} | " + " | ".join(f"{best[k] * 1e3:.3f}" for k in names)
                  + f" | {best['rows'] / best['windows']:.2f} | {flops / best['rows'] / 1e9:.1f} |")
    print("\nShuffleNet's 16 depthwise layers, summed (ms): "
          + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
