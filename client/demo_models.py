"""Small ONNX models for the demo and the tests, built with ``onnx.helper`` (no downloads).

* ``seed_model``: the BYOC guide's example — four 10x10 inputs, add → subtract → multiply.
* ``small_cnn``: conv+bias+relu → max pool → conv+bias+relu → global average pool → flatten →
  gemm (dense+bias) → softmax, on a 1x3x32x32 image, with deterministic random weights.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="rpcsrv-demo")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def seed_model() -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(f"input{i}", TensorProto.FLOAT, [10, 10]) for i in range(4)]
    nodes = [
        helper.make_node("Add", ["input0", "input1"], ["t0"], name="add"),
        helper.make_node("Sub", ["t0", "input2"], ["t1"], name="subtract"),
        helper.make_node("Mul", ["t1", "input3"], ["out"], name="multiply"),
    ]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [10, 10])
    return _model(helper.make_graph(nodes, "byoc_seed", inputs, [out]))


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(name: str, shape, scale: float = 0.2) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"), name)

    inits = [w("c1_w", (8, 3, 3, 3)), w("c1_b", (8,)), w("c2_w", (16, 8, 3, 3)), w("c2_b", (16,)),
             w("fc_w", (10, 16)), w("fc_b", (10,))]
    nodes = [
        helper.make_node("Conv", ["image", "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2],
                         name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])
    return _model(helper.make_graph(nodes, "small_cnn", [image], [probs], initializer=inits))


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for every graph input of ``model``."""
    rng = np.random.default_rng(seed)
    init_names = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = rng.standard_normal(shape).astype(dtype)
    return out


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference answer."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)
