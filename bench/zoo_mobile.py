"""The depthwise-separable family for ``zoo_bench.py`` (issue 27), built with ``onnx.helper``.

Real sizes (1x3x224x224, 1000 classes, the published layer tables) with random weights, shaped as a
PyTorch export of the torchvision models in eval mode looks: BatchNormalization folded into each conv's
bias, ReLU6 as ``Clip(0, 6)``, HardSwish and HardSigmoid (alpha 1/6) as their ONNX ops, SiLU as
``x * Sigmoid(x)``.  No torch needed.

* ``mobilenetv2``: MobileNetV2 width 1.0 (inverted residuals: expand 1x1 -> depthwise 3x3 stride 1/2 ->
  project 1x1, ReLU6, residual adds).
* ``mobilenetv3``: MobileNetV3-Large (3x3 and 5x5 depthwise, HardSwish, squeeze-and-excitation with
  HardSigmoid gates).
* ``efficientnet``: EfficientNet-B0 (MBConv with SiLU, squeeze-and-excitation with Sigmoid gates; no
  stochastic depth at inference).

``side`` and the number of stages (blocks) make small versions of the same blocks for the tests
(``tests/models/test_mobile_blocks.py``).
"""

from __future__ import annotations

import numpy as np

from bench_models import ModelBuilder

MODELS = ("mobilenetv2", "mobilenetv3", "efficientnet")


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's ``_make_divisible``: the nearest multiple of d, never 10% below v."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


class _Net:
    def __init__(self, seed: int):
        self.b = ModelBuilder(seed)
        self.zero = self.b.const(0.0, np.float32)
        self.six = self.b.const(6.0, np.float32)

    def conv(self, x, cin, cout, k=1, stride=1, group=1, act=None):
        b = self.b
        y = b.op("Conv", [x, b.weight((cout, cin // group, k, k)), b.weight((cout,), 0.05)],
                 kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        return self.act(y, act)

    def act(self, y, act):
        b = self.b
        if act == "relu6":
            return b.op("Clip", [y, self.zero, self.six])
        if act == "relu":
            return b.op("Relu", [y])
        if act == "hswish":
            return b.op("HardSwish", [y])
        if act == "swish":
            return b.op("Mul", [y, b.op("Sigmoid", [y])])
        return y

    def se(self, x, c, squeeze, inner, gate):
        b = self.b
        s = b.op("GlobalAveragePool", [x])
        s = self.conv(s, c, squeeze, act=inner)
        s = self.conv(s, squeeze, c)
        s = b.op("HardSigmoid", [s], alpha=1.0 / 6, beta=0.5) if gate == "hsigmoid" else b.op("Sigmoid", [s])
        return b.op("Mul", [x, s])

    def head(self, x, c, classes=1000):
        b = self.b
        x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
        return b.op("Gemm", [x, b.weight((classes, c)), b.weight((classes,), 0.01)], transB=1)


def build_mobilenet_v2(side: int = 224, stages: int = 7):
    n = _Net(10)
    x = n.conv("data", 3, 32, 3, 2, act="relu6")
    cin = 32
    for t, c, reps, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                          (6, 160, 3, 2), (6, 320, 1, 1))[:stages]:
        for r in range(reps):
            stride, hidden = s if r == 0 else 1, cin * t
            y = n.conv(x, cin, hidden, act="relu6") if t != 1 else x
            y = n.conv(y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            y = n.conv(y, hidden, c)
            x = n.b.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = n.conv(x, cin, 1280, act="relu6")
    return n.b.model([("data", [1, 3, side, side])], n.head(x, 1280))


#: MobileNetV3-Large: kernel, expanded width, output width, squeeze-and-excitation, activation, stride
V3_LARGE = ((3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
            (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
            (3, 240, 80, False, "hswish", 2), (3, 200, 80, False, "hswish", 1), (3, 184, 80, False, "hswish", 1),
            (3, 184, 80, False, "hswish", 1), (3, 480, 112, True, "hswish", 1), (3, 672, 112, True, "hswish", 1),
            (5, 672, 160, True, "hswish", 2), (5, 960, 160, True, "hswish", 1), (5, 960, 160, True, "hswish", 1))


def build_mobilenet_v3(side: int = 224, blocks: int = len(V3_LARGE)):
    n = _Net(11)
    x = n.conv("data", 3, 16, 3, 2, act="hswish")
    cin = 16
    for k, exp, c, se, act, s in V3_LARGE[:blocks]:
        y = n.conv(x, cin, exp, act=act) if exp != cin else x
        y = n.conv(y, exp, exp, k, s, group=exp, act=act)
        if se:
            y = n.se(y, exp, _divisible(exp // 4), "relu", "hsigmoid")
        y = n.conv(y, exp, c)
        x = n.b.op("Add", [x, y]) if s == 1 and cin == c else y
        cin = c
    x = n.conv(x, cin, 960, act="hswish")
    x = n.b.op("Flatten", [n.b.op("GlobalAveragePool", [x])])  # (torchvision: Linear + HardSwish + Linear)
    x = n.b.op("HardSwish", [n.b.op("Gemm", [x, n.b.weight((1280, 960)), n.b.weight((1280,), 0.01)], transB=1)])
    out = n.b.op("Gemm", [x, n.b.weight((1000, 1280)), n.b.weight((1000,), 0.01)], transB=1)
    return n.b.model([("data", [1, 3, side, side])], out)


#: EfficientNet-B0: expansion, kernel, stride, output width, repeats
B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
      (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))


def build_efficientnet(side: int = 224, stages: int = len(B0)):
    n = _Net(12)
    x = n.conv("data", 3, 32, 3, 2, act="swish")
    cin = 32
    for t, k, s, c, reps in B0[:stages]:
        for r in range(reps):
            stride, hidden = s if r == 0 else 1, cin * t
            y = n.conv(x, cin, hidden, act="swish") if t != 1 else x
            y = n.conv(y, hidden, hidden, k, stride, group=hidden, act="swish")
            y = n.se(y, hidden, max(1, cin // 4), "swish", "sigmoid")
            y = n.conv(y, hidden, c)
            x = n.b.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = n.conv(x, cin, 1280, act="swish")
    return n.b.model([("data", [1, 3, side, side])], n.head(x, 1280))


BUILDERS = {"mobilenetv2": build_mobilenet_v2, "mobilenetv3": build_mobilenet_v3, "efficientnet": build_efficientnet}
