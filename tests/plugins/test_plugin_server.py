"""Board plugins through the commands a user runs: ``byoc compile --codegen vendor_npu``, ``rpcsrv serve``
with a broken plugin installed beside the good one (one log line each, the server serves), the real
apache-tvm client running the vendor library (in a worker process: ``--isolate all`` hands the plugin
choice over), ``--no-plugins`` refusing it by type key, and ``rpcsrv inspect`` naming the plugins."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ServerProcess, need_module
from plugin_helpers import cnn_model, fake_site, reference

pytestmark = pytest.mark.tvm


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(environment with the fake distribution on PYTHONPATH, the vendor library, the model)."""
    root = tmp_path_factory.mktemp("plugins")
    env = dict(os.environ, PYTHONPATH=fake_site(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = cnn_model()
    (root / "cnn.onnx").write_bytes(model.SerializeToString())
    out = subprocess.run([sys.executable, "-m", "rpcsrv.client.cli", "compile", str(root / "cnn.onnx"), "-o",
                          str(root / "cnn.so"), "--codegen", "vendor_npu"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "1 vendor_npu subgraph(s)" in out.stdout and "host function" not in out.stdout
    return env, root / "cnn.so", model


def _serve(monkeypatch, env, tmp_path, *args):
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    return ServerProcess(*args, workdir=tmp_path)


def _run(tvm, srv, lib, x):
    sess = tvm.rpc.connect(srv.host, srv.port)
    sess.upload(str(lib))
    mod = sess.load_module(lib.name)
    dev = sess.cpu(0)
    gmod = mod["default"](dev)
    gmod["set_input"]("x", tvm.runtime.tensor(x, dev))
    gmod["run"]()
    return gmod["get_output"](0).numpy()


def test_broken_plugin_is_one_line_and_the_vendor_library_runs(setup, monkeypatch, tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    env, lib, model = setup
    srv = _serve(monkeypatch, env, tmp_path, "--isolate", "all")
    try:
        x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype("float32")
        np.testing.assert_allclose(_run(tvm, srv, lib, x), reference(model, x), rtol=1e-4, atol=1e-5)
        log = srv.stderr().splitlines()
        broken = [line for line in log if "plugin broken not loaded" in line]
        dup = [line for line in log if "plugin dup not loaded" in line]
        assert len(broken) == 1 and "no_such_module_for_rpcsrv" in broken[0], log
        assert len(dup) == 1 and "'examplejson'" in dup[0], log
        assert not any("Traceback" in line for line in log)
        assert srv.alive()
    finally:
        srv.stop()


def test_without_the_plugin_the_library_is_refused_by_type_key(setup, monkeypatch, tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    env, lib, _model = setup
    for flags in (["--no-plugins"], ["--plugin", "broken"]):
        srv = _serve(monkeypatch, env, tmp_path, *flags)
        try:
            sess = tvm.rpc.connect(srv.host, srv.port)
            sess.upload(str(lib))
            with pytest.raises(Exception, match="vendor_npu") as info:
                sess.load_module(lib.name)
            assert "no installed plugin" in str(info.value)
            assert srv.alive()
        finally:
            srv.stop()


def test_inspect_names_the_plugins(setup):
    env, lib, _model = setup

    def inspect(*flags):
        return subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(lib), *flags], env=env,
                              capture_output=True, text=True)

    out = inspect("--plugin", "vendor_npu")
    assert out.returncode == 0, out.stderr
    assert "[2] vendor_npu (plugin vendor_npu): tvmgen_default_vendor_npu_main_0" in out.stdout  # no empty const loader
    assert "vendor_npu program tvmgen_default_vendor_npu_main_0: 8 op(s)" in out.stdout
    assert "tvmgen_default_vendor_npu_main_0: vendor_npu program" in out.stdout  # what the graph calls
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("plugins: graph_executor (built-in)") and "vendor_npu (fake-plugins 0.1)" in last
    assert "not loaded: broken, dup" in last and not out.stderr
    out = inspect("--no-plugins")
    assert out.returncode == 2 and "unknown module type key 'vendor_npu'" in out.stderr
    out = inspect("--plugin", "nope")
    assert out.returncode == 2 and "plugin nope not loaded: no such plugin installed" in out.stderr
    assert inspect("--plugin", "x", "--no-plugins").returncode == 2
