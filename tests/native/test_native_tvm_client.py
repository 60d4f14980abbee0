"""The real apache-tvm 0.27 client runs TVM-compiled kernels and classic C functions on rpcsrv.

The server runs as ``rpcsrv serve`` in a child process (native code isolated in a worker per
session by default; one module also checks ``--native inprocess`` and ``--no-native``).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import module_server, need_module
from native_helpers import KERNELS, build_c, kernel_inputs, matmul_candidates, tvm_kernels

tvm = need_module("tvm", "the real TVM client")
from tvm import rpc  # noqa: E402


@pytest.fixture(scope="module", params=["isolated", "inprocess"])
def native_server(request, tmp_path_factory):
    yield from module_server(tmp_path_factory, "--native", request.param)


@pytest.fixture(scope="module")
def isolated_server(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return tvm_kernels(tmp_path_factory.mktemp("tvm"))


@pytest.fixture(scope="module")
def c_target(tmp_path_factory):
    return build_c("c_target_kernels", tmp_path_factory.mktemp("c"))


def _connect(srv, **kw):
    return rpc.connect(srv.host, srv.port, **kw)


def test_tvm_kernels_run_and_are_timed(native_server, kernels):
    """float32, float64 and int32 kernels with 1 to 3 buffers: results checked, timings returned."""
    remote = _connect(native_server)
    dev = remote.cpu()
    for name, path in kernels.items():
        remote.upload(str(path))
        lib = remote.load_module(path.name)
        ins = kernel_inputs(name)
        args = [tvm.runtime.tensor(a, dev) for a in ins]
        out = tvm.runtime.tensor(np.zeros(16, KERNELS[name][0]), dev)
        lib[name](*args, out)
        np.testing.assert_array_equal(out.numpy(), KERNELS[name][2](*ins)[0], err_msg=name)
        out2 = tvm.runtime.tensor(np.zeros(16, KERNELS[name][0]), dev)
        lib.get_function(name)(*args, out2)
        np.testing.assert_array_equal(out2.numpy(), out.numpy())
        timer = lib.time_evaluator(name, dev, number=20, repeat=3)
        result = timer(*args, out)
        assert len(result.results) == 3 and all(0 < t < 0.01 for t in result.results), result.results


def test_kernel_error_carries_its_message(native_server, kernels):
    remote = _connect(native_server)
    dev = remote.cpu()
    remote.upload(str(kernels["add_one_f32"]))
    lib = remote.load_module("add_one_f32.so")
    a = tvm.runtime.tensor(np.zeros(16, "float32"), dev)
    wrong = tvm.runtime.tensor(np.zeros(16, "float64"), dev)
    with pytest.raises(Exception, match="Mismatched B.dtype on argument #1"):
        lib["add_one_f32"](a, wrong)
    with pytest.raises(Exception):
        lib["no_such_kernel"]
    lib["add_one_f32"](a, a)  # the session goes on


def test_classic_fixtures_through_the_tvm_client(native_server, c_target):
    remote = _connect(native_server)
    dev = remote.cpu()
    remote.upload(str(c_target), "kernels.so")
    lib = remote.load_module("kernels.so")
    x = np.arange(10, dtype="float32")
    a, b = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros(10, "float32"), dev)
    lib["add_one"](a, b)
    np.testing.assert_array_equal(b.numpy(), x + 1)
    lib["call_env"](b, a)
    np.testing.assert_array_equal(a.numpy(), x + 2)
    assert lib["twice_plus_one"](4) == 9
    with pytest.raises(Exception, match="always_fail: this fixture refuses every call"):
        lib["always_fail"]()


def test_crash_and_abort_end_only_their_session(isolated_server, c_target):
    for bad in ("crash", "boom"):
        remote = _connect(isolated_server)
        remote.upload(str(c_target), "kernels.so")
        lib = remote.load_module("kernels.so")
        with pytest.raises(Exception, match=r"native code crashed \(killed by SIG(SEGV|ABRT)\)"):
            lib[bad]()
        with pytest.raises(Exception, match="native worker of this session is gone"):
            lib["twice_plus_one"](1)
        lib = remote.load_module("kernels.so")  # a fresh worker for the same session
        assert lib["twice_plus_one"](1) == 3
        start = time.monotonic()
        fresh = _connect(isolated_server)  # and a fresh session works at once
        fresh.upload(str(c_target), "kernels.so")
        assert fresh.load_module("kernels.so")["twice_plus_one"](2) == 5
        assert time.monotonic() - start < 10
    assert isolated_server.alive()


def test_endless_loop_ends_at_the_session_timeout(isolated_server, c_target):
    connected = time.monotonic()  # (the deadline leaves the worker's start room on a loaded machine)
    remote = _connect(isolated_server, session_timeout=10)
    remote.upload(str(c_target), "kernels.so")
    lib = remote.load_module("kernels.so")
    with pytest.raises(Exception):
        lib["spin"]()
    assert time.monotonic() - connected < 10 + 15
    fresh = _connect(isolated_server)
    fresh.upload(str(c_target), "kernels.so")
    assert fresh.load_module("kernels.so")["twice_plus_one"](5) == 11
    assert isolated_server.alive()


@pytest.fixture(scope="module")
def no_native_server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--no-native")


def test_no_native_refuses_native_code(no_native_server, c_target):
    remote = _connect(no_native_server)
    remote.upload(str(c_target), "kernels.so")
    with pytest.raises(Exception, match="does not run native code .*--no-native.*add_one"):
        remote.load_module("kernels.so")


@pytest.mark.toolchain
def test_cross_built_library_fails_at_load_module(isolated_server, tmp_path):
    path = build_c("c_target_kernels", tmp_path, "arm-linux-gnueabihf-gcc")
    remote = _connect(isolated_server)
    remote.upload(str(path), "arm.so")
    with pytest.raises(Exception, match="built for ARM ELF32 le hard-float.*: add_one, always_fail"):
        remote.load_module("arm.so")


def test_metaschedule_runner_functions(isolated_server, tmp_path):
    """rpc_runner's own upload, alloc (random_fill_for_measure on the board) and evaluator (with the
    cache flush) upload, fill and time 8 TVM-compiled matmul candidates of different sizes."""
    need_module("tvm.s_tir.meta_schedule", "MetaSchedule's runner")
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, rpc_runner

    sizes = [(16, 16, 16), (32, 16, 8), (8, 64, 32), (64, 64, 64), (33, 17, 9), (128, 32, 16), (4, 4, 256),
             (96, 48, 24)]
    paths = matmul_candidates(tmp_path, sizes)
    remote = _connect(isolated_server)
    dev = remote.cpu()
    config = EvaluatorConfig(number=3, repeat=2, min_repeat_ms=0, enable_cpu_cache_flush=True)
    for (n, m, k), path in zip(sizes, paths):
        rt_mod = rpc_runner.default_upload_module(remote, str(path), path.name)
        args_info = [["TENSOR", "float32", [n, k]], ["TENSOR", "float32", [k, m]], ["TENSOR", "float32", [n, m]]]
        repeated = rpc_runner.default_alloc_argument(remote, dev, args_info, 2)
        a, b = repeated[0][0].numpy(), repeated[0][1].numpy()
        assert 1.0 <= a.min() and a.max() < 10.0  # TVM's random_fill_for_measure range
        assert not np.array_equal(repeated[0][0].numpy(), repeated[1][0].numpy())
        costs = rpc_runner.default_run_evaluator(remote, rt_mod, dev, config, repeated)
        assert len(costs) == 4 and all(c > 0 for c in costs), costs
        np.testing.assert_allclose(repeated[0][2].numpy(), a @ b, rtol=1e-4)
