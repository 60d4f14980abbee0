"""The Relax VM run in process on libraries exported by apache-tvm: the same results as TVM's own VM
and onnxruntime, symbolic batch sizes, tuples, pooled storage, and clear errors for bad libraries
and bad arguments (the VM stays usable after each)."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.native import load_native_module as load_module  # kernels run in this process
from rpcsrv.executor.vm import VMError, VirtualMachine
import vm_fixtures
import vm_models

tvm, vm_libs = vm_fixtures.tvm, vm_fixtures.vm_libs  # the shared fixtures


def make_vm(path) -> VirtualMachine:
    vm = load_module(str(path)).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    return vm


def as_list(out):
    return out if isinstance(out, list) else [out]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "two_outputs"])
def test_same_results_as_tvm_vm_and_onnxruntime(tvm, vm_libs, name):
    args = vm_models.inputs(name)
    got = as_list(make_vm(vm_libs[name]).get_function("main")(*args))
    want = vm_fixtures.tvm_reference(tvm, vm_libs[name], args)
    ref = vm_models.onnx_reference(name, args)
    assert len(got) == len(want) == len(ref)
    for g, w, r in zip(got, want, ref):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


def test_symbolic_batch_runs_at_several_sizes(tvm, vm_libs):
    vm = make_vm(vm_libs["dynbatch"])
    main = vm.get_function("main")
    for batch in (1, 4, 7, 4):
        args = vm_models.inputs("dynbatch", batch=batch, seed=batch)
        out = main(*args)
        assert out.shape == (batch, 8)
        np.testing.assert_allclose(out, vm_fixtures.tvm_reference(tvm, vm_libs["dynbatch"], args)[0],
                                   rtol=1e-6, atol=1e-6)


def test_outputs_survive_later_runs_and_storage_is_reused(vm_libs):
    vm = make_vm(vm_libs["cnn"])
    main = vm.get_function("main")
    a, b = vm_models.inputs("cnn", seed=1), vm_models.inputs("cnn", seed=2)
    out_a = main(*a).copy()
    kept = main(*a)
    peak = vm.pool.peak_bytes
    for _ in range(3):
        main(*b)
    np.testing.assert_array_equal(kept, out_a)  # a returned tensor is never recycled under the caller
    assert vm.pool.peak_bytes <= peak + 4096  # later runs reuse the pooled buffers (one new output page)


def test_stateful_api_and_saved_function(vm_libs):
    vm = make_vm(vm_libs["two_outputs"])
    x = vm_models.inputs("two_outputs")[0]
    with pytest.raises(VMError, match="No inputs set"):
        vm.get_function("invoke_stateful")("main")
    vm.get_function("set_input")("main", x)
    vm.get_function("invoke_stateful")("main")
    assert vm.get_function("get_output_arity")("main") == 2
    assert vm.get_function("get_output_arity")("main", 0) == -1
    y1, y2 = vm.get_function("get_output")("main", 0), vm.get_function("get_output")("main", 1)
    ref = vm_models.onnx_reference("two_outputs", [x])
    np.testing.assert_allclose(y1, ref[0], rtol=1e-5)
    np.testing.assert_allclose(y2, ref[1], rtol=1e-5)
    with pytest.raises(VMError, match="cannot return a tuple"):
        vm.get_function("get_output")("main")
    assert vm.get_function("get_function_arity")("main") == 1
    assert vm.get_function("get_function_param_name")("main", 0) == "x"
    vm.get_function("save_function")("main", "main_saved", True, x)
    np.testing.assert_allclose(vm.get_function("main_saved")()[0], ref[0], rtol=1e-5)


def test_wrong_arguments_are_clear_errors_and_the_vm_lives(vm_libs):
    vm = make_vm(vm_libs["cnn"])
    main = vm.get_function("main")
    (x,) = vm_models.inputs("cnn")
    with pytest.raises(VMError, match=r"'main' expects 1 arguments \(x\), got 2"):
        main(x, x)
    with pytest.raises(VMError, match=r"param=x.*dimension 2 is 8, expected 16"):
        main(np.zeros((1, 3, 8, 16), np.float32))
    with pytest.raises(VMError, match=r"param=x.*4 dimensions"):
        main(np.zeros((3, 16, 16), np.float32))
    with pytest.raises(VMError, match=r"param=x.*dtype float32, got float64"):
        main(x.astype(np.float64))
    with pytest.raises(VMError, match="expected a tensor, got a int"):
        main(3)
    with pytest.raises(VMError, match="Unknown function"):
        vm.get_function("set_input")("nope", x)
    assert vm.get_function("nope") is None
    np.testing.assert_allclose(main(x), vm_models.onnx_reference("cnn", [x])[0], rtol=1e-4, atol=1e-4)


def test_uninitialized_vm_refuses_calls(vm_libs):
    vm = load_module(str(vm_libs["mlp"])).find_function("vm_load_executable")()
    with pytest.raises(VMError, match="vm_initialization"):
        vm.get_function("main")(*vm_models.inputs("mlp"))
    with pytest.raises(VMError, match="device type 2 is not available"):
        vm.get_function("vm_initialization")(2, 0, 2)


def _patched(path, tmp_path, old: bytes, new: bytes):
    """A copy of the library with ``old`` replaced by ``new`` inside its blob only (the ELF symbol
    tables stay intact)."""
    from rpcsrv.loader import load_library

    lib = load_library(path)
    data = bytearray(open(path, "rb").read())
    start, end = lib.blob_offset, lib.blob_offset + lib.blob_size
    assert len(old) == len(new) and data[start:end].count(old) >= 1
    data[start:end] = bytes(data[start:end]).replace(old, new)
    out = tmp_path / f"patched-{path.name}"
    out.write_bytes(bytes(data))
    return out


def test_missing_builtin_is_named_at_load(vm_libs, tmp_path):
    bad = _patched(vm_libs["mlp"], tmp_path, b"vm.builtin.null_value", b"vm.builtin.null_valuX")
    with pytest.raises(VMError, match="vm.builtin.null_valuX"):
        load_module(str(bad))


def test_missing_kernel_is_named_at_load(vm_libs, tmp_path):
    bad = _patched(vm_libs["two_outputs"], tmp_path, b"tir_sigmoid", b"tir_sigmoix")
    with pytest.raises(VMError, match="tir_sigmoix"):
        load_module(str(bad))


def test_unknown_opcode_is_refused_at_load(vm_libs, tmp_path):
    from rpcsrv.loader import load_library
    from rpcsrv.loader.vm_executable import VMExecutablePayload, encode

    exe = load_library(vm_libs["mlp"]).root
    payload = VMExecutablePayload.build(encode(exe))
    data = bytearray(open(vm_libs["mlp"], "rb").read())
    at = data.find(payload) + len(payload) - 8 * len(exe.instr_data) + 8 * int(exe.instr_offset[2])
    assert data[at:at + 8] == (1).to_bytes(8, "little")  # a Call
    data[at:at + 8] = (77).to_bytes(8, "little")
    bad = tmp_path / "opcode.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(VMError, match="instruction 2 .*unknown opcode 77"):
        load_module(str(bad))


def test_out_of_range_register_is_refused_at_load(vm_libs):
    from rpcsrv.loader import load_library
    from rpcsrv.executor.vm import VMExecutableRuntime
    from rpcsrv.loader.vm_executable import VMExecutableModule, VMFunction

    exe = load_library(vm_libs["mlp"]).root
    funcs = [VMFunction(f.kind, f.name, f.start_instr, f.end_instr, f.num_args, 2 if f.kind == 1 else 0,
                        f.param_names) for f in exe.functions]
    with pytest.raises(VMError, match="outside its 2 registers"):
        VMExecutableRuntime(VMExecutableModule(funcs, exe.constants, exe.instr_offset, exe.instr_data),
                            kernels=lambda name: (lambda *a: None))


def test_without_native_code_the_kernels_are_named_at_load(vm_libs):
    from rpcsrv.executor import load_module as load_without_native

    with pytest.raises(VMError, match=r"kernel\(s\) .*matmul.* native code is not enabled"):
        load_without_native(str(vm_libs["mlp"]))
