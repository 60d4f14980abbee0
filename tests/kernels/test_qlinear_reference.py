"""The int8 ops' numpy kernels against onnxruntime's own contrib kernels, one op at a time: every output
within one quantization step of onnxruntime's, and almost all equal (onnxruntime computes its products in
float32 and some ops through tables; the kernels here follow ``rpcsrv.loader.opset.quant``)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

onnx = need_module("onnx", "builds the single-op models")
ort = need_module("onnxruntime", "the reference")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rpcsrv.executor.kernels import KERNELS  # noqa: E402

MS = "com.microsoft"
RNG = np.random.default_rng(7)


def _run_ort(op: str, inputs: dict, consts: dict, out_type: int, attrs: dict, domain: str = MS,
             order: list | None = None, outputs: int = 1):
    names = order or list(inputs) + list(consts)
    node = helper.make_node(op, names, [f"y{k}" for k in range(outputs)], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{k}", t, None)
         for k, t in enumerate(out_type if isinstance(out_type, list) else [out_type] * outputs)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def _q(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _close(ours, theirs, steps: int = 1, equal: float = 0.97):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), (ours.dtype, ours.shape, theirs.dtype)
    diff = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    assert diff.max() <= steps, diff.max()
    assert (diff == 0).mean() >= equal, (diff == 0).mean()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_ops(op, dtype):
    a, b = _q((2, 8, 5, 5), dtype), _q((1, 8, 1, 5), dtype)
    consts = {"as": np.float32(0.05), "az": dtype(3), "bs": np.float32(0.02),
              "bz": dtype(-2 if dtype == np.int8 else 9), "cs": np.float32(0.07), "cz": dtype(1)}
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    (theirs,) = _run_ort(op, {"a": a, "b": b}, consts, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), {},
                         order=order)
    kernel = KERNELS["q_linear_add" if op == "QLinearAdd" else "q_linear_mul"]
    _close(kernel(a, consts["as"], consts["az"], b, consts["bs"], consts["bz"], consts["cs"], consts["cz"]), theirs)


def test_concat_requantizes_each_input():
    a, b = _q((1, 3, 4), np.uint8), _q((1, 5, 4), np.uint8)
    consts = {"ys": np.float32(0.1), "yz": np.uint8(128), "as": np.float32(0.1), "az": np.uint8(128),
              "bs": np.float32(0.03), "bz": np.uint8(7)}
    order = ["ys", "yz", "a", "as", "az", "b", "bs", "bz"]
    (theirs,) = _run_ort("QLinearConcat", {"a": a, "b": b}, consts, TensorProto.UINT8, {"axis": 1}, order=order)
    ours = KERNELS["q_linear_concat"](consts["ys"], consts["yz"], a, consts["as"], consts["az"], b, consts["bs"],
                                      consts["bz"], axis=1)
    _close(ours, theirs)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_global_average_pool(dtype):
    x = _q((2, 16, 7, 7), dtype)
    consts = {"xs": np.float32(0.04), "xz": dtype(5), "ys": np.float32(0.01),
              "yz": dtype(-3 if dtype == np.int8 else 3)}
    (theirs,) = _run_ort("QLinearGlobalAveragePool", {"x": x}, consts, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                         {"channels_last": 0}, order=["x", "xs", "xz", "ys", "yz"])
    _close(KERNELS["q_linear_global_average_pool"](x, *consts.values()), theirs)


@pytest.mark.parametrize("include", [0, 1])
def test_average_pool(include):
    x = _q((1, 4, 9, 9), np.uint8)
    consts = {"xs": np.float32(0.04), "xz": np.uint8(100), "ys": np.float32(0.03), "yz": np.uint8(90)}
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=include)
    (theirs,) = _run_ort("QLinearAveragePool", {"x": x}, consts, TensorProto.UINT8, attrs,
                         order=["x", "xs", "xz", "ys", "yz"])
    _close(KERNELS["q_linear_average_pool"](x, *consts.values(), **attrs), theirs)


@pytest.mark.parametrize("op,kernel,attrs", [("QLinearSigmoid", "q_linear_sigmoid", {}),
                                             ("QLinearLeakyRelu", "q_linear_leaky_relu", {"alpha": 0.1})])
def test_tables(op, kernel, attrs):
    x = _q((3, 100), np.int8)
    consts = {"xs": np.float32(0.05), "xz": np.int8(-4), "ys": np.float32(1 / 256), "yz": np.int8(-128)}
    (theirs,) = _run_ort(op, {"x": x}, consts, TensorProto.INT8, attrs, order=["x", "xs", "xz", "ys", "yz"])
    _close(KERNELS[kernel](x, *consts.values(), **attrs), theirs, equal=0.99)


def test_softmax():
    x = _q((2, 4, 30), np.uint8)
    consts = {"xs": np.float32(0.08), "xz": np.uint8(128), "ys": np.float32(1 / 256), "yz": np.uint8(0)}
    (theirs,) = _run_ort("QLinearSoftmax", {"x": x}, consts, TensorProto.UINT8, {"axis": -1, "opset": 13},
                         order=["x", "xs", "xz", "ys", "yz"])
    _close(KERNELS["q_linear_softmax"](x, *consts.values(), axis=-1, opset=13), theirs, equal=0.9)


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("with_y", [False, True])
def test_qgemm(per_column, with_y):
    a, b = _q((5, 12), np.uint8), _q((7, 12), np.int8)
    bs = (RNG.random(7) * 0.02 + 0.01).astype(np.float32) if per_column else np.float32(0.02)
    bz = np.zeros(7, np.int8) if per_column else np.int8(0)
    consts = {"as": np.float32(0.03), "az": np.uint8(120), "b": b, "bs": bs, "bz": bz,
              "c": RNG.integers(-500, 500, 7).astype(np.int32)}
    order = ["a", "as", "az", "b", "bs", "bz", "c"]
    if with_y:
        consts.update(ys=np.float32(0.5), yz=np.uint8(60))
        order += ["ys", "yz"]
    out_type = TensorProto.UINT8 if with_y else TensorProto.FLOAT
    attrs = {"transB": 1, "alpha": 0.5}
    (theirs,) = _run_ort("QGemm", {"a": a}, consts, out_type, attrs, order=order)
    ours = KERNELS["q_gemm"](a, *[consts[k] for k in order[1:]], **attrs)
    if with_y:
        _close(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)


def test_dynamic_quantize_linear_is_onnxs():
    x = (RNG.standard_normal((4, 33)) * 3).astype(np.float32)
    theirs = _run_ort("DynamicQuantizeLinear", {"x": x}, {}, [TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8],
                      {}, domain="", outputs=3)
    ours = KERNELS["dynamic_quantize_linear"](x)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1] == theirs[1] and ours[2] == theirs[2]


def test_dynamic_matmuls():
    a = RNG.standard_normal((3, 6, 16)).astype(np.float32)
    b = _q((16, 10), np.int8)
    consts = {"b": b, "bs": (RNG.random(10) * 0.05 + 0.01).astype(np.float32), "bz": np.zeros(10, np.int8),
              "bias": RNG.standard_normal(10).astype(np.float32)}
    (theirs,) = _run_ort("DynamicQuantizeMatMul", {"a": a}, consts, TensorProto.FLOAT, {},
                         order=["a", "b", "bs", "bz", "bias"])
    ours = KERNELS["dynamic_quantize_matmul"](a, *consts.values())
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)
