"""``byoc profile`` and ``byoc compare`` against a live rpcsrv (``rpcsrv serve`` in a child process)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rpcsrv.client.cli import main as byoc
from conftest import need_module
from debug_helpers import chain_inputs, chain_library, chain_reference
from onnx_models import cnn_input, small_cnn


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("chain")
    so = chain_library(d / "chain.so")
    args = []
    for name, value in zip(("x", "w", "b"), chain_inputs()):
        np.save(d / f"{name}.npy", value)
        args += ["--input", f"{name}={d / name}.npy"]
    return so, args


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The small CNN as ONNX, compiled by byoc; plus copies compiled with one constant perturbed."""
    onnx = need_module("onnx")
    from rpcsrv.client.compiler import compile_onnx

    d = tmp_path_factory.mktemp("cnn")
    onnx.save(small_cnn(), d / "cnn.onnx")
    np.save(d / "x.npy", cnn_input())

    def build(perturb: str = "", ops=None) -> str:
        out = d / f"cnn{'_' + perturb if perturb else ''}{'_mixed' if ops else ''}.so"
        if not out.exists():
            compile_onnx(small_cnn(perturb), ops=ops).export_library(str(out))
        return str(out)
    return d, build


#: the accelerator without Mul and Add: those two nodes become C host functions in the library
MIXED = "conv,relu,global_average_pool,flatten,gemm"


def _port(server) -> list[str]:
    return ["--host", server.host, "--port", str(server.port)]


