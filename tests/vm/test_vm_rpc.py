"""Relax VM libraries exported by apache-tvm 0.27, run on rpcsrv through the real client's
``relax.VirtualMachine(remote.load_module(...), remote.cpu())``: same results as TVM's own VM,
the stateful API, ``time_evaluator``, and bad libraries or arguments answered with clear errors
while the session lives on."""

from __future__ import annotations

import numpy as np
import pytest

import vm_fixtures
import vm_models

tvm, vm_libs = vm_fixtures.tvm, vm_fixtures.vm_libs  # the shared fixtures


@pytest.fixture(scope="module")
def remote(tvm, server, vm_libs):
    sess = tvm.rpc.connect(server.host, server.port)
    for path in vm_libs.values():
        sess.upload(str(path))
    return sess


def remote_vm(tvm, remote, path):
    from tvm import relax

    return relax.VirtualMachine(remote.load_module(path.name), remote.cpu())


def to_remote(tvm, remote, args):
    return [tvm.runtime.tensor(a, remote.cpu()) for a in args]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_main_matches_tvm_vm(tvm, remote, vm_libs, name):
    vm = remote_vm(tvm, remote, vm_libs[name])
    args = vm_models.inputs(name)
    out = vm["main"](*to_remote(tvm, remote, args)).numpy()
    want = vm_fixtures.tvm_reference(tvm, vm_libs[name], args)[0]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, vm_models.onnx_reference(name, args)[0], rtol=1e-4, atol=1e-4)


def test_symbolic_batch_at_1_and_4(tvm, remote, vm_libs):
    vm = remote_vm(tvm, remote, vm_libs["dynbatch"])
    for batch in (1, 4):
        args = vm_models.inputs("dynbatch", batch=batch, seed=batch)
        out = vm["main"](*to_remote(tvm, remote, args)).numpy()
        assert out.shape == (batch, 8)
        np.testing.assert_allclose(out, vm_fixtures.tvm_reference(tvm, vm_libs["dynbatch"], args)[0],
                                   rtol=1e-6, atol=1e-6)


def test_two_outputs_through_the_stateful_api(tvm, remote, vm_libs):
    vm = remote_vm(tvm, remote, vm_libs["two_outputs"])
    args = vm_models.inputs("two_outputs")
    vm.set_input("main", *to_remote(tvm, remote, args))
    vm.invoke_stateful("main")
    y1, y2 = vm.get_outputs("main")
    want = vm_fixtures.tvm_reference(tvm, vm_libs["two_outputs"], args)
    np.testing.assert_allclose(y1.numpy(), want[0], rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), want[1], rtol=1e-6)
    # as with TVM's own server, a tuple returned by a direct call is an opaque remote object
    assert vm["main"](*to_remote(tvm, remote, args)) is not None


def test_time_evaluator_on_main(tvm, remote, vm_libs):
    vm = remote_vm(tvm, remote, vm_libs["cnn"])
    args = to_remote(tvm, remote, vm_models.inputs("cnn"))
    result = vm.time_evaluator("main", remote.cpu(), number=5, repeat=3)(*args)
    assert len(result.results) == 3
    assert all(1e-6 < t < 1.0 for t in result.results), result.results
    vm.save_function("main", "main_saved", *args)
    saved = vm.time_evaluator("main_saved", remote.cpu(), number=5, repeat=2)()
    assert all(1e-6 < t < 1.0 for t in saved.results)


def _still_works(tvm, remote, vm_libs):
    vm = remote_vm(tvm, remote, vm_libs["mlp"])
    args = vm_models.inputs("mlp")
    np.testing.assert_allclose(vm["main"](*to_remote(tvm, remote, args)).numpy(),
                               vm_models.onnx_reference("mlp", args)[0], rtol=1e-4, atol=1e-4)


def test_wrong_arguments_are_errors_and_the_session_lives(tvm, remote, vm_libs):
    vm = remote_vm(tvm, remote, vm_libs["cnn"])
    (x,) = vm_models.inputs("cnn")
    cases = [
        ([x, x], r"expects 1 arguments \(x\), got 2"),
        ([np.zeros((1, 3, 8, 16), np.float32)], r"dimension 2 is 8, expected 16"),
        ([x.astype(np.float64)], r"dtype float32, got float64"),
    ]
    for args, message in cases:
        with pytest.raises(Exception, match=message):
            vm["main"](*to_remote(tvm, remote, args))
    _still_works(tvm, remote, vm_libs)


def _upload_patched(tvm, remote, tmp_path, path, edit, name):
    data = bytearray(open(path, "rb").read())
    edit(data)
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    remote.upload(str(bad))
    return bad.name


def test_bad_libraries_are_refused_at_load_and_the_session_lives(tvm, remote, vm_libs, tmp_path):
    from rpcsrv.loader import load_library

    lib = load_library(vm_libs["mlp"])
    start, end = lib.blob_offset, lib.blob_offset + lib.blob_size

    def rename_builtin(data):
        data[start:end] = bytes(data[start:end]).replace(b"vm.builtin.null_value", b"vm.builtin.null_valuX")

    def truncate(data):
        del data[start + (end - start) // 2:]

    def break_magic(data):
        at = bytes(data).find((0xD225DE2F4214151E).to_bytes(8, "little"), start)
        data[at] ^= 0xFF

    def unknown_opcode(data):
        from rpcsrv.loader.vm_executable import VMExecutablePayload, encode

        payload = VMExecutablePayload.build(encode(lib.root))
        at = bytes(data).find(payload) + len(payload) - 8 * len(lib.root.instr_data)
        at += 8 * int(lib.root.instr_offset[1])
        data[at:at + 8] = (42).to_bytes(8, "little")

    for edit, message in [(rename_builtin, "vm.builtin.null_valuX"), (truncate, r"offset|past the end|truncated"),
                          (break_magic, "magic"), (unknown_opcode, r"instruction 1 .*unknown opcode 42")]:
        name = _upload_patched(tvm, remote, tmp_path, vm_libs["mlp"], edit, f"bad-{edit.__name__}.so")
        with pytest.raises(Exception, match=message):
            remote.load_module(name)
    _still_works(tvm, remote, vm_libs)
