"""Small CNNs quantized by onnxruntime's own quantizer (``quant_pre_process``, then ``quantize_static``), for the
int8 compiler tests, and what they are judged by: onnxruntime's outputs, within one quantization step.

* :func:`resnet_like`: conv3x3 + relu, a stride-2 conv + relu, a residual block (conv + relu, conv, Add,
  relu), max pool, a 1x1 conv branch concatenated, global average pool, flatten, gemm: in QOperator form
  QLinearConv, QLinearAdd, QLinearConcat, QLinearGlobalAveragePool, QGemm (the ``com.microsoft`` ops).
* :func:`mobilenet_like`: conv + ReLU6 (Clip), a depthwise conv + ReLU6, a 1x1 conv, max pool, flatten,
  matmul: in QOperator form only ONNX's own QLinearConv and QLinearMatMul.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = (1, 3, 16, 16)


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.inits, self.nodes = [], []

    def w(self, name, shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op, ins, out, **attrs):
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def model(self, out_shape) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def resnet_like(seed: int = 1) -> onnx.ModelProto:
    n = _Net(seed)
    x = n.node("Relu", [n.node("Conv", ["x", n.w("w1", (8, 3, 3, 3)), n.w("b1", (8,), 0.1)], "conv1",
                               pads=[1, 1, 1, 1])], "relu1")
    x = n.node("Relu", [n.node("Conv", [x, n.w("w2", (16, 8, 3, 3)), n.w("b2", (16,), 0.1)], "conv2",
                               pads=[1, 1, 1, 1], strides=[2, 2])], "relu2")
    y = n.node("Relu", [n.node("Conv", [x, n.w("w3", (16, 16, 3, 3)), n.w("b3", (16,), 0.1)], "conv3",
                               pads=[1, 1, 1, 1])], "relu3")
    y = n.node("Conv", [y, n.w("w4", (16, 16, 3, 3)), n.w("b4", (16,), 0.1)], "conv4", pads=[1, 1, 1, 1])
    x = n.node("Relu", [n.node("Add", [x, y], "residual")], "relu4")
    x = n.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    z = n.node("Conv", [x, n.w("w5", (8, 16, 1, 1)), n.w("b5", (8,), 0.1)], "conv5")
    x = n.node("Concat", [x, z], "cat", axis=1)
    x = n.node("Flatten", [n.node("GlobalAveragePool", [x], "gap")], "flat")
    n.node("Gemm", [x, n.w("wf", (10, 24)), n.w("bf", (10,), 0.1)], "out", transB=1)
    return n.model([1, 10])


def mobilenet_like(seed: int = 2) -> onnx.ModelProto:
    n = _Net(seed)
    lo, hi = n.const("zero", 0.0), n.const("six", 6.0)
    x = n.node("Clip", [n.node("Conv", ["x", n.w("w1", (8, 3, 3, 3)), n.w("b1", (8,), 0.1)], "conv1",
                               pads=[1, 1, 1, 1]), lo, hi], "relu6_1")
    x = n.node("Clip", [n.node("Conv", [x, n.w("dw", (8, 1, 3, 3)), n.w("db", (8,), 0.1)], "dwconv",
                               pads=[1, 1, 1, 1], group=8, strides=[2, 2]), lo, hi], "relu6_2")
    x = n.node("Conv", [x, n.w("pw", (16, 8, 1, 1)), n.w("pb", (16,), 0.1)], "pwconv")
    x = n.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    x = n.node("Flatten", [x], "flat")
    n.node("MatMul", [x, n.w("fc", (256, 10))], "out")
    return n.model([1, 10])


MODELS = {"resnet": resnet_like, "mobilenet": mobilenet_like}


def calibration(count: int = 16, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def quantized(folder: Path, name: str, fmt: str = "QDQ", per_channel: bool = False,
              activations: str = "QUInt8") -> Path:
    """``MODELS[name]`` quantized by onnxruntime (after its ``quant_pre_process``); the file's path."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": x} for x in calibration()])

        def get_next(self):
            return next(self.data, None)

    folder = Path(folder)
    src, pre = folder / f"{name}.onnx", folder / f"{name}_pre.onnx"
    out = folder / f"{name}_{fmt}_{'pc' if per_channel else 'pt'}_{activations}.onnx"
    if not out.exists():
        onnx.save(MODELS[name](), src)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        quantize_static(str(pre), str(out), Reader(), quant_format=getattr(QuantFormat, fmt),
                        per_channel=per_channel, activation_type=getattr(QuantType, activations),
                        weight_type=QuantType.QInt8)
    return out


def reference(path, x: np.ndarray) -> np.ndarray:
    """onnxruntime's output for ``x``."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def output_step(path) -> float:
    """The scale of the model's last DequantizeLinear: one quantization step of its float output."""
    model = onnx.load(str(path))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    return float(consts[last.input[1]].reshape(-1)[0])


def within_one_step(ours: np.ndarray, theirs: np.ndarray, step: float) -> float:
    """The share of elements within one quantization step of onnxruntime's."""
    return float(np.mean(np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) <= step * 1.001))


def sample_input(seed: int = 11) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
