"""Where an int8 model's time goes, per step, in rpcsrv and in onnxruntime (``quant_bench.py``'s models).

rpcsrv's times come from the executor's per-step hook (``STEP_HOOK``), onnxruntime's from its own profiler (each
node's kernel time), medians over ``--repeat`` runs, one thread each, both in one process pinned to ``--cpu``, the
runs of both interleaved (the load of a shared machine's other jobs falls on both alike).
Printed: per op kind, the time summed over its steps and the number of steps in each engine; the run's own time
(the graph executor's ``run``, CPU time) against the sum of its steps (the rest is the per-step loop and the
graph executor around it); and, with ``--steps``, every step of ours with its output shape.

    python bench/quant_profile.py [--model mobilenetv2-qdq] [--repeat 20] [--cpu 0] [--steps]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_bench  # noqa: E402
import zoo_profile  # noqa: E402


def profiled_session(pair: quant_bench.Pair):
    """onnxruntime's session of ``pair``'s model with its profiler on (one thread, as the bench's)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    return ort.InferenceSession(pair.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def profile(pair: quant_bench.Pair, repeat: int) -> tuple[dict, list, float, dict, float]:
    """Both engines' runs interleaved (so that a shared machine's load falls on both alike): (per op kind of ours:
    [ms, steps], per step: (op, shape, ms), our median run's CPU ms, per onnxruntime op type: [ms, nodes], its median
    run's CPU ms)."""
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute, module

    times: dict[tuple, list[float]] = collections.defaultdict(list)
    names: dict[tuple, tuple] = {}

    def hook(graph, node, value, seconds):
        times[(graph, node.id)].append(seconds)
        names[(graph, node.id)] = (node.op, tuple(node.shape))

    sess = profiled_session(pair)
    runs, theirs_runs = [], []
    with compute.fixed_threads(1), threadpool_limits(limits=1, user_api="blas"):
        pair.run_ours()
        sess.run(None, pair.feeds)
        for _ in range(repeat):
            start = time.thread_time()
            sess.run(None, pair.feeds)
            theirs_runs.append(time.thread_time() - start)
            start = time.thread_time()
            pair.run_ours()
            runs.append(time.thread_time() - start)
            token = module.STEP_HOOK.set(hook)
            try:
                pair.run_ours()
            finally:
                module.STEP_HOOK.reset(token)
    kinds: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    steps = []
    for key, ts in times.items():
        op, shape = names[key]
        ms = float(np.median(ts)) * 1e3
        kinds[op][0] += ms
        kinds[op][1] += 1
        steps.append((op, shape, ms))
    return kinds, steps, float(np.median(runs)) * 1e3, nodes(sess), float(np.median(theirs_runs)) * 1e3


def nodes(sess) -> dict:
    """Per onnxruntime op type: [ms, nodes], each node's median kernel time from the session's profile (the first
    run left out)."""
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    op_of: dict[str, str] = {}
    for name, op, ms in zoo_profile.kernel_times(sess):
        per_node[name].append(ms)
        op_of[name] = op
    kinds: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name, ts in per_node.items():
        kinds[op_of[name]][0] += float(np.median(ts[1:] or ts))
        kinds[op_of[name]][1] += 1
    return kinds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenetv2-qdq", help=", ".join(quant_bench.MODELS))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--steps", action="store_true", help="list every step of ours")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {args.cpu})
    with tempfile.TemporaryDirectory() as tmp:
        pair = quant_bench.Pair(args.model, Path(tmp))
        a, steps, run_a, b, run_b = profile(pair, args.repeat)
    print(f"{args.model}, 1 thread, CPU {args.cpu}, medians of {args.repeat} runs (ms per op kind, summed over its "
          "steps; steps)\n")
    print("| rpcsrv op | ms | steps |\n|---|---|---|")
    for op, (ms, k) in sorted(a.items(), key=lambda kv: -kv[1][0]):
        print(f"| {op} | {ms:.3f} | {k} |")
    print(f"| **steps** | **{sum(v[0] for v in a.values()):.3f}** | {sum(v[1] for v in a.values())} |")
    print(f"| **run (CPU time)** | **{run_a:.3f}** | |\n")
    print("| onnxruntime op | ms | nodes |\n|---|---|---|")
    for op, (ms, k) in sorted(b.items(), key=lambda kv: -kv[1][0]):
        print(f"| {op} | {ms:.3f} | {k} |")
    print(f"| **nodes** | **{sum(v[0] for v in b.values()):.3f}** | {sum(v[1] for v in b.values())} |")
    print(f"| **run (CPU time)** | **{run_b:.3f}** | |")
    if args.steps:
        print("\n| step | op | shape | ms |\n|---|---|---|---|")
        for k, (op, shape, ms) in enumerate(steps):
            print(f"| {k} | {op} | {'x'.join(map(str, shape))} | {ms:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
