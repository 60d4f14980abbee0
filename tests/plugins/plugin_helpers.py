"""A small CNN for the plugin tests (onnx.helper, no downloads) and the example vendor plugin's folder.

The CNN uses every op record of the example accelerator (examples/vendor-plugin): Conv+Relu (also
grouped), MaxPool, a residual Add+Relu, Flatten, Gemm (transposed weights) + Relu, Gemm; and a
Dropout, which must vanish at compile time."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO

VENDOR = REPO / "examples" / "vendor-plugin"


def cnn_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype("float32")

    inits = {"w1": w(8, 3, 3, 3), "b1": w(8, 1)[:, 0], "w2": w(8, 4, 3, 3), "b2": w(8, 1)[:, 0],
             "fc1": w(16, 128), "fb1": w(16, 1)[:, 0], "fc2": w(16, 5), "fb2": w(5, 1)[:, 0]}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=2, name="conv2"),
             n("Relu", ["c2"], ["r2"], name="relu2"),
             n("Add", ["r2", "p1"], ["s"], name="residual"),
             n("Relu", ["s"], ["rs"], name="relu3"),
             n("Dropout", ["rs"], ["d"], name="dropout"),
             n("MaxPool", ["d"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
             n("Flatten", ["p2"], ["f"], name="flatten"),
             n("Gemm", ["f", "fc1", "fb1"], ["g1"], transB=1, name="fc1"),
             n("Relu", ["g1"], ["h"], name="relu4"),
             n("Gemm", ["h", "fc2", "fb2"], ["y"], name="fc2")]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's answer."""
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


#: a module of the fake distribution: a plugin that claims the built-in ``examplejson`` type key
DUP_PLUGIN = '''
from rpcsrv.loader.examplejson import KIND
from rpcsrv.loader.plugins import ModuleKind, RuntimePlugin

PLUGIN = RuntimePlugin("dup", (ModuleKind(("examplejson",), KIND.codec, KIND.runtime),))
'''


def fake_site(root) -> str:
    """A folder to put on ``sys.path`` / ``PYTHONPATH``: an installed distribution ``fake-plugins``
    whose entry points name the example vendor plugin (its source folder is added too), a plugin
    that does not import and one that claims a taken type key.  Returns the path list to prepend."""
    site = root / "site"
    info = site / "fake_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rpcsrv.runtimes]\nbroken = no_such_module_for_rpcsrv:PLUGIN\ndup = fake_dup_plugin:PLUGIN\n"
        "vendor_npu = vendor_npu.runtime:PLUGIN\n\n[byoc.codegens]\nvendor_npu = vendor_npu.codegen:CODEGEN\n")
    (site / "fake_dup_plugin.py").write_text(DUP_PLUGIN)
    return f"{site}:{VENDOR}"
