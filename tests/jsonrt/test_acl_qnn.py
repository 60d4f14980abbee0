"""Arm Compute Library's QNN composites in JSON-runtime libraries run on the board: a MobileNet-like model that
onnxruntime quantized (QOperator, per tensor) written as TVM partitions it for ACL (qnn.conv2d, a depthwise
qnn.conv2d, max pool, reshape, qnn.dense; NHWC, OHWI/IHWO kernels; one module per kernel), run through the real
apache-tvm client on ``rpcsrv serve``, gives TVM's own output (its QNN lowering, computed here from TVM's source)
and is within one step of onnxruntime on the model; quantized pools, qnn.add, concatenate and reshape too; what
ACL's runtime would refuse (per-channel parameters, other activations, wrong input counts) is refused at
``load_module``."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from acl_qnn import AclLibrary, conv_attrs, qparams, tvm_qnn_add, tvm_qnn_conv, tvm_qnn_dense, tvm_requantize
from conftest import REPO, need_module, run_with_tvm

onnx = need_module("onnx", "builds the model")
need_module("onnxruntime", "quantizes the model and is the reference")
from onnx import numpy_helper  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "compiler"))
from int8_models import quantized, sample_input  # noqa: E402

from rpcsrv.executor.jsonrt.qnn import fixed_point, requantize  # noqa: E402


def _run(server, tmp_path, blob: bytes, inputs: dict) -> list[np.ndarray]:
    path = tmp_path / "acl_qnn.blob"
    path.write_bytes(blob)
    return run_with_tvm(server, path, inputs)


def _acl_mobilenet(path):
    """The QOperator model as ACL functions, and TVM's arithmetic beside it: (library with every function's result
    as an output, TVM's results for an NHWC uint8 input, the model's quantized input, the ONNX tensors that those
    results stand for: NHWC, NCHW, or None for the reshape)."""
    model = onnx.load(str(path))
    c = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    lib = AclLibrary()
    nodes = list(model.graph.node)
    first = nodes[0]
    assert first.op_type == "QuantizeLinear"
    x = lib.input("x", (1, 16, 16, 3), "uint8")
    steps, flat_perm, heads, names = [], None, [], []
    cur, shape = x, (1, 16, 16, 3)
    for n in nodes[1:-1]:
        a = {at.name: onnx.helper.get_attribute_value(at) for at in n.attribute}
        if n.op_type == "QLinearConv":
            _, xs, xz, w, ws, wz, ys, yz, b = n.input
            w = c[w]
            groups = int(a.get("group", 1))
            depthwise = groups > 1
            kernel = w.transpose(1, 2, 3, 0) if depthwise else w.transpose(0, 2, 3, 1)  # IHWO / OHWI
            bias = c[b].astype(np.int32).reshape(1, 1, 1, -1)
            pads, strides = list(a.get("pads", [0] * 4)), list(a.get("strides", [1, 1]))
            args = [cur, kernel, *qparams(c[xz], c[wz], c[xs], c[ws]), bias, np.float32(c[ys]), np.int32(c[yz])]
            oh = (shape[1] + pads[0] + pads[2] - w.shape[2]) // strides[0] + 1
            ow = (shape[2] + pads[1] + pads[3] - w.shape[3]) // strides[1] + 1
            shape = (1, oh, ow, w.shape[0])
            cur = lib.kernel("qnn.depthwise_conv2d" if depthwise else "qnn.conv2d", args, shape, "uint8",
                             **conv_attrs(w.shape[2:], strides, pads, groups, w.shape[0], depthwise))
            steps.append(("conv", kernel, c[xz], c[wz], c[xs] * c[ws], c[ys], c[yz], strides, pads, groups, bias))
        elif n.op_type == "MaxPool":
            k, s = a["kernel_shape"], a["strides"]
            shape = (1, shape[1] // s[0], shape[2] // s[1], shape[3])
            cur = lib.kernel("nn.max_pool2d", [cur], shape, "uint8", pool_size=k, strides=s, padding=[0, 0, 0, 0],
                             dilation=[1, 1], layout="NHWC", ceil_mode=0)
            steps.append(("pool", k, s))
        elif n.op_type == "Flatten":
            h, w_, ch = shape[1:]
            flat_perm = np.arange(ch * h * w_).reshape(ch, h, w_).transpose(1, 2, 0).reshape(-1)  # NHWC -> NCHW
            shape = (1, h * w_ * ch)
            cur = lib.kernel("reshape", [cur], shape, "uint8", newshape=list(shape))
            steps.append(("flat",))
        elif n.op_type == "QLinearMatMul":
            _, as_, az, b, bs, bz, ys, yz = n.input
            weight = np.ascontiguousarray(c[b][flat_perm].T)  # (units, in), in the NHWC flatten's order
            args = [cur, weight, *qparams(c[az], c[bz], c[as_], c[bs]), np.float32(c[ys]), np.int32(c[yz])]
            shape = (1, weight.shape[0])
            cur = lib.kernel("qnn.dense", args, shape, "uint8", units=weight.shape[0], out_dtype="int32")
            steps.append(("dense", weight, c[az], c[bz], c[as_] * c[bs], c[ys], c[yz]))
        else:
            raise AssertionError(n.op_type)
        heads.append(cur)
        names.append(None if n.op_type == "Flatten" else n.output[0])

    def tvm(xq: np.ndarray) -> list[np.ndarray]:
        v, out = xq, []
        for s in steps:
            if s[0] == "conv":
                _, kernel, xz, wz, in_scale, ys, yz, strides, pads, groups, bias = s
                acc = tvm_qnn_conv(v, kernel, int(xz), int(wz), strides, pads, groups, bias)
                v = tvm_requantize(acc, in_scale, 0, ys, yz, np.uint8)
            elif s[0] == "pool":
                k, st = s[1], s[2]
                v = v.reshape(1, v.shape[1] // st[0], k[0], v.shape[2] // st[1], k[1], -1).max(axis=(2, 4))
            elif s[0] == "flat":
                v = v.reshape(1, -1)
            else:
                _, weight, az, bz, in_scale, ys, yz = s
                v = tvm_requantize(tvm_qnn_dense(v, weight, int(az), int(bz)), in_scale, 0, ys, yz, np.uint8)
            out.append(v)
        return out

    return lib.blob(heads), tvm, first.output[0], names


def test_acl_qnn_mobilenet_matches_tvm_and_onnxruntime(server, tmp_path):
    """Every function's result: TVM's to the integer; onnxruntime's within one step on >= 99% of the elements."""
    import onnxruntime as ort

    path = quantized(tmp_path, "mobilenet", "QOperator", False, "QUInt8")
    blob, tvm_results, q_in, names = _acl_mobilenet(path)
    model = onnx.load(str(path))
    asked = [q_in] + [n for n in names if n]
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in asked])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    total = within = 0
    for seed in (41, 42):
        xq, *theirs = sess.run(asked, {"x": sample_input(seed)})
        xq = np.ascontiguousarray(xq.transpose(0, 2, 3, 1))  # the board's ACL functions take NHWC
        ours = _run(server, tmp_path, blob, {"x": xq})
        assert [o.dtype for o in ours] == [np.uint8] * len(names)
        for got, want in zip(ours, tvm_results(xq)):
            np.testing.assert_array_equal(got, want)  # TVM's own arithmetic, to the integer
        for got, want in zip([o for o, n in zip(ours, names) if n], theirs):
            want = want.transpose(0, 2, 3, 1) if want.ndim == 4 else want
            steps = np.abs(got.astype(np.int64) - want.astype(np.int64))
            total, within = total + steps.size, within + int((steps <= 1).sum())
        assert ours[-1].argmax() == theirs[-1].argmax()
    assert within / total >= 0.99, (within, total)
    print(f"ACL QNN vs onnxruntime: {within}/{total} within one step")


