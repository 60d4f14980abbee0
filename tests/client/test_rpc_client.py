"""Our pure-Python client through the same flows as the real TVM client, in both dialects."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from rpcsrv.client import rpc
from rpcsrv.protocol import Dialect

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"]


@pytest.fixture(params=[Dialect.FFI, Dialect.CLASSIC], ids=["ffi", "classic"])
def sess(request, server):
    s = rpc.connect(server.host, server.port, dialect=request.param)
    yield s
    s.close()


def test_global_call(sess):
    assert sess.get_function("tvm.rpc.server.workpath")("abc").endswith("/abc")
    with pytest.raises(AttributeError, match="no.such"):
        sess.get_function("no.such")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_round_trip(sess, dtype):
    dev = sess.cpu(0)
    for shape in [(3, 4), (5,), (), (0, 3)]:
        x = (np.arange(int(np.prod(shape))).reshape(shape) * 3 + 1).astype(dtype)
        y = sess.array(x, dev).numpy()
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, x)


def test_large_tensor_streams_both_ways(sess):
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype("float32")  # 4 MB
    a = sess.array(x, sess.ext_dev(0))
    np.testing.assert_array_equal(a.numpy(), x)
    b = sess.empty(x.shape, "float32")
    b.copyfrom(a)
    np.testing.assert_array_equal(b.numpy(), x)


def test_files(sess):
    blob = bytes(range(256)) * 4
    sess.upload(blob, "blob.bin")
    assert "blob.bin" in sess.listdir(".").split(",")
    assert sess.download("blob.bin") == blob
    sess.remove("blob.bin")
    assert "blob.bin" not in sess.listdir(".").split(",")
    with pytest.raises(rpc.RPCError, match="leaves the session workspace"):
        sess.upload(b"x", "../../escape")


def test_handles_are_freed(sess):
    stats = sess.get_function("rpcsrv.session_stats")
    before = stats()
    arrays = [sess.array(np.ones(10, "int32")) for _ in range(3)]
    assert stats() != before
    del arrays
    gc.collect()
    assert stats() == before


def test_wrong_key_is_refused(keyed_server):
    with pytest.raises(rpc.RPCError, match="refused"):
        rpc.connect(keyed_server.host, keyed_server.port, key="nope")
    with rpc.connect(keyed_server.host, keyed_server.port, key="board-a") as s:
        assert s.get_function("tvm.rpc.server.workpath")("x").endswith("/x")
