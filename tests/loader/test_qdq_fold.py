"""``rpcsrv.loader.opset.qdq.fold_qdq`` on models quantized by onnxruntime's own quantizer (QDQ format, per
tensor and per channel, int8 and uint8 activations): every Conv, Gemm, Add and pooling chain folds into its
int8 op, the DQ nodes only the chains read go, and the folded graph, run op by op on the board's kernels,
gives onnxruntime's outputs within one quantization step.  Also: what must not fold stays."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

onnx = need_module("onnx", "builds the models")
ort = need_module("onnxruntime", "quantizes the models and is the reference")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rpcsrv.executor.kernels import KERNELS  # noqa: E402
from rpcsrv.loader.opset import onnx_op_to_kernel  # noqa: E402
from rpcsrv.loader.opset.qdq import QNode, fold_qdq  # noqa: E402
from rpcsrv.loader.opset.quant import QuantParams  # noqa: E402

RNG = np.random.default_rng(3)


def _cnn() -> onnx.ModelProto:
    """conv3x3+relu, maxpool, [conv3x3+relu, conv3x3] + residual add, relu, concat with a 1x1 conv branch,
    sigmoid gate (mul), average pool, global average pool, flatten, gemm."""
    inits, nodes = [], []

    def w(name, shape, scale=0.2):
        inits.append(numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    x = node("Conv", ["x", w("w1", (8, 3, 3, 3)), w("b1", (8,), 0.1)], "c1", pads=[1, 1, 1, 1])
    x = node("Relu", [x], "r1")
    x = node("MaxPool", [x], "p1", kernel_shape=[2, 2], strides=[2, 2])
    y = node("Relu", [node("Conv", [x, w("w2", (8, 8, 3, 3), 0.1), w("b2", (8,), 0.1)], "c2", pads=[1, 1, 1, 1])], "r2")
    y = node("Conv", [y, w("w3", (8, 8, 3, 3), 0.1), w("b3", (8,), 0.1)], "c3", pads=[1, 1, 1, 1])
    x = node("Relu", [node("Add", [x, y], "a1")], "r3")
    z = node("Conv", [x, w("w4", (4, 8, 1, 1)), w("b4", (4,), 0.1)], "c4")
    x = node("Concat", [x, z], "cat", axis=1)
    x = node("Mul", [x, node("Sigmoid", [x], "sig")], "gate")
    x = node("AveragePool", [x], "ap", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    x = node("Flatten", [node("GlobalAveragePool", [x], "gap")], "flat")
    node("Gemm", [x, w("wf", (10, 12)), w("bf", (10,), 0.1)], "out", transB=1)
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _quantized(tmp_path, per_channel: bool, activations) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_cnn(), src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8)
    return onnx.load(dst)


def _qnodes(model) -> tuple[list[QNode], dict]:
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = [QNode(onnx_op_to_kernel(n.op_type), list(n.input), list(n.output),
                   {a.name: helper.get_attribute_value(a) for a in n.attribute}) for n in model.graph.node]
    return nodes, consts


def _apply(nodes: list[QNode], folds) -> list[QNode]:
    gone = {k for f in folds for k in f.replace[:-1] + f.drop}
    at = {f.replace[-1]: f.node for f in folds}
    return [at.get(k, n) for k, n in enumerate(nodes) if k not in gone]


def _run(nodes: list[QNode], consts: dict, x: np.ndarray) -> np.ndarray:
    values = {**consts, "x": x}
    for n in nodes:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in n.attrs.items()}
        out = KERNELS[n.op](*[values[i] if i else None for i in n.inputs], **attrs)
        for name, v in zip(n.outputs, out if isinstance(out, tuple) else (out,)):
            values[name] = v
    return values["out"]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("activations", ["QUInt8", "QInt8"])
def test_onnxruntime_qdq_models_fold_and_match(tmp_path, per_channel, activations):
    model = _quantized(tmp_path, per_channel, activations)
    nodes, consts = _qnodes(model)
    made: dict = {}

    def new_ref(hint, array):
        name = f"folded_{hint}_{len(made)}"
        made[name] = array
        return name

    folds = fold_qdq(nodes, consts.get, keep=["out"], new_ref=new_ref, opset=17)
    ops = sorted(f.node.op for f in folds)
    assert ops.count("q_linear_conv") == 4, ops  # every conv (onnxruntime's quantizer dropped their Relus)
    assert {"q_gemm", "q_linear_add", "q_linear_concat", "q_linear_mul", "q_linear_sigmoid",
            "q_linear_average_pool", "q_linear_global_average_pool", "max_pool", "flatten"} <= set(ops), ops
    assert all(len(f.node.inputs) == 9 for f in folds if f.node.op == "q_linear_conv")  # the DQ's int32 bias
    assert not [r for f in folds for r in f.constants]  # nothing made: every bias and zero point was there
    folded = _apply(nodes, folds)
    left = [n.op for n in folded if n.op in ("dequantize_linear", "quantize_linear")]
    assert left == ["quantize_linear", "dequantize_linear"], left  # the input's Q and the output's DQ
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ours = _run(folded, {**consts, **made}, x)
    last = next(n for n in reversed(nodes) if n.op == "dequantize_linear")
    step = float(QuantParams.of(consts[last.inputs[1]]).scale)
    assert np.abs(ours - theirs).max() <= step * 1.001, (np.abs(ours - theirs).max(), step)
    unfolded = _run(nodes, consts, x)  # the QDQ graph as it is, op by op
    assert np.abs(unfolded - theirs).max() <= step * 1.001


def _dq(name, scale, zp):
    return QNode("dequantize_linear", [name, scale, zp], [name + "_f"])


def test_relu_and_clip_fuse_and_a_float_bias_is_quantized():
    """DQ -> Conv (float bias) -> Relu -> Q and DQ -> Gemm -> Clip(0, 6) -> Q: the activation becomes the int8
    op's clamp, the float bias an int32 constant of scale x_scale * w_scale (per output channel)."""
    consts = {"s": np.float32(0.1), "z": np.uint8(128), "ws": np.array([0.5, 0.25], np.float32),
              "wz": np.zeros(2, np.int8), "w": np.ones((2, 2, 1, 1), np.int8), "b": np.array([1.0, -1.0], np.float32),
              "lo": np.float32(0), "hi": np.float32(6), "g": np.ones((2, 2), np.int8), "ys": np.float32(0.05),
              "gz": np.int8(0)}
    nodes = [_dq("x", "s", "z"), QNode("dequantize_linear", ["w", "ws", "wz"], ["w_f"], {"axis": 0}),
             QNode("conv", ["x_f", "w_f", "b"], ["c"]), QNode("relu", ["c"], ["r"]),
             QNode("quantize_linear", ["r", "ys", "z"], ["rq"]),
             _dq("rq", "ys", "z"), QNode("dequantize_linear", ["g", "s", "gz"], ["g_f"]),
             QNode("gemm", ["rq_f", "g_f"], ["m"], {"transB": 1}), QNode("clip", ["m", "lo", "hi"], ["k"]),
             QNode("quantize_linear", ["k", "s", "z"], ["kq"])]
    made = {}

    def new_ref(hint, array):
        made[f"{hint}{len(made)}"] = array
        return f"{hint}{len(made) - 1}"

    folds = fold_qdq(nodes, consts.get, new_ref=new_ref)
    conv, gemm = (f.node for f in folds)
    assert conv.op == "q_linear_conv" and conv.attrs["activation"] == "relu" and conv.outputs == ["rq"]
    bias = made[conv.inputs[8]]
    assert bias.dtype == np.int32 and bias.tolist() == [20, -40]  # 1 / (0.1 * 0.5), -1 / (0.1 * 0.25)
    assert gemm.op == "q_gemm" and gemm.attrs["activation"] == "clip"
    assert gemm.attrs["activation_attrs"] == {"min": 0.0, "max": 6.0}
    assert sorted(k for f in folds for k in f.drop) == [0, 1, 5, 6]
    # without new_ref, the conv's float bias cannot become a constant: that chain stays
    assert [f.node.op for f in fold_qdq(nodes, consts.get)] == ["q_gemm"]


