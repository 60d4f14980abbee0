"""The README's real-TVM snippets run as written.

The apache-tvm (>= 0.21) snippet runs with the real TVM client against ``rpcsrv serve``; only the port
number is replaced by the test server's.  The classic (<= 0.20) snippet needs a classic TVM, which does
not install on this Python: it runs with a stand-in ``tvm`` package made of our own client
(``rpcsrv.client.rpc``, ``rpcsrv.client.graph_executor.GraphModule``), which checks the snippet's calls and order;
the classic client's own bytes are covered by the recorded sessions (tests/server/test_replay.py).
Both work in a folder holding ``model.so`` and ``x.npy``, as a user's would.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.client.compiler import compile_onnx
from conftest import need_module

README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def snippet(marker: str) -> str:
    (found,) = [s for s in snippets() if marker in s]
    return found


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """model.so (y = relu(x) * 2 + 1 on a 2x3 x) and x.npy, and the folder as the working directory."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["m"]),
             helper.make_node("Add", ["m", "one"], ["y"])]
    graph = helper.make_graph(nodes, "readme", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.float32(2), "two"),
                               numpy_helper.from_array(np.float32(1), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compile_onnx(model).export_library(str(tmp_path / "model.so"))
    x = np.array([[-1, 0, 1], [2, -3, 4]], np.float32)
    np.save(tmp_path / "x.npy", x)
    monkeypatch.chdir(tmp_path)
    return np.maximum(x, 0) * 2 + 1


def run(code: str, port: int) -> dict:
    assert '"127.0.0.1", 9090' in code
    scope: dict = {}
    exec(compile(code.replace('"127.0.0.1", 9090', f'"127.0.0.1", {port}'), "README.md", "exec"), scope)
    return scope


def test_the_readme_has_one_snippet_per_tvm_generation():
    assert len(snippets()) == 2
    assert "graph_executor" not in snippet('m["set_input"]')
    assert "tvm.runtime.tensor" in snippet('m["set_input"]') and "tvm.nd.array" in snippet("GraphModule")


@pytest.mark.tvm
def test_tvm_ffi_snippet_with_apache_tvm(server, user_folder):
    need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    scope = run(snippet('m["set_input"]'), server.port)
    np.testing.assert_allclose(scope["y"], user_folder)


def test_classic_snippet_with_our_client_as_tvm(server, user_folder, monkeypatch):
    from rpcsrv.client import graph_executor, rpc

    tvm = types.ModuleType("tvm")
    tvm.rpc = rpc
    tvm.nd = types.SimpleNamespace(array=lambda x, dev: np.asarray(x))  # GraphModule uploads numpy arrays
    tvm.contrib = types.ModuleType("tvm.contrib")
    tvm.contrib.graph_executor = graph_executor
    for name, module in (("tvm", tvm), ("tvm.rpc", rpc), ("tvm.contrib", tvm.contrib),
                         ("tvm.contrib.graph_executor", graph_executor)):
        monkeypatch.setitem(sys.modules, name, module)
    scope = run(snippet("GraphModule"), server.port)
    np.testing.assert_allclose(scope["y"], user_folder)
