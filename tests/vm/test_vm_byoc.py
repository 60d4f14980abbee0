"""BYOC in Relax: a VM executable compiled by apache-tvm whose offloaded region is an external
function (``R.call_dps_packed("subgraph_0", ...)``, what Relax's ``RunCodegen`` emits), served by an
ExampleJSON module (the BYOC guide's subgraph: add -> subtract -> multiply on four 10x10 inputs) in
the same library.  The library is written by our exporter (tvm-ffi layout, a .so built by cc) and
run through the real client's ``relax.VirtualMachine`` on rpcsrv."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_program
from rpcsrv.loader import ExampleJSONModule, load_library
import vm_fixtures

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
from exec_helpers import SEED  # noqa: E402

tvm = vm_fixtures.tvm  # the shared fixture


def offloaded_executable(tvm, folder: Path):
    """TVM's executable for main(a, b, c, d) = subgraph_0(a, b, c, d), an external DPS function."""
    from tvm import relax

    bb = relax.BlockBuilder()
    ty = relax.TensorType((10, 10), "float32")
    params = [relax.Var(n, ty) for n in "abcd"]
    with bb.function("main", params):
        out = bb.emit(relax.call_dps_packed("subgraph_0", relax.Tuple(params), out_ty=ty))
        bb.emit_func_output(out)
    path = folder / "offloaded-tvm.so"
    tvm.compile(bb.get(), target="llvm").export_library(str(path))
    return load_library(path).root


@pytest.fixture(scope="module")
def byoc_lib(tvm, tmp_path_factory):
    need_program("cc", "the library is a .so built by the system C compiler")
    from rpcsrv.client.export import export_library

    folder = tmp_path_factory.mktemp("vm-byoc")
    exe = offloaded_executable(tvm, folder)
    exe.imports = [ExampleJSONModule(code=SEED)]  # the external function's module replaces TVM's empty _lib
    return Path(export_library(exe, folder / "vm_byoc.so", layout="ffi"))


def seed_inputs():
    rng = np.random.default_rng(3)
    return [rng.standard_normal((10, 10)).astype("float32") for _ in range(4)]


def test_vm_calls_examplejson_in_process(byoc_lib):
    from rpcsrv.executor import load_module

    vm = load_module(str(byoc_lib)).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    a, b, c, d = seed_inputs()
    np.testing.assert_allclose(vm.get_function("main")(a, b, c, d), ((a + b) - c) * d, rtol=1e-6)


def test_vm_calls_examplejson_through_the_real_client(tvm, server, byoc_lib):
    from tvm import relax

    remote = tvm.rpc.connect(server.host, server.port)
    remote.upload(str(byoc_lib))
    vm = relax.VirtualMachine(remote.load_module(byoc_lib.name), remote.cpu())
    a, b, c, d = seed_inputs()
    out = vm["main"](*[tvm.runtime.tensor(x, remote.cpu()) for x in (a, b, c, d)]).numpy()
    np.testing.assert_allclose(out, ((a + b) - c) * d, rtol=1e-6)
    with pytest.raises(Exception, match=r"expects 4 arguments \(a, b, c, d\), got 3"):
        vm["main"](*[tvm.runtime.tensor(x, remote.cpu()) for x in (a, b, c)])


def test_byoc_compile_executor_relax_through_the_real_client(tvm, server, tmp_path):
    """``byoc compile --executor relax``: our compiler's partitioned model as a Relax VM executable,
    run by the real client's ``relax.VirtualMachine``, matching onnxruntime."""
    need_program("cc", "the library is a .so built by the system C compiler")
    import onnx  # the tvm fixture made sure of onnx and onnxruntime
    from tvm import relax

    from rpcsrv.client.cli import main as byoc
    from rpcsrv.client.demo_models import onnxruntime_outputs, sample_inputs, small_cnn
    from rpcsrv.loader.vm_executable import VMExecutableModule

    model = small_cnn()
    onnx.save(model, str(tmp_path / "cnn.onnx"))
    lib = tmp_path / "cnn_relax.so"
    assert byoc(["compile", str(tmp_path / "cnn.onnx"), "-o", str(lib), "--executor", "relax", "-q"]) == 0
    loaded = load_library(lib)
    assert loaded.layout == "ffi" and isinstance(loaded.root, VMExecutableModule)
    inputs = sample_inputs(model)
    want = onnxruntime_outputs(model, inputs)
    remote = tvm.rpc.connect(server.host, server.port)
    remote.upload(str(lib))
    vm = relax.VirtualMachine(remote.load_module(lib.name), remote.cpu())
    args = [tvm.runtime.tensor(inputs[i.name], remote.cpu()) for i in model.graph.input
            if i.name in inputs]
    out = vm["main"](*args)
    got = [out.numpy()] if hasattr(out, "numpy") else None
    if got is None:  # several outputs: read them through the stateful API
        vm.set_input("main", *args)
        vm.invoke_stateful("main")
        got = [o.numpy() for o in vm.get_outputs("main")]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_executor_relax_two_outputs_in_process(tmp_path):
    """Several graph outputs come back as a tuple (``make_tuple``), as from TVM's own executables."""
    from conftest import need_module

    onnx = need_module("onnx", "the model is an ONNX graph")
    need_module("onnxruntime", "onnxruntime is the numeric reference")

    from rpcsrv.client.compiler import compile_onnx
    from rpcsrv.executor import load_module
    import vm_models

    onnx.save(vm_models.onnx_model("two_outputs"), str(tmp_path / "two.onnx"))
    path = compile_onnx(str(tmp_path / "two.onnx")).export_library(tmp_path / "two.blob", executor="relax")
    vm = load_module(path).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    x = vm_models.inputs("two_outputs")
    out = vm.get_function("main")(*x)
    assert isinstance(out, list) and len(out) == 2
    for got, want in zip(out, vm_models.onnx_reference("two_outputs", x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
