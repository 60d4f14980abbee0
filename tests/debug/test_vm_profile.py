"""Relax VM instrumentation: TVM's ``set_instrument`` in process, and rpcsrv's ``rpcsrv_profile`` (every
call of one VM function timed) in process and through apache-tvm 0.27's client, on libraries that
apache-tvm compiled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vm"))

import vm_fixtures  # noqa: E402
import vm_models  # noqa: E402
from rpcsrv.native import load_native_module as load_module  # noqa: E402  (kernels run in this process)

tvm, vm_libs = vm_fixtures.tvm, vm_fixtures.vm_libs  # the shared fixtures


def make_vm(path):
    vm = load_module(str(path)).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    return vm


def test_set_instrument_sees_every_call_before_and_after(tvm, vm_libs):
    vm = make_vm(vm_libs["mlp"])
    args = vm_models.inputs("mlp")
    want = vm.get_function("main")(*args).copy()
    seen = []

    def instrument(func, symbol, before_run, ret_value, *call_args):
        seen.append((symbol, before_run))
        return 0

    vm.get_function("set_instrument")(instrument)
    np.testing.assert_allclose(vm.get_function("main")(*args), want, rtol=1e-6)
    assert seen and len(seen) % 2 == 0
    names = [s for s, before in seen if before]
    assert names == [s for s, before in seen if not before] or len(set(names)) > 1  # nested calls interleave
    assert any(name.startswith("vm.builtin.") for name in names)
    kernels = [n for n in names if not n.startswith("vm.builtin.")]
    assert kernels, names  # the library's own kernels are instrumented too
    vm.get_function("set_instrument")(None)
    count = len(seen)
    vm.get_function("main")(*args)
    assert len(seen) == count  # removed: not called any more


def test_instrument_returning_1_skips_the_call(tvm, vm_libs):
    vm = make_vm(vm_libs["mlp"])
    args = vm_models.inputs("mlp")
    want = vm.get_function("main")(*args).copy()
    first_kernel = []

    def skip_first_kernel(func, symbol, before_run, ret_value, *call_args):
        if before_run and not symbol.startswith("vm.builtin.") and not first_kernel:
            first_kernel.append(symbol)
            return 1
        return 0

    vm.get_function("set_instrument")(skip_first_kernel)
    got = vm.get_function("main")(*args)
    assert first_kernel and not np.allclose(got, want)
    with pytest.raises(Exception, match="expects a function or None"):
        vm.get_function("set_instrument")(3)


def test_rpcsrv_profile_in_process(tvm, vm_libs):
    vm = make_vm(vm_libs["cnn"])
    args = vm_models.inputs("cnn")
    report = json.loads(vm.get_function("rpcsrv_profile")("main", *args))
    calls = {c["name"]: c for c in report["calls"]}
    kernels = [c for name, c in calls.items() if not name.startswith("vm.builtin.")]
    assert kernels and all(c["calls"] >= 1 and c["min_seconds"] <= c["mean_seconds"] <= c["max_seconds"]
                           for c in report["calls"])
    assert sum(c["total_seconds"] for c in kernels) <= report["total_seconds"]
    assert vm.instrument is None  # the previous (no) instrument is back
    np.testing.assert_allclose(vm.get_function("main")(*args), vm_fixtures.tvm_reference(tvm, vm_libs["cnn"], args)[0],
                               rtol=1e-6, atol=1e-6)


def test_rpcsrv_profile_through_the_real_client(tvm, server, vm_libs):
    from tvm import relax

    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(vm_libs["cnn"]))
    vm = relax.VirtualMachine(sess.load_module(vm_libs["cnn"].name), sess.cpu())
    args = vm_models.inputs("cnn")
    remote_args = [tvm.runtime.tensor(a, sess.cpu()) for a in args]
    report = json.loads(vm.module["rpcsrv_profile"]("main", *remote_args))
    kernels = [c for c in report["calls"] if not c["name"].startswith("vm.builtin.")]
    assert kernels and report["total_seconds"] > 0 and report["recorded"] >= len(kernels)
    out = vm["main"](*remote_args).numpy()  # runs normally afterwards
    np.testing.assert_allclose(out, vm_fixtures.tvm_reference(tvm, vm_libs["cnn"], args)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(Exception, match="Unknown function"):
        vm.module["rpcsrv_profile"]("nope")
    assert server.alive()


def test_byoc_profile_of_a_relax_library(tvm, server, vm_libs, tmp_path, capsys):
    from rpcsrv.client.cli import main as byoc

    (x,) = vm_models.inputs("cnn")
    np.save(tmp_path / "x.npy", x)
    port = ["--host", server.host, "--port", str(server.port)]
    assert byoc(["profile", str(vm_libs["cnn"]), *port, "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "3",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["executor"] == "relax.VirtualMachine" and report["function"] == "main"
    nodes = {n["name"]: n for n in report["nodes"]}
    assert "conv2d" in nodes and nodes["conv2d"]["inputs"][0] == {"shape": [1, 3, 16, 16], "dtype": "float32"}
    assert all(len(n["seconds"]["all"]) == 3 for n in report["nodes"])
    assert sum(n["share"] for n in report["nodes"]) == pytest.approx(1.0)
    assert report["total_node_seconds"] <= max(report["run_seconds"]["all"]) * 1.5
    assert byoc(["profile", str(vm_libs["cnn"]), *port]) == 2
    assert "--input must give every parameter of main: x" in capsys.readouterr().err
