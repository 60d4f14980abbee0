"""A library whose module is the kind of an installed plugin that the board turned off (``--no-plugins``,
``--plugin`` naming others): refused at ``load_module``, in both blob layouts, with a message that names the
type key and the plugin that would take it, says that it is installed and turned off, and claims nothing
false; without the plugin installed, the message says that no installed plugin registers the key.

The libraries are the example vendor plugin's (``examples/vendor-plugin``, type key ``vendor_npu``), compiled
with its codegen; the plugin is installed through a fake distribution on the path (tests/plugins)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import ServerProcess, need_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))
from plugin_helpers import VENDOR, cnn_model, fake_site  # noqa: E402

from rpcsrv.executor import ExecutorError, load_module  # noqa: E402
from rpcsrv.loader import LoaderError, load_library, plugins  # noqa: E402
from rpcsrv.loader.node import PAYLOADS  # noqa: E402

TURNED_OFF = "plugin 'vendor_npu' (fake-plugins 0.1) would, but it is installed and turned off"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The fake distribution's path, and the vendor library in both layouts."""
    root = tmp_path_factory.mktemp("refusals")
    paths = fake_site(root).split(":")
    sys.path[:0] = paths
    try:
        with plugins.isolated():
            from rpcsrv.client.compiler import compile_onnx

            compiled = compile_onnx(cnn_model(), codegen="vendor_npu")
            libs = {layout: Path(compiled.export_library(str(root / f"cnn_{layout}.so"), layout=layout))
                    for layout in ("classic", "ffi")}
        yield paths, libs
    finally:
        del sys.path[:len(paths)]


@pytest.fixture
def board_without_the_plugin(site):
    """This process as a board whose flags left the vendor plugin out (its kinds unknown here)."""
    with plugins.isolated():
        _forget_the_vendor_plugin()
        yield


def _forget_the_vendor_plugin() -> None:
    """The registry as in a process that never loaded the plugin (a test before may have: its codec, a
    compiler's, or the plugin itself; restored after the test by ``plugins.isolated``)."""
    PAYLOADS.pop("vendor_npu", None)
    plugins.REGISTRY.installed.pop("vendor_npu", None)


@pytest.mark.parametrize("choice, why", [({"enabled": False}, "--no-plugins"),
                                         ({"select": ["broken"]}, "not among --plugin")])
def test_both_layouts_are_refused_at_load_naming_the_turned_off_plugin(site, board_without_the_plugin, choice, why):
    _paths, libs = site
    plugins.load_plugins(**choice)
    with pytest.raises(LoaderError) as classic:
        load_library(str(libs["classic"]))
    with pytest.raises(ExecutorError) as ffi:  # (it used to load, and fail only at lib["default"](dev))
        load_module(str(libs["ffi"]))
    for info in (classic, ffi):
        text = str(info.value)
        assert "unknown module type key 'vendor_npu'" in text and f"{TURNED_OFF} ({why})" in text, text
        assert "has no length" not in text and "GraphExecutorFactory" not in text, text  # no false claim, no list


def test_without_the_plugin_installed_no_plugin_is_named(site, tmp_path, monkeypatch):
    """The classic layout cannot keep a module no kind decodes: refused, naming the key only.  The tvm-ffi
    layout keeps it in the tree (as TVM does with a module it cannot run), and what calls it fails."""
    from rpcsrv.protocol.dtypes import Device

    _paths, libs = site
    installs = [p for p in sys.path
                if p in site[0] or p == str(VENDOR) or (Path(p) / "fake_plugins-0.1.dist-info").is_dir()]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in installs])  # no vendor plugin installed
    with plugins.isolated():
        _forget_the_vendor_plugin()
        plugins.load_plugins()
        with pytest.raises(LoaderError) as classic:
            load_library(str(libs["classic"]))
        lib = load_module(str(libs["ffi"]))
        with pytest.raises(ExecutorError, match="modules of type vendor_npu cannot be run by rpcsrv"):
            lib.get_function("default")(Device(1, 0))
    assert "unknown module type key 'vendor_npu': no installed plugin registers it (at offset" in str(classic.value)
    assert "would" not in str(classic.value)


@pytest.mark.tvm
@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_the_real_client_reads_the_refusal_at_load_module(site, layout, tmp_path, monkeypatch):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    paths, libs = site
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))
    srv = ServerProcess("--no-plugins", workdir=tmp_path)
    try:
        sess = tvm.rpc.connect(srv.host, srv.port)
        sess.upload(str(libs[layout]))
        with pytest.raises(Exception) as info:
            sess.load_module(libs[layout].name)
        assert f"{TURNED_OFF} (--no-plugins)" in str(info.value), str(info.value)
        assert srv.alive()
    finally:
        srv.stop()
