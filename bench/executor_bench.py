"""Executor benchmark: rpcsrv's graph executor + ExampleJSON kernels against onnxruntime.

Two models built with ``onnx.helper`` (random weights, fixed seed; ``bench_models.py``):

* ``resnet``  — a ResNet-18-style CNN: conv stem, max pool, four stages of two basic residual blocks
  (Conv-BN-ReLU, 1x1 projection when the shape changes), global average pool, Gemm.  ``--size half``
  (default) is a half-width ResNet-18 on 1x3x112x112 (3x3 stem, widths 32/64/128/256); ``--size
  full`` is the real ResNet-18 shape, 1x3x224x224 with a 7x7 stem and widths 64/128/256/512.
* ``encoder`` — a two-layer transformer encoder (sequence 64, width 128, 4 heads, FFN 512, post-norm
  LayerNormalization, ReLU).

Each model is compiled by the project's compiler (``client.compile_onnx``: partitioning with
composites, graph JSON with a storage plan, constants in a const loader) and, for comparison, by a
small adapter here that offloads the whole model as one ExampleJSON subgraph.  The library is written
as a real blob, loaded with ``rpcsrv.executor.load_module`` and run through the graph executor's
``set_input``/``run``/``get_output`` — the same calls a remote client makes.  onnxruntime runs the
same ONNX model in the same process with the same thread budget (also without its graph rewrites,
for context).

    python bench/executor_bench.py [--threads 1] [--repeat 20] [--models resnet,encoder]
                                   [--compiler client,adapter] [--size half,full]
                                   [--blas-core env|auto|NAME]
    python bench/executor_bench.py --zoo [zoo_bench.py's options]   (the light model zoo, issue 16)

Prints one JSON line per model, size and compiler: median latencies, ratios, the largest output
difference, the time spent in kernels by op (the rest of a run is executor overhead) and the
OpenBLAS core numpy's matrix products ran on.

numpy's OpenBLAS picks its kernels by CPU unless ``OPENBLAS_CORETYPE`` names a core; a machine
may pin an older core (e.g. ``Haswell``, AVX2) on a CPU that has AVX-512, which makes every GEMM
slower while onnxruntime still uses AVX-512.  ``--blas-core env`` (default) measures with the
environment as it is; ``auto`` drops ``OPENBLAS_CORETYPE`` before numpy starts (OpenBLAS then
detects the CPU), ``NAME`` sets it.  The core in use is reported in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path


def _from_argv(option: str, default: str) -> str:
    """``--option VALUE`` or ``--option=VALUE`` from the command line, before argparse runs."""
    for k, arg in enumerate(sys.argv):
        if arg == option and k + 1 < len(sys.argv):
            return sys.argv[k + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return default


def _blas_environment(core: str) -> None:
    """Apply ``--blas-core`` (see the module docstring); must precede numpy's BLAS start-up."""
    if core == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif core != "env":
        os.environ["OPENBLAS_CORETYPE"] = core


if __name__ == "__main__" and "--zoo" in sys.argv:  # the zoo: bench/zoo_bench.py (which never imports this file)
    import runpy

    sys.argv = [str(Path(__file__).with_name("zoo_bench.py"))] + [a for a in sys.argv[1:] if a != "--zoo"]
    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(0)

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _from_argv("--threads", "1"))  # must precede numpy's BLAS start-up
_blas_environment(_from_argv("--blas-core", "env"))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_models

SYMBOL = "tvmgen_default_examplejson_main_0"


# ---------------------------------------------------------------------- models (bench_models.py)
from bench_models import RESNET_SIZES, build_encoder, build_resnet  # noqa: E402,F401  (tests use build_resnet)


# ---------------------------------------------------------------------- ONNX -> graph JSON + ExampleJSON
def snake(op_type: str) -> str:
    """The kernel table's name for an ONNX op type (its own rule when it has one)."""
    try:
        from rpcsrv.executor.kernels import onnx_op_to_kernel
    except ImportError:
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()
    return onnx_op_to_kernel(op_type)


