"""The example vendor plugin's int8 convolution: ``byoc compile --codegen vendor_npu`` on models quantized by
onnxruntime gives the accelerator every int8 conv (with the quantization parameters ``Op.quant`` carries, as its
program's zero points and per-channel table) and the rest to host C; the library runs through the real apache-tvm
client on ``rpcsrv serve`` with the plugin installed, within one quantization step of onnxruntime.  ``byoc run``,
``profile`` and ``compare`` read the library with the installed board plugins (``--no-plugins``: a one-line
error naming the type key)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, ServerProcess, need_module, run_with_tvm
from plugin_helpers import VENDOR, fake_site

need_module("onnxruntime", "quantizes the models and is the reference")
sys.path.insert(0, str(REPO / "tests" / "compiler"))
from int8_models import output_step, quantized, reference, sample_input, within_one_step  # noqa: E402

from rpcsrv.client.cli import main as byoc  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The fake distribution naming the vendor plugin's entry points (its folder is on the path list)."""
    return fake_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def board(site, tmp_path_factory):
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
    srv = ServerProcess(workdir=tmp_path_factory.mktemp("work"), env=env)
    yield srv
    assert srv.alive()
    srv.stop()


@pytest.fixture
def installed(site, monkeypatch):
    """This process sees the plugin installed (entry points on sys.path); the registries are restored after."""
    from rpcsrv.client.compiler import codegens
    from rpcsrv.loader import plugins

    for folder in reversed(site.split(os.pathsep)):
        monkeypatch.syspath_prepend(folder)
    monkeypatch.setattr(codegens, "_LOADED", dict(codegens._LOADED))
    with plugins.isolated():
        yield


def _compile(tmp_path, name, per_channel, acts="QUInt8", fmt="QDQ"):
    """``byoc compile --codegen vendor_npu`` (the payload codec it registers is gone after: as in another process)."""
    from rpcsrv.loader import plugins

    model = quantized(tmp_path, name, fmt, per_channel, acts)
    so = tmp_path / f"{model.stem}_vendor.so"
    with plugins.isolated():
        assert byoc(["compile", str(model), "-o", str(so), "--codegen", "vendor_npu", "-q"]) == 0
    return model, so


@pytest.mark.parametrize("name,fmt,per_channel,acts", [("resnet", "QDQ", False, "QUInt8"),
                                                       ("resnet", "QOperator", True, "QInt8"),
                                                       ("mobilenet", "QDQ", True, "QUInt8"),
                                                       ("mobilenet", "QOperator", False, "QUInt8")])
def test_the_vendor_codegen_takes_the_int8_convs(installed, tmp_path, name, fmt, per_channel, acts):
    from rpcsrv.client.compiler import compile_onnx

    model = quantized(tmp_path, name, fmt, per_channel, acts)
    compiled = compile_onnx(str(model), codegen="vendor_npu")
    convs = [n for n in compiled.graph.nodes if n.op_type == "QLinearConv"]
    assert [k for sg in compiled.subgraphs for k in sg.ops] == ["q_linear_conv"] * len(convs) and convs
    records = [op for sg in compiled.subgraphs for op in sg.node.program.ops]
    assert {str(op.opcode) for op in records} == {"qconv2d"}
    zps = sorted((int(op.params[6]) - 128, int(op.params[7]) - 128) for op in records)
    graph = compiled.graph
    want = sorted((int(graph.constants[n.inputs[2]]), int(graph.constants[n.inputs[7]])) for n in convs)
    assert zps == want  # the zero points op.quant gave, in each record
    assert all(not f.startswith("tvmgen_default_fused_q_linear_conv") for f in compiled.host_functions)


@pytest.mark.parametrize("name,per_channel,fmt", [("resnet", False, "QDQ"), ("mobilenet", True, "QDQ"),
                                                  ("resnet", True, "QOperator"), ("mobilenet", False, "QOperator")])
def test_vendor_int8_library_through_the_real_tvm_client(installed, board, tmp_path, name, per_channel, fmt):
    model, so = _compile(tmp_path, name, per_channel, fmt=fmt)
    x = sample_input(21)
    ours, theirs = run_with_tvm(board, so, {"x": x})[0], reference(model, x)
    assert within_one_step(ours, theirs, output_step(model)) >= 0.99 and ours.argmax() == theirs.argmax()


def test_run_profile_compare_load_the_board_plugins(installed, board, tmp_path, capsys):
    model, so = _compile(tmp_path, "resnet", True, "QInt8")
    x = tmp_path / "x.npy"
    np.save(x, sample_input(22))
    where = ["--host", board.host, "--port", str(board.port), "--input", f"x={x}"]
    assert byoc(["run", str(so), *where, "-o", str(tmp_path / "out.npz"), "--no-progress"]) == 0
    with np.load(tmp_path / "out.npz") as out:
        ours = out["out"]
    assert within_one_step(ours, reference(model, np.load(x)), output_step(model)) >= 0.99
    capsys.readouterr()
    assert byoc(["profile", str(so), *where, "--repeat", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {n["name"] for n in report["nodes"]} >= {"tvmgen_default_vendor_npu_main_0",
                                                    "tvmgen_default_fused_q_linear_add_1"}
    code = byoc(["compare", str(so), str(model), *where])  # the codegen: the one whose functions the library calls
    text = capsys.readouterr().out
    assert code == 0 and "compared tensors agree" in text and "steps" in text
    assert text.count("host output 0") >= 8  # vendor programs and host functions: compared by their outputs
    assert byoc(["compare", str(so), str(model), *where, "--codegen", "examplejson"]) == 2
    assert "was not compiled from" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "profile", "compare"])
def test_without_the_plugins_the_library_is_a_one_line_error(installed, board, tmp_path, capsys, command):
    """(``compare`` compiles the model with the vendor's codegen first, whose codec reads the library: only the
    flags' conflict is an error there.)"""
    model, so = _compile(tmp_path, "mobilenet", False)
    x = tmp_path / "x.npy"
    np.save(x, sample_input(23))
    extra = [str(model), "--codegen", "vendor_npu"] if command == "compare" else []
    args = [command, str(so), *extra, "--host", board.host, "--port", str(board.port), "--input", f"x={x}"]
    if command != "compare":
        assert byoc(args + ["--no-plugins"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("byoc: error: ") and "\n" not in err and "unknown module type key 'vendor_npu'" in err
    assert byoc(args + ["--plugin", "vendor_npu", "--no-plugins"]) == 2
    assert "--plugin and --no-plugins exclude each other" in capsys.readouterr().err
    assert Path(VENDOR).is_dir()
