"""Where a zoo model's time goes, per kind of op, in rpcsrv and in onnxruntime (issue 16's per-layer view).

``zoo_bench.py`` compares whole runs; this splits one model's run by op kind so that a gap can be traced
to the layers that make it: convolutions by kind (depthwise, grouped, dense, with their kernel size),
then every other op by name.  rpcsrv's times come from the executor's per-step hook (``STEP_HOOK``, the
debug executor's), medians over ``--repeat`` runs; onnxruntime's from its own profiler (per node kernel
time, medians), both with one thread.  onnxruntime rewrites the graph (fusions, NCHWc layouts with their
reorder nodes): a node it made that maps to no node of the model is listed apart, with its op type.
Both engines' per-op times include their own per-node overheads; the hook adds ~1 us per step to ours.
A conv onnxruntime fused with its activation (Conv + Clip, named after the activation) counts as the conv:
the activation's own row then shows what fusing it would save us.

    python bench/zoo_profile.py [--model shufflenet] [--repeat 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_bench  # noqa: E402  (sets up the import paths)


def kernel_times(sess) -> list[tuple[str, str, float]]:
    """(node name, op type, ms) of every kernel run in an onnxruntime session's profile (``enable_profiling``),
    in order; ends the profiling."""
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    return [(e["name"][:-len("_kernel_time")], e["args"].get("op_name", "?"), e["dur"] / 1e3) for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def conv_kind(group: int, in_per_group: int, kernel) -> str:
    """``conv dw 3x3``, ``conv grouped 1x1``, ``conv 7x7``: how a convolution is computed."""
    kind = "dw " if group > 1 and in_per_group == 1 else "grouped " if group > 1 else ""
    return f"conv {kind}{'x'.join(str(k) for k in kernel)}"


def ours(eng: zoo_bench.Engines, repeat: int) -> dict[str, float]:
    """Median ms per op kind over ``repeat`` runs (one BLAS thread)."""
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute, module

    times: dict[tuple, list[float]] = collections.defaultdict(list)
    kinds: dict[tuple, str] = {}
    for fn in eng.ex._functions.values():  # the executor's subgraph functions: each conv's weight shape
        graph = getattr(fn, "graph", None)
        for node in graph.ops if graph is not None else ():
            w = graph.nodes[node.inputs[1]].shape if node.op == "conv" else None
            kinds[(graph.name, node.id)] = conv_kind(node.attrs.get("group", 1), w[1], w[2:]) if w else node.op
        for step in getattr(fn, "steps", ()):  # a conv folded with the Add after it runs under the Add's ID
            node = step[0]
            if node.op == "conv" and not kinds[(graph.name, node.id)].startswith("conv"):
                w = next(graph.nodes[i].shape for i in node.inputs
                         if i in graph.nodes and graph.nodes[i].kind == "const" and len(graph.nodes[i].shape) == 4)
                kinds[(graph.name, node.id)] = conv_kind(node.attrs.get("group", 1), w[1], w[2:])

    def hook(graph, node, value, seconds):
        times[(graph, node.id)].append(seconds)

    with compute.fixed_threads(1), threadpool_limits(limits=1, user_api="blas"):
        eng._run()
        token = module.STEP_HOOK.set(hook)
        try:
            for _ in range(repeat):
                eng._run()
        finally:
            module.STEP_HOOK.reset(token)
    out: dict[str, float] = collections.defaultdict(float)
    for key, ts in times.items():
        out[kinds[key]] += float(np.median(ts)) * 1e3
    return out


def theirs(eng: zoo_bench.Engines, model, repeat: int) -> dict[str, float]:
    """Median ms per op kind from onnxruntime's profiler (one thread)."""
    import onnx
    from onnx import numpy_helper

    from rpcsrv.loader.opset import onnx_op_to_kernel

    opts = eng.ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    sess = eng.ort.InferenceSession(eng.serialized, opts, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        sess.run(None, eng.feeds)
    nodes = {n.name: n for n in model.graph.node if n.name}
    producer = {out: n for n in model.graph.node for out in n.output}
    weights = {t.name: numpy_helper.to_array(t).shape for t in model.graph.initializer}
    times: dict[str, list[float]] = collections.defaultdict(list)
    kinds: dict[str, str] = {}
    for name, op, ms in kernel_times(sess):
        times[name].append(ms)
        node = nodes.get(name.removesuffix("_nchwc"))  # its NCHWc form keeps the node's name
        if node is not None and node.op_type != "Conv" and op == "Conv" \
                and producer.get(node.input[0]) is not None and producer[node.input[0]].op_type == "Conv":
            node = producer[node.input[0]]  # a conv with its activation fused, named after the activation
        if node is not None and node.op_type == "Conv" and node.input[1] in weights:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            w = weights[node.input[1]]
            kinds[name] = conv_kind(attrs.get("group", 1), w[1], w[2:])
        else:  # named as our kernels are; a node onnxruntime made (fusions, NCHWc layouts) says so
            kinds[name] = onnx_op_to_kernel(op) + ("" if node is not None else f" ({op}, onnxruntime's own node)")
    out: dict[str, float] = collections.defaultdict(float)
    for name, ts in times.items():
        out[kinds[name]] += float(np.median(ts[1:] or ts))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="shufflenet", help=f"one of {', '.join(zoo_bench.ZOO)}, encoder")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    model = zoo_bench.load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        eng = zoo_bench.Engines(args.model, Path(tmp))
        a, b = ours(eng, args.repeat), theirs(eng, model, args.repeat)
    print(f"{args.model}, 1 thread, medians of {args.repeat} runs (ms per op kind, summed over its nodes)\n")
    print("| op kind | rpcsrv | onnxruntime |\n|---|---|---|")
    for kind in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, 0.0), b.get(k, 0.0))):
        print(f"| {kind} | {a[kind]:.3f} | {b[kind]:.3f} |" if kind in a and kind in b else
              f"| {kind} | {a[kind]:.3f} | – |" if kind in a else f"| {kind} | – | {b[kind]:.3f} |")
    print(f"| **all** | **{sum(a.values()):.3f}** | **{sum(b.values()):.3f}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
