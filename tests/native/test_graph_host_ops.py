"""The graph executor calls tvm_op nodes whose func_name is a native host function of the library.

The library is what TVM's ``export_library`` links for a classic graph: the blob (graph executor
factory -> ``_lib``) and the host functions in one .so, here compiled by gcc from our C fixture.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from native_helpers import FIXTURES, need_program
from rpcsrv.loader import BLOB_SYMBOL, GraphExecutorFactoryModule, HostLibraryModule, build_blob
from rpcsrv.native import load_native_module
from rpcsrv.protocol import Device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loader"))
from exec_helpers import GraphBuilder  # noqa: E402
from loader_fixtures import c_source  # noqa: E402

CPU = Device(1, 0)


def graph_library(tmp_path: Path, flatten: int) -> Path:
    """x (2x3) -> add_one -> add_one -> y, the second node with a reshaped output entry."""
    import subprocess

    g = GraphBuilder()
    x = g.input("x", (2, 3))
    h = g.op("add_one", [x], [((2, 3), "float32")], flatten=flatten)
    y = g.op("add_one", [h], [((6,), "float32")], flatten=flatten)
    tree = GraphExecutorFactoryModule(g.json([y]), {}, imports=[HostLibraryModule([])])
    src = tmp_path / "graph_host.c"
    src.write_text(c_source(build_blob(tree), BLOB_SYMBOL).replace("int tvmgen_default_fused_add", "static int unused")
                   + "\n" + (FIXTURES / "c_target_kernels.c").read_text().replace('#include "tvm_c_abi.h"',
                                                                        (FIXTURES / "tvm_c_abi.h").read_text()))
    out = tmp_path / "graph_host.so"
    subprocess.run([need_program("gcc"), "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                   capture_output=True)
    return out


@pytest.mark.parametrize("flatten", [0, 1])
def test_graph_calls_host_functions(tmp_path, flatten):
    top = load_native_module(str(graph_library(tmp_path, flatten)))
    ex = top.get_function("default")(CPU)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ex.get_function("set_input")("x", x)
    ex.get_function("run")()
    np.testing.assert_array_equal(ex.get_function("get_output")(0), x.reshape(-1) + 2)
    x2 = -x
    ex.get_function("set_input")("x", x2)
    ex.get_function("run")()  # the bound DLTensors still point at the storage
    np.testing.assert_array_equal(ex.get_function("get_output")(0), x2.reshape(-1) + 2)