def test_quantized_pools_add_concat_and_reshape(server, tmp_path):
    rng = np.random.default_rng(8)
    a = rng.integers(0, 256, (1, 8, 8, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (1, 8, 8, 4)).astype(np.uint8)
    lib = AclLibrary()
    x, y = lib.input("a", a.shape, "uint8"), lib.input("b", b.shape, "uint8")
    params = [np.float32(0.05), np.int32(120), np.float32(0.03), np.int32(10), np.float32(0.06), np.int32(100)]
    s = lib.kernel("qnn.add", [x, y, *params], a.shape, "uint8")
    same = lib.kernel("qnn.add", [x, x, np.float32(0.05), np.int32(120), np.float32(0.05), np.int32(120),
                                  np.float32(0.05), np.int32(120)], a.shape, "uint8")
    avg = lib.kernel("nn.avg_pool2d", [s], (1, 4, 4, 4), "uint8", pool_size=[3, 3], strides=[2, 2],
                     padding=[1, 1, 1, 1], dilation=[1, 1], layout="NHWC", ceil_mode=0, count_include_pad=0)
    gap = lib.kernel("nn.global_avg_pool2d", [s], (1, 1, 1, 4), "uint8", layout="NHWC")
    mx = lib.kernel("nn.max_pool2d", [same], (1, 4, 4, 4), "uint8", pool_size=[2, 2], strides=[2, 2],
                    padding=[0, 0, 0, 0], dilation=[1, 1], layout="NHWC", ceil_mode=0)
    cat = lib.kernel("concatenate", [avg, mx], (1, 4, 4, 8), "uint8", axis=3)
    flat = lib.kernel("reshape", [cat], (1, 128), "uint8", newshape=[1, 128])
    outs = _run(server, tmp_path, lib.blob([flat, gap]), {"a": a, "b": b})
    want_s = tvm_qnn_add(a, b, *[v.item() for v in params], np.uint8)
    want_same = tvm_qnn_add(a, a, 0.05, 120, 0.05, 120, 0.05, 120, np.uint8)
    padded = np.pad(want_s.astype(np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ones = np.pad(np.ones(a.shape, np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    sums = np.array([[padded[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3].sum(axis=(0, 1)) for j in range(4)]
                     for i in range(4)])
    counts = np.array([[ones[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3].sum(axis=(0, 1)) for j in range(4)]
                       for i in range(4)])
    want_avg = (sums // counts).astype(np.uint8)[None]  # non-negative: truncation is the floor
    want_mx = want_same.reshape(1, 4, 2, 4, 2, 4).max(axis=(2, 4))
    np.testing.assert_array_equal(outs[0], np.concatenate([want_avg, want_mx], axis=3).reshape(1, 128))
    np.testing.assert_array_equal(outs[1], (want_s.astype(np.int64).sum(axis=(1, 2), keepdims=True) // 64)
                                  .astype(np.uint8))
    np.testing.assert_array_equal(want_same, np.clip(2 * a.astype(np.int64) - 120, 0, 255))  # a + a, as integers


@pytest.mark.parametrize("change,message", [
    ("per_channel", "per-channel quantization parameters"),
    ("sigmoid", "fused activation 'sigmoid' on a qnn conv is not supported"),
    ("inputs", "takes 8 inputs, or 9 with a bias, got 7"),
])
def test_what_acl_refuses_is_refused_at_load(server, tmp_path, change, message):
    tvm = need_module("tvm", "the real TVM client")
    lib = AclLibrary()
    x = lib.input("x", (1, 4, 4, 2), "uint8")
    scales = np.float32([0.1, 0.2]) if change == "per_channel" else np.float32(0.1)
    args = [x, np.ones((2, 1, 1, 2), np.int8), np.int32(0), np.int32(0), np.float32(0.1), scales, np.float32(0.2),
            np.int32(3)]
    attrs = conv_attrs((1, 1), (1, 1), (0, 0, 0, 0), 1, 2)
    if change == "sigmoid":
        attrs["activation_type"] = "sigmoid"
    out = lib.kernel("qnn.conv2d", args[:-1] if change == "inputs" else args, (1, 4, 4, 2), "uint8", **attrs)
    path = tmp_path / "bad.blob"
    path.write_bytes(lib.blob([out]))
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    with pytest.raises(Exception, match=r"arm_compute_lib module 'tvmgen_default_arm_compute_lib_main_0'") as info:
        sess.load_module(path.name)
    assert message in str(info.value)
    assert server.alive()


def test_the_requantize_of_tvm_rounds_half_up_in_fixed_point():
    assert fixed_point(0.5) == (1 << 30, 0) and fixed_point(1.0) == (1 << 30, 1) and fixed_point(0.0) == (0, 0)
    rng = np.random.default_rng(3)
    acc = rng.integers(-50000, 50000, 4000)
    acc[:8] = [-3, -2, -1, 0, 1, 2, 3, 5]  # ties under a multiplier of 0.5
    for in_scale, out_scale in [(0.5, 1.0), (0.00123, 0.0371), (0.25, 0.0009765625), (0.7, 0.7), (3.1e-5, 0.9)]:
        ours = requantize(acc, in_scale, 7, out_scale, 13, np.int8)
        np.testing.assert_array_equal(ours, tvm_requantize(acc, in_scale, 7, out_scale, 13, np.int8))
    assert list(requantize(np.array([-3, -1, 1, 3]), 0.5, 0, 1.0, 0, np.int8)) == [-1, 0, 1, 2]  # half up
