"""Classic-ABI fixtures through rpcsrv's own client (both dialects), and host code built by a cross
compiler refused at load_module with its architecture."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import compile_onnx
from rpcsrv.client.rpc import RPCError, connect
from conftest import module_server, need_program
from native_helpers import build_c
from rpcsrv.protocol import Dialect


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.mark.parametrize("dialect", [Dialect.CLASSIC, Dialect.FFI])
def test_classic_fixtures_through_our_client(server, tmp_path, dialect):
    for name in ("c_target_kernels", "llvm_style_kernels"):
        path = build_c(name, tmp_path)
        sess = connect(server.host, server.port, dialect=dialect)
        sess.upload(str(path), f"{name}.so")
        lib = sess.load_module(f"{name}.so")
        dev = sess.cpu()
        x = np.arange(100, dtype="float32")
        a, b = sess.array(x, dev), sess.empty((100,), "float32", dev)
        if name == "c_target_kernels":
            lib["add_one"](a, b)
            np.testing.assert_array_equal(b.numpy(), x + 1)
            times = lib.time_evaluator("add_one", dev, number=5, repeat=2)(a, b)
            assert len(times) == 2 and all(t > 0 for t in times)
            with pytest.raises(RPCError, match="always_fail: this fixture refuses every call"):
                lib["always_fail"]()
        else:
            lib["parallel_scale"](a, b, 4, -1)
            np.testing.assert_allclose(b.numpy(), x * 2 + x.sum(), rtol=1e-6)
            with pytest.raises(RPCError, match="task refused"):
                lib["parallel_scale"](a, b, 4, 1)


@pytest.mark.toolchain
def test_cross_compiled_host_functions_are_refused_at_load(server, tmp_path):
    cc = need_program("arm-linux-gnueabihf-gcc", "cross-compiles the host functions")
    nodes = [helper.make_node("Add", ["x", "y"], ["a"], name="add"),
             helper.make_node("Softmax", ["a"], ["out"], name="softmax")]
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
    from compiler_helpers import make_model

    compiled = compile_onnx(make_model(nodes, [("x", [2, 5]), ("y", [2, 5])], [("out", [2, 5])]), ops="add")
    path = compiled.export_library(tmp_path / "arm.so", cc=cc)
    sess = connect(server.host, server.port)
    sess.upload(str(path), "arm.so")
    with pytest.raises(RPCError, match="built for ARM ELF32 le hard-float.*tvmgen_default_fused_softmax_0"):
        sess.load_module("arm.so")