def test_what_must_not_fold_stays():
    """A conv whose float result is also a graph output, one whose Q is per channel, and a pass-through op
    whose Q changes the parameters: none folds, and the shared DQ stays for its other reader."""
    consts = {"s": np.float32(0.1), "z": np.int8(0), "s2": np.float32(0.2), "w": np.ones((2, 2, 1, 1), np.int8),
              "sc": np.ones(2, np.float32), "zc": np.zeros(2, np.int8)}
    nodes = [_dq("x", "s", "z"), _dq("w", "s", "z"),
             QNode("conv", ["x_f", "w_f"], ["c"]), QNode("quantize_linear", ["c", "s", "z"], ["cq"]),
             QNode("conv", ["x_f", "w_f"], ["d"]), QNode("quantize_linear", ["d", "sc", "zc"], ["dq"], {"axis": 1}),
             QNode("max_pool", ["x_f"], ["p"], {"kernel_shape": [1, 1]}),
             QNode("quantize_linear", ["p", "s2", "z"], ["pq"]),
             QNode("relu", ["x_f"], ["r"])]
    assert fold_qdq(nodes, consts.get, keep=["c"]) == []
    folds = fold_qdq(nodes, consts.get, keep=[])
    assert [f.node.op for f in folds] == ["q_linear_conv"] and folds[0].drop == []  # x_f and w_f still read
