"""The example vendor plugin as a vendor ships it: installed from its folder into a fresh venv next to a
non-editable rpcsrv, ``byoc compile --codegen vendor_npu`` makes the library from an ONNX model, that
venv's ``rpcsrv serve`` runs it for the real apache-tvm client (checked against onnxruntime); after
``pip uninstall`` of the plugin the restarted board refuses the same library, naming its type key.

The venv is built from copies of the sources (pip's in-tree build would leave ``build/`` in the
checkout); pip takes the dependencies from its cache / find-links (PyPI for anything missing)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, need_module
from plugin_helpers import VENDOR, cnn_model, reference

pytestmark = [pytest.mark.tvm, pytest.mark.slow]

SOURCES = ("rpcsrv", "client", "setup.py", "pyproject.toml", "README.md")
IGNORE = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "*.pyc")


def _copy(names, src, dst):
    dst.mkdir(parents=True)
    for name in names:
        (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, dst / name,
                                                                     **({"ignore": IGNORE} if (src / name).is_dir()
                                                                        else {}))
    return dst


def _pip(venv, *args):
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


class Board:
    """That venv's ``rpcsrv serve`` on a free port."""

    def __init__(self, venv, workdir):
        workdir.mkdir()
        self.log = workdir / "serve.log"
        cmd = [str(venv / "bin" / "rpcsrv"), "-v", "serve", "--port", "0", "--workdir", str(workdir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True)
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"rpcsrv did not start: {line!r} {self.log.read_text()}")
        self.port = int(m.group(1))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _load(tvm, board, lib):
    sess = tvm.rpc.connect("127.0.0.1", board.port)
    sess.upload(str(lib))
    return sess, sess.load_module(lib.name)


def test_vendor_plugin_in_a_fresh_venv(tmp_path):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    need_module("onnxruntime", "the numeric reference")
    src = _copy(SOURCES, REPO, tmp_path / "rpcsrv-src")
    vendor = _copy(["pyproject.toml", "vendor_npu"], VENDOR, tmp_path / "vendor-plugin")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, "install", "-q", str(src), str(vendor))

    model = cnn_model(seed=11)
    (tmp_path / "cnn.onnx").write_bytes(model.SerializeToString())
    lib = tmp_path / "cnn.so"
    out = subprocess.run([str(venv / "bin" / "byoc"), "compile", str(tmp_path / "cnn.onnx"), "-o", str(lib),
                          "--codegen", "vendor_npu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "1 vendor_npu subgraph(s)" in out.stdout

    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype("float32")
    board = Board(venv, tmp_path / "work1")
    try:
        _sess, mod = _load(tvm, board, lib)
        dev = _sess.cpu(0)
        gmod = mod["default"](dev)
        gmod["set_input"]("x", tvm.runtime.tensor(x, dev))
        gmod["run"]()
        np.testing.assert_allclose(gmod["get_output"](0).numpy(), reference(model, x), rtol=1e-4, atol=1e-5)
    finally:
        board.stop()
    assert "vendor_npu (rpcsrv-vendor-example 0.1.0)" in (tmp_path / "work1" / "serve.log").read_text()

    _pip(venv, "uninstall", "-y", "-q", "rpcsrv-vendor-example")
    board = Board(venv, tmp_path / "work2")
    try:
        with pytest.raises(Exception, match="unknown module type key 'vendor_npu'") as info:
            _load(tvm, board, lib)
        assert "no installed plugin registers it" in str(info.value)
        assert board.proc.poll() is None
    finally:
        board.stop()
