"""MaxPool per zoo layer shape: the planned compiled kernel (``maxpool.c``) against onnxruntime (issue 27).

SqueezeNet's 3x3 stride-2 pools (64 @ 111, 128 @ 55, 256 @ 27), ResNet's and GoogLeNet's 3x3 stride-2
pools with padding or ceil mode, and a stride-1 one (Inception's); each as rpcsrv's run plan and as a
one-node onnxruntime session, interleaved, ``--repeat`` rounds, medians in us, 1 thread, results checked
equal.

Measured (1 thread, us, the phase-plane max pool dwconv.c had before / maxpool.c's rows, the kernels alone):
111x111x64 313 / 162, 55x55x128 160 / 97, 27x27x256 116 / 68, 112x112x64 pad 1 317 / 163, 56x56x192 ceil
254 / 146, 28x28x480 s1 416 / 279.  (Before the scalar tails were made branch-free, random inputs made the
rows 2-3x slower than the phase planes: mispredicted NaN-aware compares.)

    python bench/maxpool_bench.py [--repeat 200]
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

from rpcsrv.executor.kernels import plans, pool  # noqa: E402

#: (C, H=W, k, stride, pads, ceil_mode)
LAYERS = [(64, 111, 3, 2, 0, 0), (128, 55, 3, 2, 0, 0), (256, 27, 3, 2, 0, 0), (64, 112, 3, 2, 1, 0),
          (192, 56, 3, 2, 0, 1), (480, 28, 3, 1, 1, 0), (96, 109, 3, 2, 0, 1)]


def ort_session(c, h, attrs):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
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
    print("| C | side | k | s | pads | ceil | rpcsrv us | onnxruntime us | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, h, k, s, p, ceil in LAYERS:
        attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=ceil)
        x = rng.standard_normal((1, c, h, h), np.float32)
        want = pool.max_pool(x, **attrs)
        fn = plans.plan("max_pool", pool.max_pool, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
        if fn is None:
            print(f"| {c} | {h} | {k} | {s} | {p} | {ceil} | not planned | | |")
            continue
        sess = ort_session(c, h, attrs)
        runs = {"rpcsrv": lambda: fn(x), "onnxruntime": lambda: sess.run(None, {"x": x})[0]}
        times = {name: [] for name in runs}
        order = list(runs)
        for _ in range(args.repeat):
            random.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                y = runs[name]()
                times[name].append(time.perf_counter() - t0)
                np.testing.assert_array_equal(y, want)
        a, b = (float(np.median(times[n])) * 1e6 for n in runs)
        print(f"| {c} | {h} | {k} | {s} | {p} | {ceil} | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
