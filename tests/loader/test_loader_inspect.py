"""``rpcsrv inspect``: the JSON summary and the text report of a library."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np

from conftest import REPO
from rpcsrv.loader import (
    ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob,
)
from rpcsrv.loader.examplejson import summarize_examplejson
from rpcsrv.loader.inspect import format_inspection, inspect_library

GRAPH = {
    "nodes": [{"op": "null", "name": "data", "inputs": []},
              {"op": "null", "name": "w", "inputs": []},
              {"op": "tvm_op", "name": "tvmgen_default_examplejson_main_0", "inputs": [[0, 0, 0], [1, 0, 0]],
               "attrs": {"func_name": "tvmgen_default_examplejson_main_0", "num_inputs": "2",
                         "num_outputs": "1", "flatten_data": "0"}},
              {"op": "tvm_op", "name": "tvmgen_default_fused_nn_relu", "inputs": [[2, 0, 0]],
               "attrs": {"func_name": "tvmgen_default_fused_nn_relu", "num_inputs": "1",
                         "num_outputs": "1", "flatten_data": "0"}}],
    "arg_nodes": [0, 1], "heads": [[3, 0, 0]], "node_row_ptr": [0, 1, 2, 3, 4],
    "attrs": {"storage_id": ["list_int", [0, 1, 2, 3]],
              "shape": ["list_shape", [[1, 8], [8, 8], [1, 8], [1, 8]]],
              "dltype": ["list_str", ["float32", "float32", "float32", "float32"]]},
}
CODE = """tvmgen_default_examplejson_main_0
  input 0 1 8
  const 1 8 8 dtype: float32 name: w_const
  mat_mul 2 inputs: 0 1 shape: 1 8
  add 3 inputs: 2 0 shape: 1 8 attrs: {"x": 1}
  output 3
json_rt_1
  input 0 10 dtype: int64
  neg 1 inputs: 0 shape: 10 dtype: int64
"""


def library_bytes() -> bytes:
    ej = ExampleJSONModule(CODE)
    consts = ConstLoaderModule({"w_const": np.eye(8, dtype=np.float32)},
                               {"tvmgen_default_examplejson_main_0": ["w_const"]}, imports=[ej])
    root = GraphExecutorFactoryModule(json.dumps(GRAPH), {"w": np.zeros((8, 8), np.float32)},
                                      imports=[HostLibraryModule(imports=[consts])])
    blob = build_blob(root)
    return struct.pack("<Q", len(blob)) + blob


def test_summary_contents():
    info = inspect_library(library_bytes())
    assert json.loads(json.dumps(info)) == info  # JSON-serialisable as is
    assert (info["container"], info["layout"], info["blob"]["offset"]) == ("raw", "classic", 8)
    keys = [(m["type_key"], m["imports"]) for m in info["modules"]]
    assert keys == [("GraphExecutorFactory", [1]), ("_lib", [2]), ("const_loader", [3]), ("examplejson", [])]
    graph = info["modules"][0]["graph"]
    assert graph["inputs"] == [{"name": "data", "shape": [1, 8], "dtype": "float32"}]
    assert graph["outputs"][0]["shape"] == [1, 8]
    assert [op["func_name"] for op in graph["ops"]] == ["tvmgen_default_examplejson_main_0",
                                                         "tvmgen_default_fused_nn_relu"]
    assert graph["params"] == [{"name": "w", "shape": [8, 8], "dtype": "float32", "nbytes": 256}]
    consts = info["modules"][2]
    assert consts["const_vars_by_symbol"] == {"tvmgen_default_examplejson_main_0": ["w_const"]}
    sub = info["modules"][3]["subgraphs"]
    assert [s["name"] for s in sub] == ["tvmgen_default_examplejson_main_0", "json_rt_1"]
    assert sub[0]["ops"] == {"mat_mul": 1, "add": 1} and sub[0]["consts"] == ["w_const"]
    assert sub[0]["outputs"] == ["3"]
    assert sub[1]["inputs"] == [{"id": "0", "shape": [10], "dtype": "int64"}]


def test_text_report():
    text = format_inspection(inspect_library(library_bytes()))
    for needle in ("raw", "classic layout", "input  data: float32[1, 8]",
                   "-> tvmgen_default_fused_nn_relu", "w: float32[8, 8] 256 bytes",
                   "tvmgen_default_examplejson_main_0 needs ['w_const']", "json_rt_1"):
        assert needle in text, needle


def test_bad_graph_json_is_reported_not_fatal():
    root = GraphExecutorFactoryModule("[not json", {})
    blob = build_blob(root)
    info = inspect_library(struct.pack("<Q", len(blob)) + blob)
    assert "graph JSON not understood" in info["modules"][0]["graph"]["graph_error"]


def test_seed_examplejson():
    seed = ("subgraph_0\n  input 0 10 10\n  input 1 10 10\n  add 4 inputs: 0 1 shape: 10 10\n"
            "  sub 5 inputs: 4 1 shape: 10 10\n")
    (sg,) = summarize_examplejson(seed)
    assert sg["name"] == "subgraph_0" and sg["nodes"] == 2 and len(sg["inputs"]) == 2


def test_cli(tmp_path):
    path = tmp_path / "model.blob"
    path.write_bytes(library_bytes())
    run = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(path), "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["modules"][0]["type_key"] == "GraphExecutorFactory"
    path.write_bytes(library_bytes()[:40])
    run = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(path)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 2 and "offset" in run.stderr
