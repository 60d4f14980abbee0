"""No-ops vanish at compile time (simplify.remove_noops, TVM's SimplifyInference): Dropout, Identity, and
same-shape Cast/Reshape/... never reach a codegen or the host C.  A real model: the model zoo's SqueezeNet
(the onnx wheel's light model, opset 9, varied weights), whose Dropout made ``--ops conv,relu`` fail with
"Dropout has no host implementation"; now it compiles and runs on the board through the real TVM client."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, server  # noqa: F401  (the module's board)
from conftest import need_module
from rpcsrv.client.compiler import compile_onnx
from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.simplify import remove_noops

sys.path.insert(0, str(REPO / "tests" / "models"))
from zoo_weights import varied  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _graph(nodes, out="y", inits=None, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return import_onnx(model)


def test_noops_in_the_middle_and_at_the_end():
    n = helper.make_node
    g = _graph([n("Relu", ["x"], ["a"]), n("Dropout", ["a"], ["b"]), n("Identity", ["b"], ["c"]),
                n("Cast", ["c"], ["d"], to=TensorProto.FLOAT), n("Sigmoid", ["d"], ["e"]), n("Dropout", ["e"], ["y"])])
    assert remove_noops(g) == 4
    assert [(m.op_type, m.inputs, m.outputs) for m in g.nodes] == [("Relu", ["x"], ["a"]), ("Sigmoid", ["a"], ["y"])]
    assert g.outputs == ["y"]


def test_what_is_not_a_noop_stays():
    n = helper.make_node
    training = {"t": np.array(True)}
    g = _graph([n("Dropout", ["x", "", "t"], ["y"])], inits=training)  # training mode: not a no-op
    assert remove_noops(g) == 0
    g = _graph([n("Identity", ["x"], ["y"])])  # a model input straight to an output: nothing to rename
    assert remove_noops(g) == 0
    g = _graph([n("Relu", ["x"], ["a"]), n("Dropout", ["a"], ["y", "mask"]), n("Not", ["mask"], ["m2"])])
    assert remove_noops(g) == 0  # its mask is read


@pytest.mark.tvm
def test_squeezenet_with_a_dropout_and_few_ops(server, tmp_path):  # noqa: F811
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    ort = need_module("onnxruntime")
    model = varied(onnx.load(str(LIGHT / "light_squeezenet.onnx")))
    assert any(node.op_type == "Dropout" for node in model.graph.node)
    compiled = compile_onnx(model, ops="conv,relu")  # before: "Dropout has no host implementation"
    assert not any(node.op_type == "Dropout" for node in compiled.graph.nodes)
    assert compiled.subgraphs and compiled.host_functions
    lib = Path(compiled.export_library(tmp_path / "squeezenet.so"))
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i.name for i in model.graph.input if i.name not in inits]
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {inp: x})[0]
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(lib))
    dev = sess.cpu(0)
    m = sess.load_module(lib.name)["default"](dev)
    m["set_input"](inp, tvm.runtime.tensor(x, dev))
    m["run"]()
    np.testing.assert_allclose(m["get_output"](0).numpy(), want, rtol=1e-4, atol=1e-5)
