"""Per-layer timing of the stride-1 conv paths (issue 16): im2col, Winograd F(2x2,3x3) and stacked taps
(``rpcsrv/executor/kernels/conv/taps.py``), on every stride-1 KxK (K > 1) conv geometry of the light model zoo.

Each path is timed alone (1 BLAS thread, best of ``--repeat``, the order rotated each round) on random
data, and the path ``conv`` would pick today is marked; prints one row per geometry and the totals.

    python bench/taps_bench.py [--models densenet121,...] [--repeat 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def geometries(names: list[str]) -> dict[tuple, int]:
    """(C, M, H, W, KH, KW, pads) -> how many convs of the models have it."""
    import onnx
    from onnx import numpy_helper, shape_inference

    from zoo_bench import load_model

    found: dict[tuple, int] = {}
    for name in names:
        m = shape_inference.infer_shapes(load_model(name))
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in list(m.graph.value_info) + list(m.graph.input)}
        inits = {t.name: numpy_helper.to_array(t).shape for t in m.graph.initializer}
        for node in m.graph.node:
            if node.op_type != "Conv":
                continue
            a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            w = inits.get(node.input[1])
            x = shapes.get(node.input[0])
            if w is None or not x or len(x) != 4 or a.get("group", 1) != 1 or w[2] * w[3] == 1:
                continue
            if list(a.get("strides", [1, 1])) != [1, 1] or list(a.get("dilations", [1, 1])) != [1, 1]:
                continue
            key = (x[1], w[0], x[2], x[3], w[2], w[3], tuple(a.get("pads", [0, 0, 0, 0])))
            found[key] = found.get(key, 0) + 1
    return found


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor.kernels.conv import taps, winograd
    from rpcsrv.executor.kernels.conv.conv import conv
    from zoo_bench import ZOO

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    totals = {"im2col": 0.0, "winograd": 0.0, "taps": 0.0, "chosen": 0.0, "best": 0.0}
    print("| C | M | HxW | kernel | count | im2col ms | winograd ms | taps ms | chosen |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (c, m, h, w, kh, kw, pads), count in sorted(geometries(args.models.split(",")).items()):
        x = rng.standard_normal((1, c, h, w), dtype=np.float32)
        wt = (rng.standard_normal((m, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
        wt.flags.writeable = False  # as bound constants are: prepared weights are trusted
        pads = list(pads)
        ways = {"im2col": (False, False), "winograd": (True, False), "taps": (False, True)}
        times = {}
        saved = winograd.ENABLED, taps.ENABLED
        try:
            with threadpool_limits(1, user_api="blas"):
                for way, (wino, tap) in ways.items():
                    winograd.ENABLED, taps.ENABLED = wino, tap
                    if way == "winograd" and not winograd.usable(x, wt, [1, 1], [1, 1], 1) and kh != 3:
                        continue
                    conv(x, wt, pads=pads)
                    best = float("inf")
                    for _ in range(args.repeat):
                        t = time.perf_counter()
                        conv(x, wt, pads=pads)
                        best = min(best, time.perf_counter() - t)
                    times[way] = best * 1e3
        finally:
            winograd.ENABLED, taps.ENABLED = saved
        chosen = "taps" if taps.usable(x, wt, [1, 1], [1, 1], 1) else \
            "winograd" if winograd.usable(x, wt, [1, 1], [1, 1], 1) else "im2col"
        for way in ("im2col", "winograd", "taps"):
            totals[way] += count * times.get(way, times["im2col"])
        totals["chosen"] += count * times[chosen]
        totals["best"] += count * min(times.values())
        cells = " | ".join(f"{times[k]:.3f}" if k in times else "-" for k in ("im2col", "winograd", "taps"))
        print(f"| {c} | {m} | {h}x{w} | {kh}x{kw} | {count} | {cells} | {chosen} |")
    print("totals (ms, each geometry times its count): " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
