"""The whole user story through the real TVM client: upload a BYOC library (the BYOC guide's
ExampleJSON subgraph, add → subtract → multiply on four 10x10 inputs) built by gcc, load it, create
the graph executor with ``lib["default"](dev)``, set inputs, run, read the output, time it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loader"))

from exec_helpers import SEED, seed_graph_json  # noqa: E402
from loader_fixtures import compile_library  # noqa: E402
from rpcsrv.loader import (BLOB_SYMBOL, ConstLoaderModule, ExampleJSONModule,  # noqa: E402
                           GraphExecutorFactoryModule, HostLibraryModule, build_blob)


def seed_tree():
    ej = ExampleJSONModule(code=SEED)
    const = ConstLoaderModule(arrays={}, const_vars_by_symbol={"subgraph_0": []}, imports=[ej])
    host = HostLibraryModule(symbols=[], imports=[const])
    return GraphExecutorFactoryModule(graph_json=seed_graph_json(), params={}, module_name="default",
                                      imports=[host])


@pytest.fixture(scope="module")
def seed_so(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed") / "ej_seed_full.so"
    return compile_library(build_blob(seed_tree()), BLOB_SYMBOL, "host", out)


@pytest.fixture(scope="module")
def tvm():
    return need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")


def inputs():
    rng = np.random.default_rng(7)
    return [rng.standard_normal((10, 10)).astype("float32") for _ in range(4)]


class GraphModule:
    """What ``tvm.contrib.graph_executor.GraphModule`` does (apache-tvm 0.27 no longer ships it):
    fetch the executor's functions by name from the module ``lib["default"](dev)`` returned."""

    NAMES = ["set_input", "run", "get_output", "get_input", "get_num_outputs", "get_num_inputs",
             "get_input_index", "get_input_info", "load_params", "share_params"]

    def __init__(self, module):
        self.module = module
        self.f = {name: module[name] for name in self.NAMES}

    def set_input(self, key, value):
        self.f["set_input"](key, value)


def test_seed_graph_through_real_tvm_client(tvm, server, seed_so):
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(seed_so))
    lib = sess.load_module(seed_so.name)
    dev = sess.cpu(0)
    gmod = GraphModule(lib["default"](dev))
    xs = inputs()
    for i, x in enumerate(xs):
        gmod.set_input(f"input{i}", tvm.runtime.tensor(x, dev))
    gmod.f["run"]()
    assert gmod.f["get_num_outputs"]() == 1
    assert gmod.f["get_num_inputs"]() == 4
    assert gmod.f["get_input_index"]("input2") == 2
    out = gmod.f["get_output"](0).numpy()
    np.testing.assert_allclose(out, ((xs[0] + xs[1]) - xs[2]) * xs[3], rtol=1e-6)
    # classic GraphModule's way: copy into the executor's own input tensor
    gmod.f["get_input"](0).copyfrom(tvm.runtime.tensor(xs[3], dev))
    gmod.f["run"]()
    into = tvm.runtime.empty((10, 10), "float32", dev)
    gmod.f["get_output"](0, into)
    np.testing.assert_allclose(into.numpy(), ((xs[3] + xs[1]) - xs[2]) * xs[3], rtol=1e-6)
    timer = gmod.module.time_evaluator("run", dev, number=3, repeat=2)
    res = timer()
    assert len(res.results) == 2 and all(r > 0 for r in res.results)
    with pytest.raises(Exception, match="nope"):
        gmod.set_input("nope", tvm.runtime.tensor(xs[0], dev))


def test_bad_library_is_a_clear_error(tvm, server, tmp_path):
    sess = tvm.rpc.connect(server.host, server.port)
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60)
    sess.upload(str(bad))
    with pytest.raises(Exception) as info:
        sess.load_module("bad.so")
    assert "bad.so" in str(info.value) or "ELF" in str(info.value)
    assert server.alive()
    with pytest.raises(Exception, match="no file"):
        sess.load_module("never-uploaded.so")
