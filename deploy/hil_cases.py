"""The HIL runner's native cases: libraries apache-tvm and ``byoc`` compile for one board machine.

For each machine (``amd64``, ``arm64``, ``armv7``) the runner sends, besides the demo ExampleJSON blobs
(machine-independent, ``hil_runner.build_cases``):

* ``kernel``: a TVM kernel (``tvm.compile`` of a TE function) and ``par_ws``, one with a parallel loop
  and a workspace buffer (it calls the runtime's parallel launch and workspace allocator through the
  board's shim), cross-compiled by apache-tvm for the machine's triple and linked by its gcc;
* ``byoc_partial``: the demo CNN partially offloaded (``compile_onnx(..., ops=[Conv, Gemm])``: three
  ExampleJSON subgraphs, the other nodes as host C functions linked into a ``.so`` by the cross gcc,
  what ``byoc compile --ops conv,gemm --cc <cross gcc>`` writes);
* ``relax_mlp``: a Relax VM executable (``tvm.relax.frontend.onnx`` -> ``tvm.compile``) for the machine.

Expected outputs come from numpy (kernels) or onnxruntime (models), never from TVM itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: machine -> (TVM target, C compiler that links for it)
MACHINES = {
    "amd64": ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, "gcc"),
    "arm64": ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "aarch64-linux-gnu-gcc"),
    # hard-float EABI as Debian's armhf (gcc refuses to link soft-float objects into it)
    "armv7": ({"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mattr": ["+neon"], "mfloat-abi": "hard"},
              "arm-linux-gnueabihf-gcc"),
}


def _kernels(tvm, target: dict, fcompile, out_dir: Path, machine: str, Case) -> list:
    from tvm import te

    rng = np.random.default_rng(7)
    n = 1024
    a, b = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    c = te.compute((n,), lambda i: a[i] * 2.0 + b[i], name="C")
    lib = out_dir / f"kernel_{machine}.so"
    tvm.compile(te.create_prim_func([a, b, c]).with_attr("global_symbol", "scale_add"),
                target=target).export_library(str(lib), fcompile=fcompile)
    x, y = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
    cases = [Case("kernel", lib, {"A": x, "B": y}, [x * 2 + y], kind="kernel", entry="scale_add")]

    # a parallel loop over an intermediate buffer: TVMBackendParallelLaunch and the workspace allocator
    n = 4096
    a = te.placeholder((n,), name="A")
    t = te.compute((n,), lambda i: a[i] * 2.0, name="T")
    c = te.compute((n,), lambda i: t[i] + t[n - 1 - i], name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, c]).with_attr("global_symbol", "par_ws"))
    block = sch.get_sblock("C") if hasattr(sch, "get_sblock") else sch.get_block("C")
    sch.parallel(sch.get_loops(block)[0])
    lib = out_dir / f"par_ws_{machine}.so"
    tvm.compile(sch.mod, target=target).export_library(str(lib), fcompile=fcompile)
    x = rng.standard_normal(n).astype("float32")
    cases.append(Case("par_ws", lib, {"A": x}, [2 * x + 2 * x[::-1]], kind="kernel", entry="par_ws"))
    return cases


def _mlp():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype("float32"), n)
            for n, s in [("w1", (32, 64)), ("b1", (64,)), ("w2", (64, 10)), ("b2", (10,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def machine_cases(out_dir: Path, machine: str, Case) -> list:
    """Every native case for ``machine``, compiled into ``out_dir``, as ``Case`` objects (the runner's)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.support import cc

    from rpcsrv.client.compiler import compile_onnx
    from rpcsrv.client.demo_models import onnxruntime_outputs, sample_inputs, small_cnn

    target, gcc = MACHINES[machine]
    target = tvm.target.Target(target)  # relax.build wants a Target, not the dict
    fcompile = cc.cross_compiler(gcc)
    cases = _kernels(tvm, target, fcompile, out_dir, machine, Case)

    cnn = small_cnn()
    lib = out_dir / f"byoc_partial_{machine}.so"
    compile_onnx(cnn, ops=["Conv", "Gemm"]).export_library(str(lib), cc=gcc)
    inputs = sample_inputs(cnn)
    cases.append(Case("byoc_partial", lib, inputs, onnxruntime_outputs(cnn, inputs)))

    mlp = _mlp()
    lib = out_dir / f"relax_mlp_{machine}.so"
    tvm.compile(relax.transform.DecomposeOpsForInference()(from_onnx(mlp, keep_params_in_input=False)),
                target=target).export_library(str(lib), fcompile=fcompile)
    x = {"x": np.random.default_rng(5).standard_normal((4, 32)).astype("float32")}
    cases.append(Case("relax_mlp", lib, x, onnxruntime_outputs(mlp, x), kind="vm", entry="main"))
    return cases
