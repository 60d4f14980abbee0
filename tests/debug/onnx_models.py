"""A small CNN as ONNX (built with onnx.helper) for ``byoc profile`` / ``byoc compare`` tests, and
the same model with one constant perturbed."""

from __future__ import annotations

import numpy as np


def small_cnn(perturb: str = "", scale: float = 1.05):
    """x[1,3,12,12] → conv1(+b1) → relu1 → conv2 → mul (by ``c``) → add (``d``) → pool → flatten → gemm.

    ``perturb``: the name of one initializer to scale by ``scale`` (the injected error)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    consts = {
        "w1": rng.standard_normal((6, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(6) * 0.1,
        # c scales each pixel (not per channel, so the compiler keeps Mul and Add as nodes of their own)
        "w2": rng.standard_normal((8, 6, 3, 3)) * 0.2, "c": rng.standard_normal((1, 8, 12, 12)),
        "d": rng.standard_normal((1, 8, 1, 1)) * 0.1, "wf": rng.standard_normal((10, 8)) * 0.3,
        "bf": rng.standard_normal(10) * 0.1,
    }
    if perturb:
        consts[perturb] = consts[perturb] * scale
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["t1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t1"], ["t2"], name="relu1"),
        helper.make_node("Conv", ["t2", "w2"], ["t3"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["t3", "c"], ["t4"], name="scale"),
        helper.make_node("Add", ["t4", "d"], ["t5"], name="shift"),
        helper.make_node("GlobalAveragePool", ["t5"], ["t6"], name="pool"),
        helper.make_node("Flatten", ["t6"], ["t7"], name="flatten"),
        helper.make_node("Gemm", ["t7", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def cnn_input(seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 12, 12)).astype(np.float32)