def to_examplejson(model):
    """(ExampleJSON text, graph JSON, constants) for ``model`` fully offloaded to one subgraph."""
    from onnx import helper, numpy_helper

    g = model.graph
    types = {vi.name: vi.type.tensor_type for vi in list(g.input) + list(g.value_info) + list(g.output)}
    ids: dict[str, int] = {}
    lines = [SYMBOL]

    def shape_dtype(name):
        tt = types[name]
        dims = " ".join(str(d.dim_value) for d in tt.shape.dim)
        return dims, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))

    consts = {}
    init_names = {t.name for t in g.initializer}
    for inp in g.input:
        if inp.name in init_names:
            continue
        ids[inp.name] = len(ids)
        dims, dt = shape_dtype(inp.name)
        lines.append(" ".join(["  input", str(ids[inp.name]), dims, "dtype:", str(dt)]))
    for t in g.initializer:
        arr = numpy_helper.to_array(t)
        ids[t.name] = len(ids)
        consts[t.name] = arr
        lines.append(f"  const {ids[t.name]} {' '.join(map(str, arr.shape))} dtype: {arr.dtype} name: {t.name}")
    for node in g.node:
        ids[node.output[0]] = len(ids)
        ins = " ".join(str(ids[i]) if i else "-1" for i in node.input)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        dims, dt = shape_dtype(node.output[0])
        extra = f" attrs: {json.dumps(attrs)}" if attrs else ""
        lines.append(f"  {snake(node.op_type)} {ids[node.output[0]]} inputs: {ins} shape: {dims} dtype: {dt}{extra}")
    lines.append("  output " + " ".join(str(ids[o.name]) for o in g.output))
    text = "\n".join(lines) + "\n"

    # the graph JSON TVM writes for it: the model inputs, one external call, its outputs
    inputs = [i for i in g.input if i.name not in init_names]
    nodes, shapes, dtypes = [], [], []
    for inp in inputs:
        nodes.append({"op": "null", "name": inp.name, "inputs": []})
    outs = [o.name for o in g.output]
    nodes.append({"op": "tvm_op", "name": SYMBOL, "inputs": [[k, 0, 0] for k in range(len(inputs))],
                  "attrs": {"func_name": SYMBOL, "num_inputs": str(len(inputs)),
                            "num_outputs": str(len(outs)), "flatten_data": "0"}})
    for name in [i.name for i in inputs] + outs:
        dims, dt = shape_dtype(name)
        shapes.append([int(d) for d in dims.split()])
        dtypes.append(str(dt))
    n = len(shapes)
    graph = {"nodes": nodes, "arg_nodes": list(range(len(inputs))),
             "heads": [[len(inputs), k, 0] for k in range(len(outs))],
             "node_row_ptr": list(range(len(inputs) + 1)) + [n],
             "attrs": {"storage_id": ["list_int", list(range(n))], "shape": ["list_shape", shapes],
                       "dltype": ["list_str", dtypes]}}
    return text, json.dumps(graph), consts


def load_executor(model, workdir: Path, compiler: str):
    """Library file → ``load_module`` → ``default(cpu(0))``, as the board does.

    ``compiler`` "client": the project's compiler (``client.compile_onnx``, partitioning with
    composites and TVM-like storage plan); "adapter": the one-subgraph conversion above.
    """
    from rpcsrv.executor import load_module
    from rpcsrv.loader import (ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,
                               HostLibraryModule, build_blob)
    from rpcsrv.protocol.dtypes import Device

    path = workdir / "model.blob"
    if compiler == "client":
        from rpcsrv.client import compile_onnx

        compile_onnx(model).export_library(str(path), fmt="blob")
    else:
        text, graph_json, consts = to_examplejson(model)
        tree = GraphExecutorFactoryModule(graph_json, {}, imports=[HostLibraryModule([], imports=[
            ConstLoaderModule(consts, {SYMBOL: list(consts)}, imports=[ExampleJSONModule(text)])])])
        blob = build_blob(tree)
        path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return load_module(str(path)).get_function("default")(Device(1, 0))


