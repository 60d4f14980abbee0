"""The real TVM client (apache-tvm, tvm-ffi dialect) against ``rpcsrv serve`` in a child process.

These tests are the judge of wire compatibility: nothing here uses our own client.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"]
SHAPES = [(3, 4), (5,), (), (0, 3), (2, 1, 3)]


@pytest.fixture(scope="module")
def tvm():
    return need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")


@pytest.fixture
def sess(tvm, server):
    s = tvm.rpc.connect(server.host, server.port)
    yield s


def test_connect_and_call_a_global(sess):
    path = sess.get_function("tvm.rpc.server.workpath")("abc")
    assert path.endswith("/abc") and "session-" in path


def test_missing_global_is_an_error(tvm, sess):
    with pytest.raises(Exception, match="no.such.function"):
        sess.get_function("no.such.function")


def test_keyed_server(tvm, keyed_server):
    s = tvm.rpc.connect(keyed_server.host, keyed_server.port, key="board-a")
    assert s.get_function("tvm.rpc.server.workpath")("x").endswith("/x")
    with pytest.raises(Exception):
        tvm.rpc.connect(keyed_server.host, keyed_server.port, key="board-b")
    with pytest.raises(Exception):
        tvm.rpc.connect(keyed_server.host, keyed_server.port)
    assert keyed_server.alive()


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_round_trip(tvm, sess, dtype):
    dev = sess.cpu(0)
    for shape in SHAPES:
        x = (np.arange(int(np.prod(shape))).reshape(shape) * 3 + 1).astype(dtype)
        arr = tvm.runtime.tensor(x, dev)
        y = arr.numpy()
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, x)
    empty = tvm.runtime.empty((2, 3), dtype, dev)
    assert empty.shape == (2, 3) and empty.numpy().shape == (2, 3)


def test_ext_dev_memory(tvm, sess):
    dev = sess.ext_dev(0)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    np.testing.assert_array_equal(tvm.runtime.tensor(x, dev).numpy(), x)


def test_copy_between_remote_arrays(tvm, sess):
    dev = sess.cpu(0)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    a = tvm.runtime.tensor(x, dev)
    b = tvm.runtime.empty((3, 4), "float32", dev)
    b.copyfrom(a)
    np.testing.assert_array_equal(b.numpy(), x)


def test_device_attributes(sess):
    dev = sess.cpu(0)
    assert dev.exist
    dev.sync()
    assert not sess.device(2, 0).exist  # no CUDA on the board


def test_files(sess):
    blob = bytearray(bytes(range(256)) * 4)
    sess.upload(blob, "blob.bin")
    assert "blob.bin" in sess.listdir(".").split(",")
    assert bytes(sess.download("blob.bin")) == bytes(blob)
    sess.remove("blob.bin")
    assert "blob.bin" not in sess.listdir(".").split(",")


def test_upload_outside_workspace_is_refused(sess, server, tmp_path):
    with pytest.raises(Exception, match="workspace"):
        sess.upload(bytearray(b"x"), "../escape.bin")
    with pytest.raises(Exception, match="absolute"):
        sess.upload(bytearray(b"x"), str(tmp_path / "abs.bin"))
    assert not (tmp_path / "abs.bin").exists()


def test_download_missing_file(sess):
    with pytest.raises(Exception, match="no file"):
        sess.download("nope.bin")


def test_handles_are_freed(tvm, sess):
    stats = sess.get_function("rpcsrv.session_stats")
    before = dict(kv.split("=") for kv in stats().split(","))
    dev = sess.cpu(0)
    arrays = [tvm.runtime.tensor(np.ones(100, "float32"), dev) for _ in range(5)]
    f = sess.get_function("tvm.rpc.server.workpath")
    mid = dict(kv.split("=") for kv in stats().split(","))
    assert int(mid["buffers"]) == int(before["buffers"]) + 5
    assert int(mid["objects"]) >= int(before["objects"]) + 1
    del arrays, f
    import gc

    gc.collect()
    after = dict(kv.split("=") for kv in stats().split(","))
    assert int(after["buffers"]) == int(before["buffers"])
    assert int(after["bytes"]) == int(before["bytes"])
