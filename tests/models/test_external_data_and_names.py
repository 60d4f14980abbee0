"""ONNX external data is read relative to the model file; the model's output names survive
compilation (graph JSON metadata), ``rpcsrv inspect`` and ``byoc run``'s npz."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from rpcsrv.client.compiler import CompileError, compile_onnx
from rpcsrv.client.demo_models import sample_inputs, small_cnn
from rpcsrv.loader.inspect import inspect_library

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import run_in_process  # noqa: E402  (the executor in-process)


def test_external_data_is_found_beside_the_model_from_any_folder(tmp_path, monkeypatch):
    model = small_cnn()
    folder = tmp_path / "models"
    folder.mkdir()
    onnx.save(model, folder / "cnn.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="cnn.weights", size_threshold=0)
    assert (folder / "cnn.weights").stat().st_size > 1000
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    compiled = compile_onnx(str(folder / "cnn.onnx"))
    lib = str(tmp_path / "cnn.blob")
    compiled.export_library(lib)
    feed = sample_inputs(model)
    reference = str(tmp_path / "ref.blob")
    compile_onnx(small_cnn()).export_library(reference)  # (onnx.save made `model` external)
    np.testing.assert_array_equal(run_in_process(lib, feed, 1)[0], run_in_process(reference, feed, 1)[0])


def test_missing_external_data_file_is_named(tmp_path):
    onnx.save(small_cnn(), tmp_path / "cnn.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    os.remove(tmp_path / "w.bin")
    with pytest.raises(CompileError, match="keeps its data in 'w.bin'"):
        compile_onnx(str(tmp_path / "cnn.onnx"))


def test_output_names_in_graph_json_and_inspect(tmp_path):
    compiled = compile_onnx(small_cnn())
    doc = json.loads(compiled.graph_json)
    assert list(doc)[-1] == "metadata"  # TVM's reader stops at this key: it must be last
    assert doc["metadata"]["output_names"] == ["probs"]
    lib = tmp_path / "cnn.blob"
    compiled.export_library(str(lib))
    (factory,) = [m for m in inspect_library(str(lib))["modules"] if "graph" in m]
    assert [o["name"] for o in factory["graph"]["outputs"]] == ["probs"]
    shown = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(lib)], capture_output=True, text=True)
    assert "output probs: float32[1, 10]" in shown.stdout
