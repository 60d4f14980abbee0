"""Pools per zoo layer shape: the planned compiled kernel (``pools.c`` by rows, or dwconv.c's phase planes,
as ``rpcsrv_pool_block`` picks) against onnxruntime (issue 27).

SqueezeNet's 3x3 stride-2 max pools (64 @ 111, 128 @ 55, 256 @ 27), ResNet's and GoogLeNet's 3x3 stride-2
ones with padding or ceil mode, Inception's stride-1 ones on small maps; Inception-v2's 3x3 stride-1 and
DenseNet's 2x2 stride-2 average pools; each as rpcsrv's run plan and as a one-node onnxruntime session,
interleaved, ``--repeat`` rounds, medians in us, 1 thread, results checked equal (max) or close (average).

Measured (1 thread, us, the kernels alone, phase planes / rows): max 111x111x64 s2 313 / 162, 55x55x128 160 /
97, 27x27x256 116 / 68, 112x112x64 pad 1 317 / 163, 28x28x320 s1 268 / 186, 14x14x576 s1 145 / 132,
13x13x512 s1 118 / 110, but 7x7x1024 s1 95 / 400 and 14x14x576 s2 (7 wide) 111 / 156: rows narrower than
a vector run scalar; average 28x28x192 s1 124 / 101, 56x56x128 2x2 s2 129 / 75, 14x14x576 s1 125 / 135,
7x7x1024 s1 87 / 200.  VW channels side by side (dwchan.c) on small maps: max 7x7x1024 s1 55, 14x14x576 s1
112, s2 41; average 7x7x1024 34, 14x14x576 s1 63, 28x28x320 s1 119.  So each where it wins (dwconv.c's
rpcsrv_pool_block); against onnxruntime's op alone then: 0.49-1.33x on these shapes.  (Before the scalar
maxima were made branch-free, random inputs made them 2-8x slower: mispredicted NaN-aware compares.)

    python bench/pools_bench.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rpcsrv.executor.kernels import plans  # noqa: E402
from rpcsrv.executor.kernels.pool import pool  # noqa: E402

#: (op, C, H=W, k, stride, pads, ceil_mode)
LAYERS = [("MaxPool", 64, 111, 3, 2, 0, 0), ("MaxPool", 128, 55, 3, 2, 0, 0), ("MaxPool", 256, 27, 3, 2, 0, 0),
          ("MaxPool", 64, 112, 3, 2, 1, 0), ("MaxPool", 192, 56, 3, 2, 0, 1), ("MaxPool", 480, 28, 3, 1, 1, 0),
          ("MaxPool", 512, 13, 3, 1, 1, 0), ("MaxPool", 1024, 7, 3, 1, 1, 0), ("MaxPool", 576, 14, 3, 2, 0, 1),
          ("AveragePool", 192, 28, 3, 1, 1, 0), ("AveragePool", 576, 14, 3, 1, 1, 0),
          ("AveragePool", 1024, 7, 3, 1, 1, 0), ("AveragePool", 128, 56, 2, 2, 0, 0),
          ("AveragePool", 512, 14, 2, 2, 0, 0)]


def ort_session(op, c, h, attrs):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, c, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| op | C | side | k | s | pads | ceil | rpcsrv us | onnxruntime us | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for op, c, h, k, s, p, ceil in LAYERS:
        attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=ceil)
        x = rng.standard_normal((1, c, h, h), np.float32)
        kernel = pool.max_pool if op == "MaxPool" else pool.average_pool
        want = kernel(x, **attrs)
        fn = plans.plan(kernel.__name__, kernel, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
        row = f"| {op} | {c} | {h} | {k} | {s} | {p} | {ceil} |"
        if fn is None:
            print(f"{row} not planned | | |")
            continue
        sess = ort_session(op, c, h, attrs)
        runs = {"rpcsrv": lambda: fn(x), "onnxruntime": lambda: sess.run(None, {"x": x})[0]}
        times = {name: [] for name in runs}
        order = list(runs)
        for _ in range(args.repeat):
            random.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                y = runs[name]()
                times[name].append(time.perf_counter() - t0)
                np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
        a, b = (float(np.median(times[n])) * 1e6 for n in runs)
        print(f"{row} {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
