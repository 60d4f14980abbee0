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
    from client.export import export_library

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
