"""ONNX models for the Relax VM tests and bench, compiled with apache-tvm into exported libraries.

``build(name, folder)`` writes ``<name>.onnx`` and ``<name>.so`` (``tvm.relax.frontend.onnx`` ->
``tvm.compile(target="llvm")`` -> ``export_library``) and returns their paths; ``inputs(name)``
gives inputs for a run.  The models cover what issue 12 asks for: an MLP, a CNN (conv2d, batch
norm, pooling), a transformer block (matmul, softmax, layer norm, gelu), a symbolic batch and two
outputs.  ``size="bench"`` makes the CNN and the transformer block big enough that kernels, not
the interpreter, dominate a run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NAMES = ("mlp", "cnn", "transformer", "dynbatch", "two_outputs")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _init(name: str, arr: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def _model(nodes, inputs, outputs, inits, opset: int = 17):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _vi(name: str, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _mlp(size: str):
    from onnx import helper as h

    r = _rng(1)
    inits = [_init("w1", r.standard_normal((64, 128)) * 0.1), _init("b1", r.standard_normal(128)),
             _init("w2", r.standard_normal((128, 10)) * 0.1), _init("b2", r.standard_normal(10))]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("Relu", ["a1"], ["r1"]), h.make_node("MatMul", ["r1", "w2"], ["m2"]),
             h.make_node("Add", ["m2", "b2"], ["y"])]
    return _model(nodes, [_vi("x", [1, 64])], [_vi("y", [1, 10])], inits)


def _cnn(size: str):
    from onnx import helper as h

    r = _rng(2)
    hw, c1, c2 = (112, 32, 64) if size == "bench" else (16, 8, 16)
    inits = [_init("k1", r.standard_normal((c1, 3, 3, 3)) * 0.2), _init("kb1", r.standard_normal(c1) * 0.1),
             _init("s1", 1 + r.random(c1)), _init("o1", r.standard_normal(c1) * 0.1),
             _init("m1", r.standard_normal(c1) * 0.1), _init("v1", 0.5 + r.random(c1)),
             _init("k2", r.standard_normal((c2, c1, 3, 3)) * 0.1),
             _init("s2", 1 + r.random(c2)), _init("o2", r.standard_normal(c2) * 0.1),
             _init("m2", r.standard_normal(c2) * 0.1), _init("v2", 0.5 + r.random(c2)),
             _init("fw", r.standard_normal((c2, 10)) * 0.1), _init("fb", r.standard_normal(10) * 0.1)]
    nodes = [
        h.make_node("Conv", ["x", "k1", "kb1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["n1"]),
        h.make_node("Relu", ["n1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "k2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("BatchNormalization", ["c2", "s2", "o2", "m2", "v2"], ["n2"]),
        h.make_node("Relu", ["n2"], ["r2"]),
        h.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("GlobalAveragePool", ["p2"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("MatMul", ["f", "fw"], ["mm"]),
        h.make_node("Add", ["mm", "fb"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [1, 3, hw, hw])], [_vi("y", [1, 10])], inits)


def _transformer(size: str):
    from onnx import helper as h

    r = _rng(3)
    seq, d, ff = (64, 128, 512) if size == "bench" else (16, 32, 64)
    w = lambda n, *s: _init(n, r.standard_normal(s) / np.sqrt(s[0]))  # noqa: E731
    inits = [w("wq", d, d), w("wk", d, d), w("wv", d, d), w("wo", d, d), w("w1", d, ff), w("w2", ff, d),
             _init("g1", 1 + 0.1 * r.standard_normal(d)), _init("be1", 0.1 * r.standard_normal(d)),
             _init("g2", 1 + 0.1 * r.standard_normal(d)), _init("be2", 0.1 * r.standard_normal(d)),
             _init("scale", np.array(1 / np.sqrt(d))), _init("bf1", 0.1 * r.standard_normal(ff))]
    nodes = [
        h.make_node("LayerNormalization", ["x", "g1", "be1"], ["ln1"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln1", "wq"], ["q"]), h.make_node("MatMul", ["ln1", "wk"], ["k"]),
        h.make_node("MatMul", ["ln1", "wv"], ["v"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s0"]), h.make_node("Mul", ["s0", "scale"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["a"]), h.make_node("MatMul", ["a", "wo"], ["o"]),
        h.make_node("Add", ["x", "o"], ["res1"]),
        h.make_node("LayerNormalization", ["res1", "g2", "be2"], ["ln2"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln2", "w1"], ["f1"]), h.make_node("Add", ["f1", "bf1"], ["f1b"]),
        h.make_node("Gelu", ["f1b"], ["gl"]),
        h.make_node("MatMul", ["gl", "w2"], ["f2"]),
        h.make_node("Add", ["res1", "f2"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [1, seq, d])], [_vi("y", [1, seq, d])], inits, opset=20)


def _dynbatch(size: str):
    from onnx import helper as h

    r = _rng(4)
    inits = [_init("w1", r.standard_normal((16, 32)) * 0.2), _init("b1", r.standard_normal(32)),
             _init("w2", r.standard_normal((32, 8)) * 0.2)]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("Tanh", ["a1"], ["t1"]), h.make_node("MatMul", ["t1", "w2"], ["m2"]),
             h.make_node("Softmax", ["m2"], ["y"], axis=-1)]
    return _model(nodes, [_vi("x", ["N", 16])], [_vi("y", ["N", 8])], inits)


def _two_outputs(size: str):
    from onnx import helper as h

    r = _rng(5)
    inits = [_init("w", r.standard_normal((12, 6)) * 0.3)]
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y1"]),
             h.make_node("Sigmoid", ["m"], ["s"]), h.make_node("ReduceSum", ["s"], ["y2"], keepdims=0)]
    return _model(nodes, [_vi("x", [3, 12])], [_vi("y1", [3, 6]), _vi("y2", [])], inits, opset=11)


_BUILDERS = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer, "dynbatch": _dynbatch,
             "two_outputs": _two_outputs}

INPUT_SHAPES = {"mlp": (1, 64), "dynbatch": (4, 16), "two_outputs": (3, 12)}


def onnx_model(name: str, size: str = "test"):
    return _BUILDERS[name](size)


def inputs(name: str, size: str = "test", batch: int | None = None, seed: int = 7) -> list[np.ndarray]:
    """Inputs for one run of model ``name`` (``batch`` sets the symbolic batch of "dynbatch")."""
    model = onnx_model(name, size)
    dims = [d.dim_value or (batch or 1) for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [_rng(seed).standard_normal(dims).astype(np.float32)]


def build(name: str, folder: Path, size: str = "test") -> Path:
    """Compile model ``name`` with apache-tvm into ``folder/<name>-<size>.so`` (kept if present)."""
    import onnx

    folder = Path(folder)
    lib = folder / f"{name}-{size}.so"
    if lib.exists():
        return lib
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx_model(name, size)
    onnx.save(model, str(folder / f"{name}-{size}.onnx"))
    mod = from_onnx(model, keep_params_in_input=False)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    ex = tvm.compile(mod, target="llvm")
    tmp = folder / f".{name}-{size}.so"
    ex.export_library(str(tmp))
    tmp.rename(lib)
    return lib


def onnx_reference(name: str, args: list[np.ndarray], size: str = "test") -> list[np.ndarray]:
    """The model's outputs from onnxruntime."""
    import onnxruntime as ort

    model = onnx_model(name, size)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(model.graph.input, args)}
    return sess.run(None, feeds)
