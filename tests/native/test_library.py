"""rpcsrv.native in this process: classic and tvm-ffi functions, runtime hooks, errors, machine checks."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from native_helpers import KERNELS, build_c, kernel_inputs, parallel_workspace_kernel, tvm_kernels
from rpcsrv.loader import load_library
from rpcsrv.native import NativeError, NativeLibraryRuntime, inspect_native, load_native_module, open_library


@pytest.fixture(scope="module")
def c_target(tmp_path_factory):
    return build_c("c_target_kernels", tmp_path_factory.mktemp("c"))


@pytest.fixture(scope="module")
def llvm_style(tmp_path_factory):
    return build_c("llvm_style_kernels", tmp_path_factory.mktemp("llvm"))


def test_library_without_blob_is_a_host_module(c_target):
    loaded = load_library(c_target)
    assert (loaded.layout, loaded.root.type_key) == ("none", "library")
    mod = load_native_module(str(c_target))
    assert isinstance(mod, NativeLibraryRuntime) and mod.type_key == "library"
    assert mod.get_function("no_such_function") is None


def test_classic_c_target_function_uses_workspace_and_entry(c_target):
    mod = load_native_module(str(c_target))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.zeros_like(a)
    mod.get_function("add_one")(a, b)
    np.testing.assert_array_equal(b, a + 1)
    b[:] = 0
    mod.get_function("__tvm_main__")(a, b)  # __tvm_main__ names add_one
    np.testing.assert_array_equal(b, a + 1)
    assert mod.get_function("twice_plus_one")(20) == 41
    assert open_library(str(c_target)).shim.rpcsrv_workspace_outstanding() == 0  # every block freed


def test_classic_lookup_through_the_module_context(c_target):
    """call_env finds add_one with TVMBackendGetFuncFromEnv(__tvm_module_ctx) and calls it via TVMFuncCall."""
    mod = load_native_module(str(c_target))
    a = np.linspace(0, 1, 7, dtype=np.float32)
    b = np.zeros_like(a)
    mod.get_function("call_env")(a, b)
    np.testing.assert_array_equal(b, a + 1)


def test_classic_errors_carry_the_message(c_target):
    mod = load_native_module(str(c_target))
    with pytest.raises(NativeError, match="always_fail: ValueError: always_fail: this fixture refuses every call"):
        mod.get_function("always_fail")()
    with pytest.raises(NativeError, match="add_one: B must be float32"):
        mod.get_function("add_one")(np.zeros(3, np.float32), np.zeros(3, np.float64))
    with pytest.raises(NativeError, match="num_args should be 2"):
        mod.get_function("add_one")(np.zeros(3, np.float32))


def test_llvm_style_hooks_workspace_parallel_barrier(llvm_style):
    """The __TVM* pointer globals are filled: workspace, parallel launch with a barrier between tasks."""
    fn = load_native_module(str(llvm_style)).get_function("parallel_scale")
    a = np.arange(1001, dtype=np.float32)
    for tasks in (1, 3, 8):
        b = np.zeros_like(a)
        fn(a, b, tasks, -1)
        np.testing.assert_allclose(b, a * 2 + a.sum(dtype=np.float64), rtol=1e-6)
    with pytest.raises(NativeError, match="parallel_scale: task refused"):
        fn(a, np.zeros_like(a), 4, 2)  # an error in a worker thread reaches the caller


def test_bound_call_reuses_converted_arguments(c_target):
    fn = load_native_module(str(c_target)).get_function("add_one")
    a, b = np.ones(5, np.float32), np.zeros(5, np.float32)
    call = fn.bind(a, b)
    a += 1
    call()
    np.testing.assert_array_equal(b, 3)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return tvm_kernels(tmp_path_factory.mktemp("tvm"))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_tvm_compiled_kernels(kernels, name):
    """apache-tvm 0.27 kernels (tvm-ffi ABI, __tvm_ffi_<name>) in float32/float64/int32, 1-3 buffers."""
    fn = load_native_module(str(kernels[name])).get_function(name)
    ins = kernel_inputs(name)
    out = np.zeros(16, KERNELS[name][0])
    fn(*ins, out)
    np.testing.assert_array_equal(out, KERNELS[name][2](*ins)[0])
    with pytest.raises(NativeError, match=f"{name}: .*(dtype|ndim|shape)"):
        fn(*ins, np.zeros(16, np.int8))


def test_tvm_kernel_with_parallel_loop_and_workspace(tmp_path):
    path = parallel_workspace_kernel(tmp_path)
    info = inspect_native(str(path))
    assert {"__TVMBackendParallelLaunch", "__TVMBackendAllocWorkspace"} <= set(info.hooks)
    fn = load_native_module(str(path)).get_function("par_ws")
    a = np.random.default_rng(5).standard_normal(4096).astype(np.float32)
    c = np.zeros_like(a)
    fn(a, c)
    np.testing.assert_array_equal(c, a * 2 + (a * 2)[::-1])
    assert fn.library.shim.rpcsrv_workspace_outstanding() == 0


@pytest.mark.toolchain
@pytest.mark.parametrize("cc,arch", [("arm-linux-gnueabihf-gcc", "ARM ELF32 le hard-float"),
                                     ("mips-linux-gnu-gcc", "MIPS ELF32 be")])
def test_cross_built_library_names_its_machine_and_functions(tmp_path, cc, arch):
    path = build_c("c_target_kernels", tmp_path, cc)
    with pytest.raises(NativeError, match=f"built for {arch}.*this board is .*: add_one, always_fail, boom, "
                                          f"call_env, crash, spin, twice_plus_one"):
        load_native_module(str(path))


def test_without_a_shim_the_needed_symbols_are_named(c_target, tmp_path):
    """No compiler and no prebuilt shim: the error names the runtime symbols the library needed."""
    code = ("import sys\nfrom rpcsrv.native import open_library\n"
            "try:\n    open_library(sys.argv[1])\nexcept Exception as e:\n    print(e)\n")
    env = dict(os.environ, RPCSRV_NATIVE_SHIM=str(tmp_path / "missing.so"))
    out = subprocess.run([sys.executable, "-c", code, str(c_target)], env=env, capture_output=True, text=True,
                         timeout=120).stdout
    assert "cannot resolve the runtime symbols it needs" in out
    for symbol in ("TVMAPISetLastError", "TVMBackendAllocWorkspace", "TVMBackendGetFuncFromEnv", "TVMFuncCall"):
        assert symbol in out
