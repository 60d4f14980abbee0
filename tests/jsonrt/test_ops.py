"""JSON-runtime graphs built from the format (``GraphBuilder`` -> payload bytes -> loader -> runtime),
for the ops and composites the TVM fixtures do not cover, checked against onnx's reference evaluator
or plain numpy.  Attribute spellings are TVM v0.19.0's (relay attrs through ``OpAttrExtractor``, ACL's,
CLML's and DNNL's serializers)."""

from __future__ import annotations

import numpy as np
import pytest

from jsonrt_helpers import onnx_ref, run_graph
from rpcsrv.loader.jsonrt_graph import GraphBuilder

rng = np.random.default_rng(23)


def rand(*shape):
    return rng.standard_normal(shape).astype("float32")


def close(got, want, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("prefix,key", [("", "json"), ("tensorrt.", "tensorrt")])
def test_dense_bias_softmax(prefix, key):
    x, w, b = rand(2, 6), rand(5, 6), rand(5)
    g = GraphBuilder()
    xi, wi = g.input("x", x.shape), g.const("w", w.shape)
    d = g.kernel(prefix + "nn.dense", [xi, wi], (2, 5), units="", out_dtype="")
    bi = g.const("b", b.shape)
    ba = g.kernel(prefix + "nn.bias_add", [d, bi], (2, 5), axis=1)
    sm = g.kernel(prefix + "nn.softmax", [ba], (2, 5), axis=-1)
    (out,) = run_graph(g, [sm], [x], {"w": w, "b": b}, type_key=key)
    close(out, softmax(x @ w.T + b))


def test_concat_transpose_two_outputs():
    a, b = rand(2, 3, 4), rand(2, 5, 4)
    g = GraphBuilder()
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    cat = g.kernel("concatenate", [ai, bi], (2, 8, 4), axis=1)
    tr = g.kernel("transpose", [cat], (4, 2, 8), axes=[2, 0, 1])
    neg = g.kernel("transpose", [cat], (4, 8, 2), axes="")  # empty axes: reversed
    out, rev = run_graph(g, [tr, neg], [a, b])
    cat_ref = np.concatenate([a, b], axis=1)
    close(out, cat_ref.transpose(2, 0, 1))
    close(rev, cat_ref.transpose())


@pytest.mark.parametrize("op,ta,tb", [("nn.batch_matmul", None, None), ("nn.batch_matmul", 1, 0),
                                      ("nn.matmul", None, None), ("nn.matmul", 0, 1)])
def test_matmul_forms(op, ta, tb):
    a = rand(3, 4, 5)
    tb_eff = tb if tb is not None else (1 if op == "nn.batch_matmul" else 0)
    ta_eff = ta or 0
    if ta_eff:
        a = rand(3, 5, 4)
    b = rand(3, 6, 5) if tb_eff else rand(3, 5, 6)
    g = GraphBuilder()
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    attrs = {} if ta is None else {"transpose_a": ta, "transpose_b": tb}
    y = g.kernel(op, [ai, bi], (3, 4, 6), out_dtype="", **attrs)
    (out,) = run_graph(g, [y], [a, b])
    left = a.transpose(0, 2, 1) if ta_eff else a
    right = b.transpose(0, 2, 1) if tb_eff else b
    close(out, left @ right)


def _conv_attrs(groups=1, padding=(1, 1, 1, 1), data_layout="NCHW", kernel_layout="OIHW", strides=(1, 1)):
    return dict(strides=list(strides), padding=list(padding), dilation=[1, 1], groups=groups, channels="",
                kernel_size="", data_layout=data_layout, kernel_layout=kernel_layout, out_layout="",
                out_dtype="")


@pytest.mark.parametrize("name,post", [("dnnl.conv2d_bias_relu", "relu"), ("dnnl.conv2d_bias_tanh", "tanh"),
                                       ("dnnl.conv2d_bias", None), ("dnnl.conv2d_relu", "relu_nobias"),
                                       ("dnnl.conv2d_bias_clip", "clip")])
def test_dnnl_conv_composites(name, post):
    x, w, b = rand(1, 4, 7, 7), rand(6, 4, 3, 3), rand(6, 1, 1)
    g = GraphBuilder()
    xi, wi = g.input("x", x.shape), g.const("w", w.shape)
    ins = [xi, wi] + ([g.const("b", b.shape)] if post != "relu_nobias" else [])
    extra = {"a_min": "-0.5", "a_max": "0.5"} if post == "clip" else {}
    y = g.kernel(name, ins, (1, 6, 4, 4), **_conv_attrs(strides=(2, 2)), **extra)
    consts = {"w": w, "b": b} if post != "relu_nobias" else {"w": w}
    (out,) = run_graph(g, [y], [x], consts, type_key="dnnl_json")
    ref = onnx_ref("Conv", [x, w] + ([b.reshape(-1)] if post != "relu_nobias" else []), pads=[1, 1, 1, 1],
                   strides=[2, 2])
    ref = {"relu": np.maximum(ref, 0), "relu_nobias": np.maximum(ref, 0), "tanh": np.tanh(ref),
           "clip": np.clip(ref, -0.5, 0.5), None: ref}[post]
    close(out, ref)


def test_dnnl_sum_and_dense_composites():
    x, w, b, res = rand(1, 4, 5, 5), rand(4, 4, 1, 1), rand(4), rand(1, 4, 5, 5)
    d, dw, db, dres = rand(3, 8), rand(2, 8), rand(2), rand(3, 2)
    g = GraphBuilder()
    xi, ri, di, dri = g.input("x", x.shape), g.input("r", res.shape), g.input("d", d.shape), g.input("dr", dres.shape)
    y = g.kernel("dnnl.conv2d_bias_sum_relu", [xi, g.const("w", w.shape), g.const("b", b.shape), ri],
                 (1, 4, 5, 5), **_conv_attrs(padding=(0, 0, 0, 0)))
    z = g.kernel("dnnl.dense_bias_sum", [di, g.const("dw", dw.shape), g.const("db", db.shape), dri], (3, 2))
    # DNNL's gelu pattern: x * (erf(x / c1) + c2) * c3; its wildcard constants are composite arguments
    gelu_consts = [g.const(n, ()) for n in ("c1", "c2", "c3")]
    gl = g.kernel("dnnl.dense_bias_gelu", [di, g.const("dw2", dw.shape), g.const("db2", db.shape), *gelu_consts],
                  (3, 2))
    c = {"c1": np.float32(np.sqrt(2)), "c2": np.float32(1), "c3": np.float32(0.5)}
    out, dense_out, gelu_out = run_graph(g, [y, z, gl], [x, res, d, dres],
                                         {"w": w, "b": b, "dw": dw, "db": db, "dw2": dw, "db2": db,
                                          **{k: np.asarray(v) for k, v in c.items()}},
                                         type_key="dnnl_json")
    close(out, np.maximum(onnx_ref("Conv", [x, w, b]) + res, 0))
    close(dense_out, d @ dw.T + db + dres)
    pre = d @ dw.T + db
    from math import erf

    close(gelu_out, pre * 0.5 * (1 + np.vectorize(erf)(pre / np.sqrt(2))))


@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_and_depthwise_conv_nchw(groups):
    x, w = rand(2, 4, 6, 6), rand(8, 4 // groups, 3, 3)
    g = GraphBuilder()
    y = g.kernel("nn.conv2d", [g.input("x", x.shape), g.const("w", w.shape)], (2, 8, 6, 6),
                 **_conv_attrs(groups=groups))
    (out,) = run_graph(g, [y], [x], {"w": w})
    close(out, onnx_ref("Conv", [x, w], pads=[1, 1, 1, 1], group=groups))


def test_acl_nhwc_conv_bias_relu_and_depthwise():
    """ACL's serializer: NHWC data, OHWI weights, bias as a third input, ``activation_type``; and
    ``nn.depthwise_conv2d`` with IHWO weights."""
    x, w, b = rand(1, 6, 6, 3), rand(8, 3, 3, 3), rand(8)  # w: OHWI
    dw = rand(1, 3, 3, 8)  # IHWO
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    y = g.kernel("nn.conv2d", [xi, g.const("w", w.shape), g.const("b", b.shape)], (1, 6, 6, 8),
                 activation_type="relu", **_conv_attrs(data_layout="NHWC", kernel_layout="OHWI"))
    z = g.kernel("nn.depthwise_conv2d", [y, g.const("dw", dw.shape)], (1, 3, 3, 8),
                 **_conv_attrs(groups=8, padding=(0, 0, 1, 1), data_layout="NHWC", kernel_layout="IHWO",
                               strides=(2, 2)))
    out, dep = run_graph(g, [y, z], [x], {"w": w, "b": b, "dw": dw}, type_key="arm_compute_lib")
    ref = np.maximum(onnx_ref("Conv", [x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), b], pads=[1, 1, 1, 1]), 0)
    close(out, ref.transpose(0, 2, 3, 1))
    ref2 = onnx_ref("Conv", [ref, dw.transpose(3, 0, 1, 2)], pads=[0, 0, 1, 1], strides=[2, 2], group=8)
    close(dep, ref2.transpose(0, 2, 3, 1))


def test_clml_conv_with_fused_batch_norm():
    x, w, b = rand(1, 3, 5, 5), rand(4, 3, 3, 3), rand(4)
    gamma, beta, mean, var = rand(4), rand(4), rand(4), np.abs(rand(4)) + 0.5
    g = GraphBuilder()
    ins = [g.input("x", x.shape)] + [g.const(n, s) for n, s in
                                     [("w", w.shape), ("b", (4,)), ("g", (4,)), ("be", (4,)), ("m", (4,)), ("v", (4,))]]
    y = g.kernel("nn.conv2d", ins, (1, 4, 5, 5), batchnorm=["1", "1e-05", "1", "1"], activation_type="relu6",
                 **_conv_attrs())
    (out,) = run_graph(g, [y], [x], {"w": w, "b": b, "g": gamma, "be": beta, "m": mean, "v": var}, type_key="clml")
    c = onnx_ref("Conv", [x, w, b], pads=[1, 1, 1, 1])
    bn = onnx_ref("BatchNormalization", [c, gamma, beta, mean, var], epsilon=1e-5)
    close(out, np.clip(bn, 0, 6))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pools(layout):
    x = rand(1, 3, 7, 7)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    back = (lambda a: a) if layout == "NCHW" else (lambda a: a.transpose(0, 2, 3, 1))
    shape = (lambda c, h, w: (1, c, h, w)) if layout == "NCHW" else (lambda c, h, w: (1, h, w, c))
    common = dict(strides=[2, 2], dilation=[1, 1], padding=[1, 1, 1, 1], layout=layout, out_layout="", ceil_mode=0)
    g = GraphBuilder()
    xi = g.input("x", xin.shape)
    mx = g.kernel("nn.max_pool2d", [xi], shape(3, 4, 4), pool_size=[3, 3], **common)
    av = g.kernel("nn.avg_pool2d", [xi], shape(3, 4, 4), pool_size=[3, 3], count_include_pad=1, **common)
    l2 = g.kernel("nn.l2_pool2d", [xi], shape(3, 4, 4), pool_size=[3, 3], count_include_pad=0, **common)
    gl = g.kernel("nn.global_max_pool2d", [xi], shape(3, 1, 1), layout=layout, out_layout="")
    outs = run_graph(g, [mx, av, l2, gl], [xin])
    close(outs[0], back(onnx_ref("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])))
    close(outs[1], back(onnx_ref("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                 count_include_pad=1)))
    mean_sq = onnx_ref("AveragePool", [x * x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    close(outs[2], back(np.sqrt(mean_sq)))
    close(outs[3], back(x.max(axis=(2, 3), keepdims=True)))


def test_batch_norm_with_three_outputs_and_shape_ops():
    x = rand(2, 3, 4)
    gamma, beta, mean, var = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    consts = [g.const(n, (3,)) for n in ("g", "b", "m", "v")]
    bn = g.kernel("nn.batch_norm", [xi, *consts], (2, 3, 4), axis=1, epsilon=1e-3, center=1, scale=1)
    node = g.nodes[bn.node]
    node.shapes += [(3,), (3,)]
    node.dtypes += ["float32", "float32"]
    flat = g.kernel("nn.batch_flatten", [bn], (2, 12))
    ex = g.kernel("expand_dims", [flat], (2, 1, 12), axis=1, num_newaxis=1)
    sq = g.kernel("squeeze", [ex], (2, 12), axis=[1])
    sl = g.kernel("strided_slice", [sq], (2, 4), begin=[0, 1], end=[2, 12], strides=[1, 3], axes="",
                  slice_mode="end")
    mean_out = type(bn)(bn.node, 1)
    outs = run_graph(g, [sq, sl, mean_out], [x], {"g": gamma, "b": beta, "m": mean, "v": var})
    ref = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-3) * gamma[:, None] + beta[:, None]
    close(outs[0], ref.reshape(2, 12))
    close(outs[1], ref.reshape(2, 12)[:, 1:12:3])
    close(outs[2], mean)


def test_elementwise_and_reductions():
    a, b = rand(2, 3), rand(3)
    g = GraphBuilder()
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    ops = {"add": a + b, "subtract": a - b, "multiply": a * b, "maximum": np.maximum(a, b),
           "minimum": np.minimum(a, b)}
    heads = [g.kernel(op, [ai, bi], (2, 3)) for op in ops]
    heads.append(g.kernel("sigmoid", [ai], (2, 3)))
    heads.append(g.kernel("clip", [ai], (2, 3), a_min=-0.2, a_max=0.3))
    heads.append(g.kernel("sum", [ai], (2,), axis=[1], keepdims=0, exclude=0))
    heads.append(g.kernel("mean", [ai], (1, 3), axis=[0], keepdims=1, exclude=0))
    heads.append(g.kernel("nn.leaky_relu", [ai], (2, 3), alpha=0.1))
    outs = run_graph(g, heads, [a, b])
    for got, want in zip(outs, ops.values()):
        close(got, want)
    close(outs[5], 1 / (1 + np.exp(-a)))
    close(outs[6], np.clip(a, -0.2, 0.3))
    close(outs[7], a.sum(axis=1))
    close(outs[8], a.mean(axis=0, keepdims=True))
    close(outs[9], np.where(a > 0, a, 0.1 * a))


def test_layer_norm_like_a_transformer_block():
    x, gamma, beta = rand(2, 4, 8), rand(8), rand(8)
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    ln = g.kernel("nn.layer_norm", [xi, g.const("g", (8,)), g.const("b", (8,))], x.shape, axis=-1, epsilon=1e-5,
                  center=1, scale=1)
    (out,) = run_graph(g, [ln], [x], {"g": gamma, "b": beta})
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(out, (x - mu) / np.sqrt(var + 1e-5) * gamma + beta)


def test_deconv_conv1d_and_instance_norm():
    x, w, b = rand(1, 4, 5, 5), rand(4, 3, 3, 3), rand(3)  # conv2d_transpose weights: IOHW
    s, sw = rand(2, 3, 9), rand(5, 3, 3)
    x3, gamma, beta = rand(2, 3, 4, 4), rand(3), rand(3)
    g = GraphBuilder()
    xi, si, x3i = g.input("x", x.shape), g.input("s", s.shape), g.input("x3", x3.shape)
    y = g.kernel("dnnl.deconv2d_bias", [xi, g.const("w", w.shape), g.const("b", b.shape)], (1, 3, 10, 10),
                 strides=[2, 2], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, output_padding=[1, 1],
                 data_layout="NCHW", kernel_layout="IOHW", out_layout="", out_dtype="")
    c1 = g.kernel("nn.conv1d", [si, g.const("sw", sw.shape)], (2, 5, 9), strides=[1], padding=[1, 1], dilation=[1],
                  groups=1, data_layout="NCW", kernel_layout="OIW", out_layout="", out_dtype="")
    inorm = g.kernel("nn.instance_norm", [x3i, g.const("g", (3,)), g.const("be", (3,))], x3.shape, axis=1,
                     epsilon=1e-5, center=1, scale=1)
    outs = run_graph(g, [y, c1, inorm], [x, s, x3], {"w": w, "b": b, "sw": sw, "g": gamma, "be": beta},
                     type_key="dnnl_json")
    close(outs[0], onnx_ref("ConvTranspose", [x, w, b], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]))
    close(outs[1], onnx_ref("Conv", [s, sw], pads=[1, 1]))
    close(outs[2], onnx_ref("InstanceNormalization", [x3, gamma, beta], epsilon=1e-5))


def test_tensorrt_pad_split_layout_transform_adaptive_pool():
    x = rand(1, 4, 6, 6)
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    pad = g.kernel("tensorrt.nn.pad", [xi], (1, 4, 9, 8), padding=[1, 2, 2, 0], pad_mode="constant")
    sp = g.kernel("tensorrt.split", [xi], (1, 1, 6, 6), indices_or_sections=[1, 3], mode="indices", axis=1)
    node = g.nodes[sp.node]
    node.shapes += [(1, 2, 6, 6), (1, 1, 6, 6)]
    node.dtypes += ["float32", "float32"]
    lt = g.kernel("layout_transform", [xi], (1, 6, 6, 4), src_layout="NCHW", dst_layout="NHWC")
    ap = g.kernel("tensorrt.nn.adaptive_avg_pool2d", [xi], (1, 4, 2, 3), output_size=[2, 3], layout="NCHW",
                  out_layout="")
    third = type(sp)(sp.node, 2)
    outs = run_graph(g, [pad, type(sp)(sp.node, 1), third, lt, ap], [x], type_key="tensorrt")
    close(outs[0], np.pad(x, [(0, 0), (0, 0), (1, 2), (2, 0)]))
    close(outs[1], x[:, 1:3])
    close(outs[2], x[:, 3:])
    close(outs[3], x.transpose(0, 2, 3, 1))
    close(outs[4], x.reshape(1, 4, 2, 3, 3, 2).mean(axis=(3, 5)))


def test_strided_slice_forms():
    x = rand(4, 6)
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    rev = g.kernel("strided_slice", [xi], (4, 3), begin=[0, -1], end=[4, -7], strides=[1, -2], axes="",
                   slice_mode="end")
    size = g.kernel("strided_slice", [xi], (2, 5), begin=[1, 1], end=[2, -1], strides=[1], axes="",
                    slice_mode="size")
    trt = g.kernel("tensorrt.strided_slice", [xi], (2, 2), start=[1, 0], size=[2, 2], strides=[2, 3])
    outs = run_graph(g, [rev, size, trt], [x], type_key="tensorrt")
    close(outs[0], x[:, ::-2])
    close(outs[1], x[1:3, 1:])
    close(outs[2], x[1::2, ::3][:2, :2])


def test_bnns_composites():
    x, w, b = rand(1, 3, 5, 5), rand(4, 3, 3, 3), rand(4)
    d, dw, db = rand(2, 6), rand(3, 6), rand(3)
    g = GraphBuilder()
    xi, di = g.input("x", x.shape), g.input("d", d.shape)
    y = g.kernel("bnns.conv2d_bias_sigmoid", [xi, g.const("w", w.shape), g.const("b", (4,))], (1, 4, 5, 5),
                 **_conv_attrs())
    z = g.kernel("bnns.dense_bias_gelu", [di, g.const("dw", dw.shape), g.const("db", (3,))], (2, 3), units=3)
    conv_out, gelu_out = run_graph(g, [y, z], [x, d], {"w": w, "b": b, "dw": dw, "db": db}, type_key="bnns_json")
    close(conv_out, 1 / (1 + np.exp(-onnx_ref("Conv", [x, w, b], pads=[1, 1, 1, 1]))))
    pre = d @ dw.T + db  # BNNS's pattern: the tanh approximation of gelu
    close(gelu_out, 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3))))


def test_clml_depth_to_space_and_upsampling():
    x = rand(1, 8, 3, 4)
    g = GraphBuilder()
    xi = g.input("x", x.shape)
    d2s = g.kernel("nn.depth_to_space", [xi], (1, 2, 6, 8), block_size=2, layout="NCHW", mode="CRD")
    near = g.kernel("nn.upsampling", [xi], (1, 8, 6, 12), scale_h=2, scale_w=3, layout="NCHW",
                    method="nearest_neighbor", align_corners=0)
    lin = g.kernel("nn.upsampling", [xi], (1, 8, 6, 8), scale_h=2, scale_w=2, layout="NCHW", method="bilinear",
                   align_corners=1)
    outs = run_graph(g, [d2s, near, lin], [x], type_key="clml")
    close(outs[0], onnx_ref("DepthToSpace", [x], blocksize=2, mode="CRD"))
    close(outs[1], x.repeat(2, axis=2).repeat(3, axis=3))
    h = np.linspace(0, 2, 6)  # align_corners: the corners map onto each other
    w = np.linspace(0, 3, 8)
    h0, w0 = np.minimum(h.astype(int), 1), np.minimum(w.astype(int), 2)
    fh, fw = (h - h0)[:, None], (w - w0)[None, :]
    ref = (x[..., h0, :][..., w0] * (1 - fh) * (1 - fw) + x[..., h0 + 1, :][..., w0] * fh * (1 - fw)
           + x[..., h0, :][..., w0 + 1] * (1 - fh) * fw + x[..., h0 + 1, :][..., w0 + 1] * fh * fw)
    close(outs[2], ref)
