"""Libraries built from the format run on a board (``rpcsrv serve``) through the real apache-tvm client
and our classic-dialect client; what the board lacks is an RPC error at ``load_module`` naming the node
and op, and the board goes on serving."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.client.graph_executor import GraphModule
from rpcsrv.client.rpc import RPCError, connect
from conftest import need_module
from jsonrt_helpers import json_module, library
from rpcsrv.loader.jsonrt_graph import GraphBuilder
from rpcsrv.protocol import Dialect

rng = np.random.default_rng(5)
W, B = rng.standard_normal((4, 3, 3, 3)).astype("float32"), rng.standard_normal(4).astype("float32")
FC = rng.standard_normal((2, 64)).astype("float32")


def dnnl_lib(last_op: str = "nn.softmax") -> bytes:
    """x (1, 3, 8, 8) -> dnnl.conv2d_bias_relu -> max pool 2x2 -> batch_flatten -> dense -> ``last_op``."""
    g = GraphBuilder("dnnl_0")
    x = g.input("dnnl_0_i0", (1, 3, 8, 8))
    c = g.kernel("dnnl.conv2d_bias_relu", [x, g.const("dnnl_0_const_0", W.shape), g.const("dnnl_0_const_1", (4,))],
                 (1, 4, 8, 8), strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1,
                 data_layout="NCHW", kernel_layout="OIHW", out_layout="", out_dtype="")
    p = g.kernel("nn.max_pool2d", [c], (1, 4, 4, 4), pool_size=[2, 2], strides=[2, 2], padding=[0, 0, 0, 0],
                 dilation=[1, 1], layout="NCHW", ceil_mode=0)
    f = g.kernel("nn.batch_flatten", [p], (1, 64))
    d = g.kernel("nn.dense", [f, g.const("dnnl_0_const_2", FC.shape)], (1, 2), units="", out_dtype="")
    y = g.kernel(last_op, [d], (1, 2), axis=-1)
    mod = json_module(g, [y], symbol="dnnl_0", type_key="dnnl_json")
    consts = dict(zip(mod.const_names, [W, B, FC]))
    return library(mod, consts, [("x", (1, 3, 8, 8), "float32")], [((1, 2), "float32")])


def expected(x: np.ndarray) -> np.ndarray:
    from jsonrt_helpers import onnx_ref

    c = np.maximum(onnx_ref("Conv", [x, W, B], pads=[1, 1, 1, 1]), 0)
    p = c.reshape(1, 4, 4, 2, 4, 2).max(axis=(3, 5))
    d = p.reshape(1, 64) @ FC.T
    e = np.exp(d - d.max())
    return e / e.sum()


X = rng.standard_normal((1, 3, 8, 8)).astype("float32")


def test_own_library_through_the_real_tvm_client(server, tmp_path):
    tvm = need_module("tvm", "the real TVM client")
    path = tmp_path / "dnnl.blob"
    path.write_bytes(dnnl_lib())
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    lib = sess.load_module("dnnl.blob")
    dev = sess.cpu(0)
    m = lib["default"](dev)
    m["set_input"]("x", tvm.runtime.tensor(X, dev))
    m["run"]()
    np.testing.assert_allclose(m["get_output"](0).numpy(), expected(X), rtol=1e-4, atol=1e-6)
    # the module's function itself, called directly: inputs then outputs
    out = tvm.runtime.tensor(np.zeros((1, 2), "float32"), dev)
    lib["dnnl_0"](tvm.runtime.tensor(X, dev), out)
    np.testing.assert_allclose(out.numpy(), expected(X), rtol=1e-4, atol=1e-6)
    with pytest.raises(Exception, match=r"dnnl_0 takes 1 input\(s\) and 1 output\(s\) \(2 arguments\), got 1"):
        lib["dnnl_0"](out)


def test_unknown_op_refused_at_load_module_through_the_real_tvm_client(server, tmp_path):
    tvm = need_module("tvm", "the real TVM client")
    path = tmp_path / "bad.blob"
    path.write_bytes(dnnl_lib("nn.fancy_softmax"))
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    with pytest.raises(Exception, match=r"dnnl_json module 'dnnl_0' node 8: op 'nn.fancy_softmax' has no kernel "
                                        "on this board"):
        sess.load_module("bad.blob")
    good = tmp_path / "good.blob"
    good.write_bytes(dnnl_lib())
    sess.upload(str(good))
    assert sess.load_module("good.blob") is not None  # the same session goes on
    assert server.alive()


def test_own_library_through_the_classic_dialect(server, tmp_path):
    sess = connect(server.host, server.port, dialect=Dialect.CLASSIC)
    path = tmp_path / "dnnl.blob"
    path.write_bytes(dnnl_lib())
    sess.upload(str(path), "dnnl.blob")
    gmod = GraphModule(sess.load_module("dnnl.blob")["default"](sess.cpu(0)))
    gmod.set_input("x", X)
    gmod.run()
    np.testing.assert_allclose(gmod.get_output(0).numpy(), expected(X), rtol=1e-4, atol=1e-6)
    bad = tmp_path / "bad.blob"
    bad.write_bytes(dnnl_lib("nn.fancy_softmax")[:-200])  # also truncated
    sess.upload(str(bad), "bad.blob")
    with pytest.raises(RPCError, match=r"bad.blob: raw blob file: blob size header .* but only"):
        sess.load_module("bad.blob")