# ---------------------------------------------------------------------- timing
def median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def bench(name: str, model, threads: int, repeat: int, workdir: Path, compiler: str) -> dict:
    import onnxruntime as ort

    feeds = {i.name: np.random.default_rng(2).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input
        if i.name not in {t.name for t in model.graph.initializer}}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)[0]

    ex = load_executor(model, workdir, compiler)
    for key, value in feeds.items():
        ex.get_function("set_input")(key, value)

    def run_rpcsrv():
        ex.get_function("run")()

    run_rpcsrv()
    got = ex.get_function("get_output")(0)
    diff = float(np.max(np.abs(got - expected)))
    ort_ms = median_ms(lambda: sess.run(None, feeds), repeat)
    # context: onnxruntime without its graph rewrites (no Conv+BN folding, no fused layouts)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ort_plain_ms = median_ms(lambda: plain.run(None, feeds), repeat)
    ours_ms = median_ms(run_rpcsrv, repeat)
    kernel_ms = kernel_profile(ex, run_rpcsrv, repeat)
    return {"model": name, "compiler": compiler, "nodes": len(model.graph.node), "onnxruntime_ms": round(ort_ms, 3),
            "rpcsrv_ms": round(ours_ms, 3), "ratio": round(ours_ms / ort_ms, 2),
            "onnxruntime_unoptimized_ms": round(ort_plain_ms, 3),
            "ratio_vs_unoptimized": round(ours_ms / ort_plain_ms, 2), "max_abs_diff": diff,
            "max_abs_output": float(np.max(np.abs(expected))),
            "kernel_ms": round(sum(kernel_ms.values()), 3),
            "slowest_ops_ms": dict(sorted(kernel_ms.items(), key=lambda kv: -kv[1])[:5])}


def kernel_profile(ex, run, repeat: int) -> dict[str, float]:
    """Milliseconds per run spent in each op's kernels (the rest of a run is executor overhead).

    Wraps the kernels of the executor's ExampleJSON function in timers for a few extra runs.
    """
    from rpcsrv.executor.examplejson.subgraphs import SubgraphFunction

    totals: dict[str, float] = {}

    def timed(op, kernel):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return kernel(*args, **kwargs)
            finally:
                totals[op] = totals.get(op, 0.0) + time.perf_counter() - start
        return call

    runs = max(3, repeat // 4)
    for fn, _args in ex.op_execs:
        if isinstance(fn, SubgraphFunction):
            fn.steps = [(node, timed(node.op, kernel), *rest) for node, kernel, *rest in fn.steps]
    for _ in range(runs):
        run()
    return {op: round(t * 1e3 / runs, 3) for op, t in totals.items()}


def blas_core() -> str:
    """The OpenBLAS core numpy's BLAS runs on (``Haswell``, ``SkylakeX``, ...), or "unknown"."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
        for lib in libs:
            for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                           "openblas_get_corename"):
                fn = getattr(ctypes.CDLL(lib), symbol, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    return fn().decode()
    except OSError:
        pass
    return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="threads for onnxruntime and BLAS (default 1)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--models", default="resnet,encoder")
    ap.add_argument("--compiler", default="client,adapter",
                    help="client (client.compile_onnx), adapter (this file's converter) or both")
    ap.add_argument("--size", default="half",
                    help="resnet size(s): half (112x112, widths 32..256), full (ResNet-18, 224x224), or half,full")
    ap.add_argument("--blas-core", default="env",
                    help="env (as the environment says, default), auto (drop OPENBLAS_CORETYPE) or a core "
                         "name; only honoured on the command line (it must act before numpy starts)")
    args = ap.parse_args(argv)
    sizes = args.size.split(",")
    unknown = sorted(set(sizes) - set(RESNET_SIZES))
    if unknown:
        ap.error(f"unknown --size {', '.join(unknown)} (choose from {', '.join(RESNET_SIZES)})")
    core = {"blas_core": blas_core(), "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", "")}
    runs = []
    for name in args.models.split(","):
        if name == "resnet":
            runs += [(name, size, lambda size=size: build_resnet(size)) for size in sizes]
        elif name == "encoder":
            runs.append((name, None, build_encoder))
        else:
            ap.error(f"unknown model {name!r} (choose from resnet, encoder)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, build in runs:
            label = {"size": size} if size else {}
            for compiler in args.compiler.split(","):
                try:
                    row = bench(name, build(), args.threads, args.repeat, Path(tmp), compiler)
                except Exception as exc:  # e.g. an op the kernel table does not have yet
                    row = {"model": name, "compiler": compiler, "error": f"{type(exc).__name__}: {exc}"}
                rows.append({"model": row.pop("model"), **label, **row, **core})
    for row in rows:
        print(json.dumps(row))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
