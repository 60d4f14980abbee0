"""Depthwise conv per MobileNetV2/V3 and EfficientNet-B0 layer shape: dwconv.c's rows kernel against
dwchan.c's channels-side-by-side kernel (issue 27), as the plans call them (their parameter blocks).

For each layer (channels, input side, stride, kernel size; pad k // 2, ReLU6 fused), both kernels run
interleaved, ``--repeat`` rounds in shuffled order, 1 thread; the table gives the medians in us, the ratio
chan / rows, and checks that both give the same result.  ``--ab`` repeats the whole table that many times
(another process may load the CPU: compare the medians of medians).

    python bench/dwchan_bench.py [--repeat 200] [--only 14,7]
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rpcsrv.executor.kernels.clib import compiled  # noqa: E402

#: (C, H=W input, stride, k): MobileNetV2, then MobileNetV3-Large's and EfficientNet-B0's other shapes
LAYERS = [(32, 112, 1, 3), (96, 112, 2, 3), (144, 56, 1, 3), (144, 56, 2, 3), (192, 28, 1, 3), (192, 28, 2, 3),
          (384, 14, 1, 3), (576, 14, 1, 3), (576, 14, 2, 3), (960, 7, 1, 3),
          (72, 56, 2, 5), (120, 28, 1, 5), (240, 28, 2, 3), (200, 14, 1, 3), (184, 14, 1, 3), (480, 14, 1, 3),
          (672, 14, 1, 3), (672, 14, 2, 5), (960, 7, 1, 5), (144, 56, 2, 5), (240, 28, 1, 5), (480, 14, 1, 5),
          (672, 14, 1, 5), (1152, 7, 1, 5), (1152, 7, 1, 3),
          (112, 56, 2, 3), (136, 28, 1, 3), (136, 28, 2, 3), (272, 14, 1, 3), (272, 14, 2, 3), (544, 7, 1, 3)]
#: MobileNetV2's (layer, how many times it runs), for the model's total
V2 = {(32, 112, 1, 3): 1, (96, 112, 2, 3): 1, (144, 56, 1, 3): 1, (144, 56, 2, 3): 1, (192, 28, 1, 3): 2,
      (192, 28, 2, 3): 1, (384, 14, 1, 3): 4, (576, 14, 1, 3): 2, (576, 14, 2, 3): 1, (960, 7, 1, 3): 3}


def params(c, h, s, k, w, b):
    o = (h + 2 * (k // 2) - k) // s + 1
    p = (ctypes.c_long * 20)(w.ctypes.data, b.ctypes.data, 1, c, h, h, 1, k, k, s, s, 1, 1, k // 2, k // 2, o, o,
                             2, 1, 0)
    f = (ctypes.c_float * 2)(0.0, 6.0)
    return p, f, o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--only", default="", help="input sides to run, comma-separated (default: all)")
    ap.add_argument("--ab", type=int, default=1)
    args = ap.parse_args(argv)
    lib = compiled.library()
    if lib is None:
        print("no compiled kernels:", compiled.status()["reason"])
        return 1
    only = {int(v) for v in args.only.split(",") if v}
    rng = np.random.default_rng(0)
    print("| C | side | s | k | rows us | chan us | chan/rows |\n|---|---|---|---|---|---|---|")
    for _ in range(args.ab):
        totals = {"rows": 0.0, "chan": 0.0}
        for c, h, s, k in LAYERS:
            if only and h not in only:
                continue
            x = rng.standard_normal((1, c, h, h), np.float32)
            w = rng.standard_normal((c, 1, k, k), np.float32)
            b = rng.standard_normal(c).astype(np.float32)
            p, f, o = params(c, h, s, k, w, b)
            ys = {}
            times = {"rows": [], "chan": []}
            fns = {"rows": lib.rpcsrv_rows_block, "chan": lib.rpcsrv_chan_block}
            order = list(fns)
            for _ in range(args.repeat):
                random.shuffle(order)
                for name in order:
                    y = np.empty((1, c, o, o), np.float32)
                    t0 = time.perf_counter()
                    rc = fns[name](x.ctypes.data, y.ctypes.data, ctypes.addressof(p), ctypes.addressof(f))
                    times[name].append(time.perf_counter() - t0)
                    assert rc == 0, (name, rc)
                    ys[name] = y
            np.testing.assert_allclose(ys["chan"], ys["rows"], rtol=1e-5, atol=1e-4)
            r, q = (float(np.median(times[n])) * 1e6 for n in ("rows", "chan"))
            print(f"| {c} | {h} | {s} | {k} | {r:.1f} | {q:.1f} | {q / r:.2f} |", flush=True)
            for name, t in (("rows", r), ("chan", q)):
                totals[name] += V2.get((c, h, s, k), 0) * t
        print(f"| MobileNetV2's depthwise convs | | | | {totals['rows']:.0f} | {totals['chan']:.0f} | "
              f"{totals['chan'] / max(totals['rows'], 1e-9):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
