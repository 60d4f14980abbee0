"""What ``byoc compile`` says and writes for a codegen whose modules carry their own weights (the example
vendor_npu): each function's constants counted where they are (not "0 constant(s)"), and no const loader in the
library when no function takes constants from one; with ExampleJSON, whose constants the const loader binds, both
are as before."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

from plugin_helpers import cnn_model, fake_site
from rpcsrv.client.compiler import CompileError, compile_onnx
from rpcsrv.client.compiler.codegens import Codegen, External
from rpcsrv.client.compiler.examplejson import examplejson_text
from rpcsrv.client.compiler.model import build
from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.partition import partition
from rpcsrv.loader import ExampleJSONModule


def make_model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, 1, s) for n, s in outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _compile(env, model_path, out, *flags):
    done = subprocess.run([sys.executable, "-m", "rpcsrv.client.cli", "compile", str(model_path), "-o", str(out),
                           *flags], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_weights_in_the_module_are_counted_and_no_empty_const_loader(tmp_path):
    env = dict(os.environ, PYTHONPATH=fake_site(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = cnn_model()
    (tmp_path / "cnn.onnx").write_bytes(model.SerializeToString())
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = _compile(env, tmp_path / "cnn.onnx", tmp_path / "cnn.blob", "--codegen", "vendor_npu")
    (line,) = [x for x in out.splitlines() if x.startswith("  tvmgen_default_vendor_npu_main_0:")]
    count, nbytes, where = re.search(r"(\d+) constant\(s\) \((\d+) bytes, in the (\w+) module\)", line).groups()
    assert (int(count), int(nbytes), where) == (len(weights), sum(w.nbytes for w in weights.values()), "vendor_npu")
    shown = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", "--json", str(tmp_path / "cnn.blob")], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    keys = [m["type_key"] for m in json.loads(shown.stdout)["modules"]]
    assert keys == ["GraphExecutorFactory", "_lib", "vendor_npu"]


def test_examplejson_constants_stay_in_the_const_loader():
    compiled = compile_onnx(cnn_model())
    (sg,) = compiled.subgraphs
    assert sg.constants and sg.constants_line() == \
        f"{len(sg.constants)} constant(s) ({sum(a.nbytes for a in sg.constants.values())} bytes, in the const loader)"
    tree = compiled.module_tree()
    assert [m.type_key for m in tree.walk()] == ["GraphExecutorFactory", "_lib", "const_loader", "examplejson"]
    np.testing.assert_array_equal(next(iter(tree.imports[0].imports[0].arrays.values())),
                                  next(iter(sg.constants.values())))


class _Shared(Codegen):
    """Gives every function's constant the same const-loader name (a mistake byoc must catch)."""

    name = "shared"
    ops = frozenset({"add"})

    def __init__(self, result=None):
        self.result = result

    def generate(self, fn, graph):
        if self.result is not None:
            return self.result
        return External(ExampleJSONModule(examplejson_text(fn, graph)[0]),
                        {"w": graph.constants[t] for t in fn.constants})


def test_codegen_mistakes_are_compile_errors():
    n = helper.make_node
    model = make_model([n("Add", ["x", "c"], ["a"], name="add1"), n("Neg", ["a"], ["b"], name="neg"),
                        n("Add", ["b", "c"], ["y"], name="add2")], [("x", [3])], [("y", [3])],
                       {"c": np.ones(3, np.float32)})
    graph = import_onnx(model)
    part = partition(graph, _Shared.ops, host=True, codegen=_Shared())
    assert [fn.kind for fn in part.functions] == ["shared", "host", "shared"]
    with pytest.raises(CompileError, match="constant name 'w' given by tvmgen_default_shared_main_0 and "
                                           "tvmgen_default_shared_main_1"):
        build(graph, part, codegen=_Shared())
    with pytest.raises(CompileError, match="generate\\(\\) must return an External"):
        build(graph, part, codegen=_Shared(result="not a module"))
