"""Graph JSON and storage plan, module tree, and the exported file formats."""

from __future__ import annotations

import json
import struct
import tarfile

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import CompileError, compile_onnx
from rpcsrv.client.compiler.codegen import _Planner, graph_json
from rpcsrv.client.compiler.onnx_import import Graph, TensorInfo
from rpcsrv.client.compiler.partition import Function
from rpcsrv.client.demo_models import sample_inputs, small_cnn
from rpcsrv.client.export import symbol_bytes
from compiler_helpers import chain_model, make_model, run_compiled
from conftest import need_program
from rpcsrv.loader.graph_json import parse_graph_json
from rpcsrv.loader import load_library
from rpcsrv.loader.csource import c_array_source, find_in_c_source


def _liveness_conflicts(doc: dict) -> list:
    """Pairs of entries that share a storage id while both are alive (must be none)."""
    sids = doc["attrs"]["storage_id"][1]
    row = doc["node_row_ptr"]
    last_use, born = {}, {}
    for nid, node in enumerate(doc["nodes"]):
        for k in range(row[nid], row[nid + 1]):
            born[k] = nid
        for src, idx, _ in node["inputs"]:
            last_use[row[src] + idx] = nid
    end = len(doc["nodes"])
    pinned = {row[n] + i for n, i, _ in doc["heads"]} | {row[n] for n in doc["arg_nodes"]}
    span = {e: (born[e], end if e in pinned else last_use.get(e, born[e])) for e in born}
    bad = []
    for a in span:
        for b in span:
            if a < b and sids[a] == sids[b]:
                (s1, e1), (s2, e2) = span[a], span[b]
                if s1 <= e2 and s2 <= e1:  # outputs are placed before inputs are freed
                    bad.append((a, b))
    return bad


def _chain_graph(n: int) -> tuple[Graph, list[Function]]:
    """x → f0 → t0 → f1 → t1 ... → out, each 4x4 float32, built directly."""
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["out"]
    tensors = {t: TensorInfo((4, 4), "float32") for t in names}
    graph = Graph("g", ["x"], ["out"], [], tensors)
    fns = [Function(f"f{i}", [], [names[i]], [names[i + 1]]) for i in range(n)]
    return graph, fns


def test_graph_json_layout_and_storage_reuse():
    graph, fns = _chain_graph(4)
    doc = json.loads(graph_json(graph, fns, {}))
    parse_graph_json(json.dumps(doc))  # the executor's checker accepts it
    assert doc["nodes"][0] == {"op": "null", "name": "x", "inputs": []}
    assert doc["nodes"][1]["attrs"] == {"func_name": "f0", "flatten_data": "0", "num_inputs": "1",
                                        "num_outputs": "1"}
    assert doc["arg_nodes"] == [0] and doc["heads"] == [[4, 0, 0]]
    assert doc["attrs"]["shape"][0] == "list_shape" and doc["attrs"]["dltype"][1] == ["float32"] * 5
    sids = doc["attrs"]["storage_id"][1]
    assert len(set(sids)) < len(sids), "a chain must reuse storage"
    assert sids[0] not in sids[1:], "the model input keeps its storage"
    assert not _liveness_conflicts(doc)


def test_planner_prefers_the_closest_size():
    p = _Planner()
    small, big = p.fresh(100), p.fresh(1000)
    p.release(small)
    p.release(big)
    assert p.request(90) == small  # smaller than 100: would grow; 100 >= 90 fits best
    assert p.request(5000) == big and p.sizes[big] == 5000  # within x16: reused and grown
    assert p.request(10) not in (small, big)  # nothing free left


def test_real_model_plan_has_no_live_overlap():
    compiled = compile_onnx(small_cnn())
    assert not _liveness_conflicts(json.loads(compiled.graph_json))
    graph, fns = _chain_graph(3)
    doc = json.loads(graph_json(graph, fns, {}))
    doc["attrs"]["storage_id"][1] = [0] * 4  # everything in one buffer: the checker must object
    assert _liveness_conflicts(doc)


def test_module_tree_is_tvms_shape():
    tree = compile_onnx(small_cnn()).module_tree()
    assert tree.type_key == "GraphExecutorFactory" and tree.module_name == "default"
    (host,) = tree.imports
    (consts,) = host.imports
    assert (host.type_key, consts.type_key) == ("_lib", "const_loader")
    assert [m.type_key for m in consts.imports] == ["examplejson"]
    sym = "tvmgen_default_examplejson_main_0"
    assert consts.const_vars_by_symbol == {sym: [f"{sym}_const_{i}" for i in range(6)]}
    assert set(consts.arrays) == set(consts.const_vars_by_symbol[sym])


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_raw_blob_and_c_source(layout, tmp_path):
    compiled = compile_onnx(small_cnn())
    content = symbol_bytes(compiled.module_tree(), layout)
    assert struct.unpack("<Q", content[:8])[0] == len(content) - 8
    path = compiled.export_library(tmp_path / "m.blob", layout=layout)
    assert open(path, "rb").read() == content
    assert load_library(path).layout == layout
    symbol = "__tvm_dev_mblob" if layout == "classic" else "__tvm_ffi__library_bin"
    loc = find_in_c_source(memoryview(c_array_source(content, symbol).encode()))
    assert loc.buffer[loc.offset:loc.offset + loc.size] == content[8:]


@pytest.mark.parametrize("fmt,layout", [("so", "classic"), ("so", "ffi"), ("tar", "classic")])
def test_shared_library_and_tar_load_and_run(fmt, layout, tmp_path):
    need_program("cc")
    model = small_cnn()
    compiled = compile_onnx(model)
    feed = sample_inputs(model)
    blob_out = run_compiled(compiled, feed, tmp_path)
    out = run_compiled(compiled, feed, tmp_path, name=f"m.{fmt}", layout=layout)
    np.testing.assert_array_equal(out[0], blob_out[0])
    lib = load_library(str(tmp_path / f"m.{fmt}"))
    assert lib.layout == layout
    if fmt == "tar":
        with tarfile.open(tmp_path / "m.tar") as tar:
            assert tar.getnames() == ["devc.o"]


def test_tar_without_compiler_holds_devc_c(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    compiled = compile_onnx(chain_model())
    with pytest.raises(CompileError, match="no C compiler found"):
        compiled.export_library(tmp_path / "m.so")
    path = compiled.export_library(tmp_path / "m.tar")
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["devc.c"]
    assert load_library(path).root.type_key == "GraphExecutorFactory"


def test_cross_compiled_arm_library(tmp_path):
    cc = need_program("arm-linux-gnueabihf-gcc")
    path = compile_onnx(chain_model()).export_library(tmp_path / "m.so", cc=cc)
    lib = load_library(path)
    assert lib.container == "elf" and "ARM" in str(getattr(lib, "arch", "ARM"))


def test_missing_cross_compiler_is_a_clear_error(tmp_path):
    with pytest.raises(CompileError, match="C compiler 'no-such-cc' not found"):
        compile_onnx(chain_model()).export_library(tmp_path / "m.so", cc="no-such-cc")


def test_constant_output_becomes_a_param(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [("x", [2])], [("y", [2]), ("k", [3])], {"k": np.arange(3, dtype="float32")})
    compiled = compile_onnx(model)
    assert list(compiled.params) == ["k"]
    out = run_compiled(compiled, {"x": np.array([-1, 2], "float32")}, tmp_path)
    np.testing.assert_array_equal(out[0], [0, 2])
    np.testing.assert_array_equal(out[1], [0, 1, 2])
