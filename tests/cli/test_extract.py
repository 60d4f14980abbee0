"""``rpcsrv extract``: every part of a library as files; extract → our exporter rebuilds the same library."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

from rpcsrv.client.compiler import compile_onnx
from rpcsrv.client.demo_models import sample_inputs, small_cnn
from rpcsrv.client.export import export_library
from rpcsrv.extract import extract_library
from rpcsrv.loader.examplejson import split_examplejson
from rpcsrv.loader import (
    ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, UnknownModule,
    build_blob, load_library, load_param_dict,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import run_in_process  # noqa: E402  (the executor in-process)


def rebuild(folder: Path):
    """The module tree described by an extract folder, from its plain files (not its raw payloads)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    made = {}
    for entry in sorted(manifest["modules"], key=lambda e: -e["index"]):  # children first
        imports = [made[i] for i in entry["imports"]]
        key = entry["type_key"]
        if key == "GraphExecutorFactory":
            params = load_param_dict((folder / entry["params"]).read_bytes())
            mod = GraphExecutorFactoryModule((folder / entry["graph_json"]).read_text(), dict(params),
                                             entry["module_name"], imports=imports)
        elif key == "examplejson":
            code = "".join((folder / p).read_text() for p in entry["subgraphs"])
            mod = ExampleJSONModule(code, imports=imports)
        elif key == "const_loader":
            with np.load(folder / entry["constants"]) as z:
                arrays = {k: z[k] for k in z.files}
            mod = ConstLoaderModule(arrays, entry["const_vars_by_symbol"], imports=imports)
        elif key == "_lib":
            symbols = (folder / "host_symbols.txt").read_text().split()
            mod = HostLibraryModule(symbols, imports=imports)
        else:
            mod = UnknownModule(type_key=key, payload=(folder / entry["payload"]).read_bytes(), imports=imports)
        made[entry["index"]] = mod
    return made[0]


def test_extract_then_export_rebuilds_the_same_library(tmp_path):
    model = small_cnn()
    lib = tmp_path / "cnn.so"
    compile_onnx(model).export_library(str(lib))
    out = tmp_path / "parts"
    manifest = extract_library(str(lib), str(out))
    kinds = {f["path"].split("/")[0] for f in manifest["files"]}
    assert kinds == {"payloads", "graph", "examplejson", "constants", "host_symbols.txt"}
    assert all((out / f["path"]).is_file() and f["what"] for f in manifest["files"])
    rebuilt = tmp_path / "rebuilt.blob"
    export_library(rebuild(out), str(rebuilt))
    original = load_library(str(lib))
    again = load_library(str(rebuilt))
    assert build_blob(again.root) == build_blob(original.root)  # byte for byte the same blob
    feed = sample_inputs(model)
    for a, b in zip(run_in_process(str(lib), feed, 1), run_in_process(str(rebuilt), feed, 1)):
        np.testing.assert_array_equal(a, b)


def test_payloads_are_the_bytes_in_the_file(tmp_path):
    """A vendor module rpcsrv cannot decode (tvm-ffi layout) comes out exactly as written, and the
    ExampleJSON payload is the dmlc string TVM's SaveToBinary writes (u64 length, then the text)."""
    secret = bytes(range(256)) * 3 + b"vendor"
    code = "sg_0\n  input 0 2\n  relu 1 inputs: 0 shape: 2\n"
    tree = HostLibraryModule([], imports=[ExampleJSONModule(code), UnknownModule(type_key="my_npu", payload=secret)])
    lib = tmp_path / "v.blob"
    export_library(tree, str(lib), layout="ffi")
    manifest = extract_library(str(lib), str(tmp_path / "x"))
    by_key = {f["type_key"]: (tmp_path / "x" / f["path"]).read_bytes() for f in manifest["files"] if "type_key" in f}
    assert by_key["my_npu"] == secret
    assert by_key["examplejson"] == struct.pack("<Q", len(code)) + code.encode()
    only = extract_library(str(lib), str(tmp_path / "y"), only="my_npu")
    assert [f["path"] for f in only["files"]] == ["payloads/01_my_npu.bin"]


def test_split_examplejson_keeps_each_subgraph():
    code = "a\n  input 0 2\n  relu 1 inputs: 0 shape: 2\n  output 1\nb\n  input 0 1\n  neg 1 inputs: 0 shape: 1\n"
    parts = split_examplejson(code)
    assert [n for n, _ in parts] == ["a", "b"]
    assert "".join(t for _, t in parts) == code


def test_cli_extract_and_bad_only(tmp_path):
    lib = tmp_path / "cnn.blob"
    compile_onnx(small_cnn()).export_library(str(lib))
    ok = subprocess.run([sys.executable, "-m", "rpcsrv", "extract", str(lib), "-o", str(tmp_path / "o")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "manifest.json" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "rpcsrv", "extract", str(lib), "-o", str(tmp_path / "p"),
                          "--only", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "rpcsrv: error: the library has no module of type key 'nope' "
        "(it has: GraphExecutorFactory, _lib, const_loader, examplejson)"]
