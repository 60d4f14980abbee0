"""Models built with ``onnx.helper`` for the executor benchmarks (random weights, fixed seeds).

Shared by ``executor_bench.py`` (ResNet, encoder) and ``zoo_bench.py`` (encoder, and the depthwise
family of ``zoo_mobile.py`` through :class:`ModelBuilder`): one module both import, so neither bench
imports the other (issue 26's import circle).

* ``resnet``  — a ResNet-18-style CNN: conv stem, max pool, four stages of two basic residual blocks
  (Conv-BN-ReLU, 1x1 projection when the shape changes), global average pool, Gemm.  ``size="half"``
  is a half-width ResNet-18 on 1x3x112x112 (3x3 stem, widths 32/64/128/256); ``"full"`` the real
  ResNet-18 shape, 1x3x224x224 with a 7x7 stem and widths 64/128/256/512.
* ``encoder`` — a transformer encoder (post-norm LayerNormalization, ReLU FFN).
"""

from __future__ import annotations

import numpy as np


class ModelBuilder:
    """A tiny wrapper over onnx.helper: named nodes, random initializers, unique names."""

    def __init__(self, seed: int = 0):
        import onnx  # noqa: F401  (checked early)

        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def weight(self, shape, scale=None, prefix="w", offset=0.0) -> str:
        from onnx import numpy_helper

        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = scale if scale is not None else np.sqrt(2.0 / max(fan_in, 1))
        name = self.name(prefix)
        values = self.rng.standard_normal(shape) * scale + offset
        self.inits.append(numpy_helper.from_array(values.astype(np.float32), name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        from onnx import numpy_helper

        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs, **attrs) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def model(self, inputs, output: str, opset: int = 17):
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes, "bench",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model)
        return model


#: size: (input side, stem kernel, stage widths); "tiny" for tests
RESNET_SIZES = {"half": (112, 3, (32, 64, 128, 256)), "full": (224, 7, (64, 128, 256, 512)),
                "tiny": (32, 3, (8, 16, 16, 32))}


def build_resnet(size: str = "half"):
    side, stem, widths = RESNET_SIZES[size]
    b = ModelBuilder(0)

    def conv_bn(x, cin, cout, k, stride, relu=True):
        y = b.op("Conv", [x, b.weight((cout, cin, k, k)), b.weight((cout,), 0.01)],
                 kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        y = b.op("BatchNormalization", [y, b.weight((cout,), 0.1, "g", 1.0), b.weight((cout,), 0.1, "b"),
                                        b.weight((cout,), 0.1, "m"), b.weight((cout,), 0.1, "v", 1.0)])
        return b.op("Relu", [y]) if relu else y

    x = conv_bn("data", 3, widths[0], stem, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for cout, stride in zip(widths, (1, 2, 2, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            y = conv_bn(x, cin, cout, 3, s)
            y = conv_bn(y, cout, cout, 3, 1, relu=False)
            short = x if (s == 1 and cin == cout) else conv_bn(x, cin, cout, 1, s, relu=False)
            x = b.op("Relu", [b.op("Add", [y, short])])
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    out = b.op("Gemm", [x, b.weight((10, cin)), b.weight((10,), 0.01)], transB=1)
    return b.model([("data", [1, 3, side, side])], out)


def build_encoder(seq=64, width=128, heads=4, ffn=512, layers=2):
    b = ModelBuilder(1)
    hd = width // heads
    x = "tokens"
    for _ in range(layers):
        def proj(t):
            y = b.op("Add", [b.op("MatMul", [t, b.weight((width, width))]), b.weight((width,), 0.01)])
            y = b.op("Reshape", [y, b.const([1, seq, heads, hd])])
            return b.op("Transpose", [y], perm=[0, 2, 1, 3])

        q, k, v = proj(x), proj(x), proj(x)
        scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [scores, b.const(1.0 / np.sqrt(hd), np.float32)])
        att = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        att = b.op("Reshape", [b.op("Transpose", [att], perm=[0, 2, 1, 3]), b.const([1, seq, width])])
        att = b.op("Add", [b.op("MatMul", [att, b.weight((width, width))]), b.weight((width,), 0.01)])
        x = b.op("LayerNormalization", [b.op("Add", [x, att]), b.weight((width,), 0.1, "g", 1.0),
                                        b.weight((width,), 0.1, "b")], axis=-1)
        h = b.op("Relu", [b.op("Add", [b.op("MatMul", [x, b.weight((width, ffn))]), b.weight((ffn,), 0.01)])])
        h = b.op("Add", [b.op("MatMul", [h, b.weight((ffn, width))]), b.weight((width,), 0.01)])
        x = b.op("LayerNormalization", [b.op("Add", [x, h]), b.weight((width,), 0.1, "g", 1.0),
                                        b.weight((width,), 0.1, "b")], axis=-1)
    return b.model([("tokens", [1, seq, width])], x)