def test_profile_json_has_every_node_with_shapes_and_kernels(server, chain, capsys):
    so, inputs = chain
    assert byoc(["profile", str(so), *_port(server), *inputs, "--repeat", "3", "--number", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    nodes = {n["name"]: n for n in report["nodes"]}
    assert list(nodes) == ["mm_0", "ew_1", "tail_2"]
    assert [k["op"] for k in nodes["mm_0"]["kernels"]] == ["matmul"] * 3
    assert [k["op"] for k in nodes["ew_1"]["kernels"]] == ["add", "mul"]
    assert nodes["mm_0"]["inputs"] == [{"shape": [64, 64], "dtype": "float32"}] * 2
    assert nodes["tail_2"]["outputs"] == [{"shape": [64, 64], "dtype": "float32"}]
    for n in report["nodes"]:
        assert len(n["seconds"]["all"]) == 3 and n["seconds"]["mean"] > 0 and n["seconds"]["std"] >= 0
        # kernels run inside their node: together they cannot take longer than it
        assert sum(k["seconds"]["mean"] for k in n["kernels"]) <= n["seconds"]["mean"] * 1.05
    assert sum(n["share"] for n in report["nodes"]) == pytest.approx(1.0)
    assert report["run_seconds"]["min"] > 0


def test_profile_plot_writes_a_png_and_its_json(server, chain, tmp_path, capsys):
    need_module("matplotlib", "the plot is an optional extra: pip install 'rpcsrv[plot]'")
    so, inputs = chain
    png = tmp_path / "profile.png"
    assert byoc(["profile", str(so), *_port(server), *inputs, "--repeat", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "mm_0" in out and "matmul #2" in out and f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    saved = json.loads((tmp_path / "profile.json").read_text())
    labels = saved["plot"]
    assert saved["plot"]["image"] == "profile.png"
    assert sorted(labels["nodes"]) == ["ew_1", "mm_0", "tail_2"]
    by_time = sorted(saved["nodes"], key=lambda n: -n["seconds"]["mean"])
    assert labels["nodes"] == [n["name"] for n in by_time]  # slowest first, as drawn
    assert set(labels["kernels"]) == {"matmul #2 (mm_0)", "matmul #3 (mm_0)", "matmul #4 (mm_0)", "add #2 (ew_1)",
                                      "mul #3 (ew_1)", "sub #2 (tail_2)"}


def test_profile_of_a_byoc_compiled_onnx_model(server, cnn, capsys):
    d, build = cnn
    assert byoc(["profile", build(), *_port(server), "--input", f"x={d / 'x.npy'}", "--repeat", "2", "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["ops"] == ["conv", "conv", "mul", "add", "global_average_pool", "flatten", "gemm"]
    assert node["inputs"] == [{"shape": [1, 3, 12, 12], "dtype": "float32"}]
    assert node["kernels"][0]["shape"] == [1, 6, 12, 12]


def test_profile_without_the_inputs_is_a_clear_error(server, chain, capsys):
    so, inputs = chain
    assert byoc(["profile", str(so), *_port(server), *inputs[:2]]) == 2
    err = capsys.readouterr().err
    assert "byoc: error: --input must give every model input" in err and "missing w, b" in err
    assert "x (float32[64x64])" in err
    assert server.alive()


def test_compare_agrees_with_onnxruntime_on_the_model_itself(server, cnn, capsys):
    need_module("onnxruntime")
    d, build = cnn
    assert byoc(["compare", build(), str(d / "cnn.onnx"), *_port(server), "--input", f"x={d / 'x.npy'}"]) == 0
    out = capsys.readouterr().out
    assert "all 7 compared tensors agree" in out


@pytest.mark.parametrize("perturb,node,op", [("w2", "conv2", "Conv"), ("d", "shift", "Add"), ("wf", "fc", "Gemm"),
                                             ("b1", "relu1", "Relu")])
def test_compare_reports_a_perturbed_constant_at_its_node(server, cnn, capsys, perturb, node, op):
    need_module("onnxruntime")
    d, build = cnn
    code = byoc(["compare", build(perturb), str(d / "cnn.onnx"), *_port(server), "--input", f"x={d / 'x.npy'}",
                 "--json"])
    assert code == 1
    result = json.loads(capsys.readouterr().out)
    first = result["first_difference"]
    assert (first["onnx_node"], first["onnx_op"]) == (node, op)
    rows = result["rows"]
    k = next(i for i, r in enumerate(rows) if r["onnx_node"] == node)
    assert all(r["ok"] for r in rows[:k])  # everything before the injected error agrees
    assert first["max_abs"] > 1e-3 and first["max_rel"] > 1e-3


def test_compare_against_another_model_is_a_clear_error(server, cnn, chain, capsys):
    need_module("onnxruntime")
    d, build = cnn
    so, inputs = chain
    assert byoc(["compare", str(so), str(d / "cnn.onnx"), *_port(server), "--input", f"x={d / 'x.npy'}"]) == 2
    assert "was not compiled from" in capsys.readouterr().err


def test_profile_dump_root_writes_tvms_debug_files(server, chain, tmp_path, capsys):
    """The files TVM's debug executor writes, read back by the real TVM (apache-tvm 0.27)."""
    tvm = need_module("tvm", "the real TVM reads the dumped param dict")
    so, inputs = chain
    assert byoc(["profile", str(so), *_port(server), *inputs, "--repeat", "2", "--dump-root", str(tmp_path)]) == 0
    capsys.readouterr()
    folder = tmp_path / "_tvmdbg_device_CPU_0"
    tensors = tvm.runtime.load_param_dict((folder / "output_tensors.params").read_bytes())
    names = ["x", "w", "b", "mm_0", "ew_1", "tail_2"]
    assert list(tensors) == [f"{n}____topo-index:{i}____output-num:0" for i, n in enumerate(names)]
    x, w, b = chain_inputs()
    for key, want in zip(tensors, [x, w, b, *chain_reference(x, w, b)]):
        np.testing.assert_allclose(tensors[key].numpy(), want, rtol=1e-4, atol=1e-5)
    graph = json.loads((folder / "_tvmdbg_graph_dump.json").read_text())
    assert [(n["op"], n["inputs"]) for n in graph["nodes"][2:4]] == [("param", []), ("mm_0", ["x", "w"])]
    assert graph["nodes"][3]["attrs"]["T"] == "type: float32" and graph["nodes"][3]["shape"] == [64, 64]
    events = json.loads((folder / "_tvmdbg_execution_trace.json").read_text())["traceEvents"]
    assert [(e["name"], e["ph"]) for e in events[6:]] == [("mm_0", "B"), ("mm_0", "E"), ("ew_1", "B"),
                                                          ("ew_1", "E"), ("tail_2", "B"), ("tail_2", "E")]
    assert all(a["ts"] <= b["ts"] for a, b in zip(events, events[1:]))


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    import sys

    from rpcsrv.client.profile import plot_report
    from rpcsrv.client.run import UserError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    report = {"nodes": [], "total_node_seconds": 0.0, "number": 1, "repeat": 1}
    with pytest.raises(UserError, match=r"--plot needs matplotlib: pip install 'rpcsrv\[plot\]'"):
        plot_report(report, str(tmp_path / "p.png"))
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("perturb,node,where", [("d", "shift", "host output 0"), ("w2", "conv2", "conv #5")])
def test_compare_with_host_functions_in_the_library(server, cnn, capsys, perturb, node, where):
    """Partial offload: Mul and Add run as native host functions (in the board's worker); their
    outputs are compared node by node, the ExampleJSON regions kernel by kernel."""
    need_module("onnxruntime")
    d, build = cnn
    args = [str(d / "cnn.onnx"), *_port(server), "--input", f"x={d / 'x.npy'}", "--ops", MIXED]
    assert byoc(["compare", build(ops=MIXED), *args]) == 0
    out = capsys.readouterr().out
    assert "all 7 compared tensors agree" in out and out.count("host output 0") == 2
    assert byoc(["compare", build(perturb, ops=MIXED), *args]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"first difference: ONNX node {node!r}") and f"{where} in " in last


def test_profile_with_host_functions_in_the_library(server, cnn, capsys):
    d, build = cnn
    assert byoc(["profile", build(ops=MIXED), *_port(server), "--input", f"x={d / 'x.npy'}", "--repeat", "2",
                 "--json"]) == 0
    nodes = {n["name"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert set(nodes) == {"tvmgen_default_examplejson_main_0", "tvmgen_default_fused_mul_0",
                          "tvmgen_default_fused_add_1", "tvmgen_default_examplejson_main_1"}
    assert nodes["tvmgen_default_fused_mul_0"]["kernels"] == []  # native code: timed as a whole
    assert [k["op"] for k in nodes["tvmgen_default_examplejson_main_1"]["kernels"]] == [
        "global_average_pool", "flatten", "gemm"]  # the debug executor runs where the library does
    assert all(n["seconds"]["mean"] > 0 for n in nodes.values())
