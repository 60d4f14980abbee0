"""Run one ONNX node in onnxruntime, to serve as the reference for the kernel tests."""

from __future__ import annotations

import numpy as np


def ort_run(op_type: str, inputs: list, attrs: dict, n_outputs: int = 1, opset: int = 20):
    """Outputs of a one-node ONNX graph in onnxruntime; ``None`` inputs are absent optionals."""
    import onnxruntime as ort
    from onnx import helper, shape_inference

    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                    for n, x in zip(names, inputs) if x is not None]
    graph = helper.make_graph([node], "one", graph_inputs, [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    # output types from ONNX's shape inference (ORT needs typed graph outputs)
    inferred = {vi.name: vi for vi in shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    model.graph.output.extend(inferred[o] for o in outs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {n: x for n, x in zip(names, inputs) if x is not None})


def assert_close(got, want, rtol=1e-4, atol=1e-5):
    """Same dtype and shape, values within tolerance."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
