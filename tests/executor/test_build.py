"""From the loader's module tree (and from library files) to runnable runtime modules."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import need_program
from exec_helpers import SEED, GraphBuilder, seed_graph_json
from rpcsrv.executor import (ConstLoaderRuntime, ExampleJSONError, ExampleJSONRuntime, ExecutorError,
                             GraphExecutorFactoryRuntime, HostLibraryRuntime, build_runtime, load_module)
from rpcsrv.loader import (ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, UnknownModule,
                           build_blob)
from rpcsrv.loader import ExampleJSONModule as EJNode
from rpcsrv.protocol.dtypes import Device

CPU = Device(1, 0)
SYM = "tvmgen_default_examplejson_main_0"
CONST_EJ = f"""{SYM}
  input 0 2 2
  const 1 2 2 name: {SYM}_const_0
  const 2 2 2 name: bias
  add 3 inputs: 0 1 shape: 2 2
  add 4 inputs: 3 2 shape: 2 2
"""


def const_graph() -> str:
    g = GraphBuilder()
    x = g.input("x", (2, 2))
    y = g.op(SYM, [x], [((2, 2), "float32")])
    return g.json([y])


def const_tree(consts: dict, params: dict, by_symbol=None) -> GraphExecutorFactoryModule:
    ej = EJNode(CONST_EJ)
    loader = ConstLoaderModule(consts, by_symbol if by_symbol is not None else {SYM: list(consts)}, imports=[ej])
    lib = HostLibraryModule(["__tvm_main__", "fused_host_op"], imports=[loader])
    return GraphExecutorFactoryModule(const_graph(), params, imports=[lib])


def run_const(top) -> np.ndarray:
    ex = top.get_function("default")(CPU)
    ex.set_input("x", np.full((2, 2), 100, np.float32))
    ex.run()
    return ex.get_output(0)


def test_tree_kinds_and_constants_from_const_loader_and_params():
    c0 = np.arange(4, dtype=np.float32).reshape(2, 2)
    top = build_runtime(const_tree({f"{SYM}_const_0": c0}, {"bias": np.full((2, 2), 0.5, np.float32)}))
    kinds = [type(m) for m in top.walk()]
    assert kinds == [GraphExecutorFactoryRuntime, HostLibraryRuntime, ConstLoaderRuntime, ExampleJSONRuntime]
    np.testing.assert_array_equal(run_const(top), 100 + c0 + 0.5)
    # the const loader's functions reach through to the module it imports, as in TVM
    assert top.find_function(SYM) is not None
    assert list(top.imports[0].imports[0].get_function("get_const_var_ndarray")()) == [f"{SYM}_const_0"]


def test_missing_or_misshaped_constant_fails_at_load_time():
    c0 = np.zeros((2, 2), np.float32)
    with pytest.raises(ExecutorError,
                       match=r"constant\(s\) 'bias' not found in a const loader module or the graph params"):
        build_runtime(const_tree({f"{SYM}_const_0": c0}, {}))
    with pytest.raises(ExecutorError,
                       match=r"constant 'bias' from the graph params is float32 \[3\], declared float32 \[2, 2\]"):
        build_runtime(const_tree({f"{SYM}_const_0": c0}, {"bias": np.zeros(3, np.float32)}))
    with pytest.raises(ExecutorError, match="missing constant 'w' for function"):
        build_runtime(const_tree({}, {}, by_symbol={SYM: ["w"]}))


def test_bad_examplejson_fails_at_load_time_with_the_line():
    bad = EJNode(SEED + "  frobnicate 7 inputs: 6 shape: 1\n")
    tree = GraphExecutorFactoryModule(seed_graph_json(), {}, imports=[HostLibraryModule([], imports=[bad])])
    with pytest.raises(ExampleJSONError, match="line 9: unknown op 'frobnicate'"):
        build_runtime(tree)


def test_host_function_and_unknown_module():
    g = GraphBuilder()
    x = g.input("x", (2,))
    y = g.op("fused_host_op", [x], [((2,), "float32")])
    tree = GraphExecutorFactoryModule(g.json([y]), {}, imports=[
        HostLibraryModule(["fused_host_op"], imports=[UnknownModule(type_key="vendor_npu", payload=b"..")])])
    top = build_runtime(tree)
    assert [m.type_key for m in top.walk()] == ["GraphExecutorFactory", "_lib", "vendor_npu"]
    with pytest.raises(ExecutorError, match="host function fused_host_op cannot run: native code is "
                                            "disabled"):
        top.get_function("default")(CPU)
    g2 = GraphBuilder()
    y2 = g2.op("npu_func", [g2.input("x", (2,))], [((2,), "float32")])
    tree2 = GraphExecutorFactoryModule(g2.json([y2]), {}, imports=[HostLibraryModule([], imports=[
        UnknownModule(type_key="vendor_npu")])])
    with pytest.raises(ExecutorError, match="no such function in module: npu_func .*_lib → vendor_npu; "
                                            "modules of type vendor_npu cannot be run"):
        build_runtime(tree2).get_function("default")(CPU)


def seed_tree():
    return GraphExecutorFactoryModule(seed_graph_json(), {}, imports=[HostLibraryModule([], imports=[EJNode(SEED)])])


def check_seed_module(top):
    ex = top.get_function("default")(CPU)
    vals = [np.full((10, 10), v, np.float32) for v in (3, 4, 5, 6)]
    for i, v in enumerate(vals):
        ex.set_input(f"input{i}", v)
    ex.run()
    assert (ex.get_output(0) == (3 + 4 - 5) * 6).all()


def test_load_module_from_a_raw_blob_file(tmp_path):
    blob = build_blob(seed_tree())
    path = tmp_path / "seed.blob"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    check_seed_module(load_module(str(path)))


def test_load_module_from_a_shared_library(tmp_path):
    cc = need_program("gcc", "builds a .so carrying the module blob")
    blob = build_blob(seed_tree())
    data = len(blob).to_bytes(8, "little") + blob
    src = tmp_path / "lib.c"
    src.write_text("const unsigned char __tvm_dev_mblob[] = {" + ",".join(map(str, data)) + "};\n"
                   "int tvm_host_stub(void) { return 0; }\n")
    so = tmp_path / "seed.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    check_seed_module(load_module(str(so)))
