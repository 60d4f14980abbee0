"""Libraries real classic TVM v0.19.0 exported after its TensorRT and Arm Compute Library partitioning
(``tests/data/tvm-exports``) run on rpcsrv and match TVM's own expected outputs (rtol 1e-4):

* through the real apache-tvm 0.27 client (``tvm.rpc.connect``, upload, ``load_module``, the graph
  executor's functions by name: 0.27 no longer ships ``tvm.contrib.graph_executor``);
* through the classic dialect, with the project's own client (``client/rpc.py``, ``Dialect.CLASSIC``,
  its ``GraphModule``), and the tvm-ffi dialect of the same client;
* on a board running native code in its worker process (the default) and in-process.

The ACL library calls two host functions TVM compiled (relu) between its ACL regions: native code.
The TensorRT one is offloaded whole, so it also runs on a board with native code off.  ``rpcsrv
inspect`` prints what each ``.expect.json`` asks for, and ``rpcsrv extract`` writes every graph JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rpcsrv.client.graph_executor import GraphModule as OurGraphModule
from rpcsrv.client.rpc import RPCError, connect
from conftest import SHARED, module_server, need_module
from jsonrt_helpers import EXPORTS, FIXTURES
from rpcsrv.protocol import Dialect

RTOL = 1e-4


def test_every_fixture_is_copied():
    assert FIXTURES == ["acl_cnn", "trt_cnn"]
    for name in FIXTURES:
        for suffix in ("_inputs.npz", "_expect.npz", ".expect.json"):
            assert (EXPORTS / f"{name}{suffix}").exists()
    shared = SHARED / "tvm-exports"
    if shared.is_dir():  # the copy is the shared folder's, byte for byte
        for f in shared.iterdir():
            assert (EXPORTS / f.name).read_bytes() == f.read_bytes(), f"{f.name} differs from ../shared or is missing"


@pytest.fixture(scope="module", params=["isolated", "inprocess"])
def board(request, tmp_path_factory):
    yield from module_server(tmp_path_factory, "--native", request.param)


@pytest.fixture(scope="module")
def no_native_board(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--no-native")


def _data(name: str):
    inputs = dict(np.load(EXPORTS / f"{name}_inputs.npz"))
    expect = np.load(EXPORTS / f"{name}_expect.npz")
    return inputs, [expect[f"output_{i}"] for i in range(len(expect.files))]


def _run_tvm(srv, name: str) -> list[np.ndarray]:
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    sess = tvm.rpc.connect(srv.host, srv.port)
    sess.upload(str(EXPORTS / f"{name}.so"))
    lib = sess.load_module(f"{name}.so")
    dev = sess.cpu(0)
    gmod = lib["default"](dev)
    inputs, expect = _data(name)
    for key, value in inputs.items():
        gmod["set_input"](key, tvm.runtime.tensor(value, dev))
    gmod["run"]()
    assert gmod["get_num_outputs"]() == len(expect)
    return [gmod["get_output"](i).numpy() for i in range(len(expect))]


def _run_ours(srv, name: str, dialect) -> list[np.ndarray]:
    sess = connect(srv.host, srv.port, dialect=dialect)
    sess.upload(str(EXPORTS / f"{name}.so"), f"{name}.so")
    lib = sess.load_module(f"{name}.so")
    gmod = OurGraphModule(lib["default"](sess.cpu(0)))
    inputs, expect = _data(name)
    for key, value in inputs.items():
        gmod.set_input(key, value)
    gmod.run()
    return [gmod.get_output(i).numpy() for i in range(len(expect))]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_through_the_real_tvm_client(board, name):
    outputs = _run_tvm(board, name)
    for got, want in zip(outputs, _data(name)[1]):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)
    assert board.alive()


@pytest.mark.parametrize("dialect", [Dialect.CLASSIC, Dialect.FFI])
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_through_our_client(board, name, dialect):
    outputs = _run_ours(board, name, dialect)
    for got, want in zip(outputs, _data(name)[1]):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)


def test_fully_offloaded_library_needs_no_native_code(no_native_board):
    outputs = _run_ours(no_native_board, "trt_cnn", Dialect.CLASSIC)
    np.testing.assert_allclose(outputs[0], _data("trt_cnn")[1][0], rtol=RTOL, atol=1e-6)
    with pytest.raises(RPCError, match="tvmgen_default_fused_nn_relu cannot run: native code is disabled"):
        _run_ours(no_native_board, "acl_cnn", Dialect.CLASSIC)


def _rpcsrv(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "rpcsrv", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", FIXTURES)
def test_inspect_shows_the_json_runtime_graph(name):
    text = _rpcsrv("inspect", str(EXPORTS / f"{name}.so"))
    for word in json.loads((EXPORTS / f"{name}.expect.json").read_text())["must_mention"]:
        assert word in text, word
    key = "tensorrt" if name.startswith("trt") else "arm_compute_lib"
    assert f"{key} module" in text
    assert "JSON-runtime function" in text  # the graph's calls are found, not "missing"
    assert ": missing" not in text
    if name == "trt_cnn":
        assert "tensorrt.nn.conv2d x2" in text and "tensorrt.nn.softmax x1" in text
        assert "consts 9" in text
    else:
        assert "nn.conv2d x1" in text and "inputs [float32[1, 16, 16, 3]]" in text
    info = json.loads(_rpcsrv("inspect", "--json", str(EXPORTS / f"{name}.so")))
    graphs = [m["json_graph"] for m in info["modules"] if "json_graph" in m]
    assert graphs and all(g["ops"] for g in graphs)


@pytest.mark.parametrize("name", FIXTURES)
def test_extract_writes_each_graph_json(name, tmp_path):
    _rpcsrv("extract", str(EXPORTS / f"{name}.so"), "-o", str(tmp_path / "out"))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    files = sorted((tmp_path / "out" / "jsonrt").glob("*.json"))
    assert len(files) == (1 if name == "trt_cnn" else 8)
    for f in files:
        graph = json.loads(f.read_text())
        assert graph["symbol"] == f.stem and graph["nodes"]
        assert f"jsonrt/{f.name}" in json.dumps(manifest)
