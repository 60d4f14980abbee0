"""The board's plugin registry (rpcsrv.loader.plugins) in process: entry points found on sys.path,
a broken plugin is one log line and nothing else, --plugin / --no-plugins choose, a taken type key is a
clear error, the built-in kinds go through the same interface, and the compiler's codegens likewise."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from plugin_helpers import cnn_model, fake_site, reference
from rpcsrv.client.compiler import CompileError, codegens, compile_onnx
from rpcsrv.executor import ExecutorError, load_module
from rpcsrv.loader import LoaderError, load_library
from rpcsrv.loader import plugins
from rpcsrv.loader.node import PAYLOADS
from rpcsrv.protocol.dtypes import Device


@pytest.fixture
def site(tmp_path, monkeypatch):
    for path in reversed(fake_site(tmp_path).split(":")):
        monkeypatch.syspath_prepend(path)
    with plugins.isolated():
        yield tmp_path


def _names(report, what="loaded"):
    return [p["name"] if isinstance(p, dict) else p for p in report[what]]


def test_builtin_kinds_are_plugins():
    report = plugins.report()
    builtin = {p["name"]: p for p in report["loaded"] if p["source"] == "built-in"}
    assert set(builtin) >= {"graph_executor", "examplejson", "relax_vm"}
    assert "examplejson" in builtin["examplejson"]["type_keys"]
    for key in ("GraphExecutorFactory", "const_loader", "metadata", "examplejson", "relax.VMExecutable"):
        assert plugins.KINDS[key].codec is PAYLOADS[key]


def test_broken_plugin_is_one_line_and_the_rest_loads(site, caplog):
    with caplog.at_level(logging.WARNING, logger="rpcsrv.plugins"):
        report = plugins.load_plugins()
    assert "vendor_npu" in _names(report)
    failed = {p["name"]: p["error"] for p in report["failed"]}
    assert set(failed) == {"broken", "dup"}
    assert "ModuleNotFoundError" in failed["broken"] and "no_such_module_for_rpcsrv" in failed["broken"]
    # a taken type key: both plugins named
    assert "'examplejson'" in failed["dup"] and "'dup'" in failed["dup"] and "already has" in failed["dup"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert any(line.startswith("plugin broken not loaded") for line in lines)
    assert PAYLOADS["examplejson"] is plugins.KINDS["examplejson"].codec  # the built-in kept its key
    assert plugins.OWNERS["examplejson"] == "examplejson"


def test_plugin_flag_loads_only_those(site, caplog):
    with caplog.at_level(logging.WARNING, logger="rpcsrv.plugins"):
        report = plugins.load_plugins(["vendor_npu"])
    assert not caplog.records and not report["failed"]
    assert "vendor_npu" in _names(report) and sorted(report["skipped"]) == ["broken", "dup"]


def test_no_plugins_leaves_the_builtins(site):
    report = plugins.load_plugins(enabled=False)
    assert all(p["source"] == "built-in" for p in report["loaded"])
    assert sorted(report["skipped"]) == ["broken", "dup", "vendor_npu"]
    assert "vendor_npu" not in PAYLOADS


def test_unknown_plugin_name_is_reported(site):
    report = plugins.load_plugins(["nope"])
    (failed,) = report["failed"]
    assert failed["name"] == "nope" and "no such plugin installed" in failed["error"]
    assert "vendor_npu" in failed["error"]  # what is installed is listed


def test_the_choice_is_kept_for_the_workers(site):
    """What a server's native workers get in their start message: the choice and what it loaded, which a
    worker loads the same (``adopt``; tests/plugins/test_plugin_server.py runs the vendor library there)."""
    plugins.load_plugins(["vendor_npu"])
    chosen = plugins.choice()
    assert chosen == {"select": ["vendor_npu"], "enabled": True, "loaded": ["vendor_npu"]}
    plugins.load_plugins(enabled=False)
    assert plugins.choice() == {"select": None, "enabled": False, "loaded": ["vendor_npu"]}
    assert _names(plugins.adopt(chosen)) == _names(plugins.report())  # (installed already: nothing more)


def test_duplicate_type_key_names_both_plugins(site):
    plugins.load_plugins(["vendor_npu"])
    from vendor_npu.runtime import KIND

    with pytest.raises(plugins.PluginError, match=r"'other'.*'vendor_npu'.*already has"):
        plugins.install(plugins.RuntimePlugin("other", (KIND,)), "test")
    with pytest.raises(plugins.PluginError, match="declares no module kind"):
        plugins.install(plugins.RuntimePlugin("empty", ()), "test")
    with pytest.raises(plugins.PluginError, match="expected an rpcsrv.loader.plugins.RuntimePlugin"):
        plugins.install(object(), "test")


def test_vendor_library_runs_with_its_plugin_and_is_refused_without(site, tmp_path):
    model = cnn_model()
    compiled = compile_onnx(model, codegen="vendor_npu")
    assert [sg.node.type_key for sg in compiled.subgraphs] == ["vendor_npu"]
    (sg,) = compiled.subgraphs  # the codegen's composite table (MergeComposite) fused each chain
    assert sg.patterns == ["vendor_npu.conv2d_relu", "vendor_npu.conv2d_relu", "vendor_npu.add_relu",
                           "vendor_npu.dense_relu"]
    assert sg.ops == ["conv", "max_pool", "conv", "add", "max_pool", "flatten", "gemm", "gemm"]
    assert all(n.op_type != "Dropout" for n in compiled.graph.nodes)
    path = compiled.export_library(str(tmp_path / "cnn.so"))
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype("float32")
    with pytest.raises(ExecutorError, match="type key 'vendor_npu'.*no installed plugin"):
        load_module(path)  # the compiler's codec reads it, but no runtime runs it
    del PAYLOADS["vendor_npu"]  # as on a board without the plugin
    with pytest.raises(LoaderError, match="unknown module type key 'vendor_npu'.*no installed plugin"):
        load_library(path)
    plugins.load_plugins(["vendor_npu"])
    gmod = load_module(path).get_function("default")(Device(1, 0))
    gmod.get_function("set_input")("x", x)
    gmod.get_function("run")()
    np.testing.assert_allclose(np.array(gmod.get_function("get_output")(0)), reference(model, x),
                               rtol=1e-4, atol=1e-5)


def test_codegens_come_from_entry_points(site):
    assert {"examplejson", "vendor_npu"} <= set(codegens.available())
    assert codegens.get_codegen().name == "examplejson"
    with pytest.raises(CompileError, match="unknown codegen 'nope'.*examplejson"):
        codegens.get_codegen("nope")
    with pytest.raises(CompileError, match="not in codegen 'vendor_npu'"):
        compile_onnx(cnn_model(), ops="conv,sigmoid", codegen="vendor_npu")


def test_examplejson_is_not_special_outside_its_modules():
    """The board's and the compiler's generic code name no kind: ExampleJSON lives in its own modules."""
    from conftest import REPO

    own = {"rpcsrv/loader/examplejson.py", "rpcsrv/executor/examplejson/subgraphs.py",
           "rpcsrv/executor/examplejson/text.py", "client/compiler/examplejson.py"}
    generic = ["rpcsrv/loader/modules.py", "rpcsrv/loader/inspect.py", "rpcsrv/loader/blob.py",
               "rpcsrv/loader/plugins.py", "rpcsrv/executor/graph/factory.py", "rpcsrv/executor/const_loader.py",
               "rpcsrv/executor/placeholders.py", "rpcsrv/executor/module.py",
               "client/compiler/model.py", "client/compiler/codegens.py", "client/compiler/relax_vm.py"]
    for rel in generic:
        assert rel not in own
        code = [line for line in (REPO / rel).read_text().splitlines()
                if not line.lstrip().startswith(("#", "*", "``", "\"\"\""))]
        hits = [line for line in code if "ExampleJSONRuntime" in line or "ExampleJSONModule" in line]
        assert not hits, f"{rel}: {hits}"
    assert sys.modules["rpcsrv.loader.modules"].BUILTIN  # the built-in list is what installs them
