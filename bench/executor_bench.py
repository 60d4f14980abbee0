"""Executor benchmark: rpcsrv's graph executor + ExampleJSON kernels against onnxruntime.

(A little over 400 lines: a script run by hand; the two model builders, the whole-model adapter and
the interleaved timing loop read best in one place.)

Two models are built here with ``onnx.helper`` (random weights, fixed seed):

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


if __name__ == "__main__" and "--zoo" in sys.argv:  # the light model zoo and an encoder: bench/zoo_bench.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import zoo_bench

    sys.exit(zoo_bench.main([a for a in sys.argv[1:] if a != "--zoo"]))

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _from_argv("--threads", "1"))  # must precede numpy's BLAS start-up
_blas_environment(_from_argv("--blas-core", "env"))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYMBOL = "tvmgen_default_examplejson_main_0"


# ---------------------------------------------------------------------- models
class ModelBuilder:
    """A tiny wrapper over onnx.helper: named nodes, random initializers, unique names."""

    def __init__(self, seed: int = 0):
        import onnx  # noqa: F401  (checked early)

        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def weight(self, shape, scale=None, prefix="w", offset=0.0) -> str:
        from onnx import numpy_helper

        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = scale if scale is not None else np.sqrt(2.0 / max(fan_in, 1))
        name = self.name(prefix)
        values = self.rng.standard_normal(shape) * scale + offset
        self.inits.append(numpy_helper.from_array(values.astype(np.float32), name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        from onnx import numpy_helper

        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs, **attrs) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def model(self, inputs, output: str, opset: int = 17):
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes, "bench",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model)
        return model


#: --size: (input side, stem kernel, stage widths)
RESNET_SIZES = {"half": (112, 3, (32, 64, 128, 256)), "full": (224, 7, (64, 128, 256, 512))}


def build_resnet(size: str = "half"):
    side, stem, widths = RESNET_SIZES[size]
    b = ModelBuilder(0)

    def conv_bn(x, cin, cout, k, stride, relu=True):
        y = b.op("Conv", [x, b.weight((cout, cin, k, k)), b.weight((cout,), 0.01)],
                 kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        y = b.op("BatchNormalization", [y, b.weight((cout,), 0.1, "g", 1.0), b.weight((cout,), 0.1, "b"),
                                        b.weight((cout,), 0.1, "m"), b.weight((cout,), 0.1, "v", 1.0)])
        return b.op("Relu", [y]) if relu else y

    x = conv_bn("data", 3, widths[0], stem, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for cout, stride in zip(widths, (1, 2, 2, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = conv_bn(x, cin, cout, 3, s)
            y = conv_bn(y, cout, cout, 3, 1, relu=False)
            short = x if (s == 1 and cin == cout) else conv_bn(x, cin, cout, 1, s, relu=False)
            x = b.op("Relu", [b.op("Add", [y, short])])
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    out = b.op("Gemm", [x, b.weight((10, cin)), b.weight((10,), 0.01)], transB=1)
    return b.model([("data", [1, 3, side, side])], out)


def build_encoder(seq=64, width=128, heads=4, ffn=512, layers=2):
    b = ModelBuilder(1)
    hd = width // heads
    x = "tokens"
    for _ in range(layers):
        def proj(t):
            y = b.op("Add", [b.op("MatMul", [t, b.weight((width, width))]), b.weight((width,), 0.01)])
            y = b.op("Reshape", [y, b.const([1, seq, heads, hd])])
            return b.op("Transpose", [y], perm=[0, 2, 1, 3])

        q, k, v = proj(x), proj(x), proj(x)
        scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [scores, b.const(1.0 / np.sqrt(hd), np.float32)])
        att = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        att = b.op("Reshape", [b.op("Transpose", [att], perm=[0, 2, 1, 3]), b.const([1, seq, width])])
        att = b.op("Add", [b.op("MatMul", [att, b.weight((width, width))]), b.weight((width,), 0.01)])
        x = b.op("LayerNormalization", [b.op("Add", [x, att]), b.weight((width,), 0.1, "g", 1.0),
                                        b.weight((width,), 0.1, "b")], axis=-1)
        h = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, b.weight((width, ffn))]), b.weight((ffn,), 0.01)])])
        h = b.op("Add", [b.op("MatMul", [h, b.weight((ffn, width))]), b.weight((width,), 0.01)])
        x = b.op("LayerNormalization", [b.op("Add", [x, h]), b.weight((width,), 0.1, "g", 1.0),
                                        b.weight((width,), 0.1, "b")], axis=-1)
    return b.model([("tokens", [1, seq, width])], x)


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
    from rpcsrv.executor.examplejson import SubgraphFunction

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
