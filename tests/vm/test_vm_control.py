"""Control flow and closures in compiled Relax: ``If`` on a boolean tensor, a local function that
captures a variable (``make_closure`` / ``invoke_closure`` after ``LambdaLift``), and a call into a
second bytecode function; the same results as TVM's own VM."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.native import load_native_module as load_module  # kernels run in this process
import vm_fixtures

tvm = vm_fixtures.tvm  # the shared fixture


def _module():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class Module:
        @R.function
        def main(c: R.Tensor((), "bool"), x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
            @R.function
            def inner(z: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
                s = R.add(x, z)
                return s

            if c:
                r = inner(y)
            else:
                r = R.multiply(x, y)
            return r

    return Module


@pytest.fixture(scope="module")
def control_lib(tvm, tmp_path_factory):
    from tvm import relax

    path = tmp_path_factory.mktemp("vm-control") / "control.so"
    tvm.compile(relax.transform.LambdaLift()(_module()), target="llvm").export_library(str(path))
    return path


def test_if_and_closure_match_tvm(tvm, control_lib):
    from tvm import relax

    vm = load_module(str(control_lib)).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    theirs = relax.VirtualMachine(tvm.runtime.load_module(str(control_lib)), tvm.cpu())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 2.5, np.float32)
    for cond in (True, False):
        got = vm.get_function("main")(np.array(cond), x, y)
        want = theirs["main"](*[tvm.runtime.tensor(a) for a in (np.array(cond), x, y)]).numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, x + y if cond else x * y)
    lifted = [f.name for f in vm.exe.functions if f.kind == 1 and f.name != "main"]
    assert lifted, "LambdaLift made the local function a bytecode function of its own"
    assert "vm.builtin.make_closure" in vm.executable.by_name and "vm.builtin.invoke_closure" in vm.executable.by_name
