"""The nine model-zoo architectures the ``onnx`` wheel ships (``onnx/backend/test/data/light/``, opset 9:
old Dropout with a mask output, old Softmax's 2-D view, ...) compile, run on rpcsrv through the real
TVM client (apache-tvm: ``lib["default"](dev)``, ``m["set_input"]``, ``m["run"]``, ``m["get_output"]``)
and match onnxruntime.

The light models fill every weight with one value (``ConstantOfShape`` 0.02), which makes many
mistakes invisible (a uniform softmax looks right whatever the axis).  So each fill is also replaced
by varied values (``zoo_weights.varied``): the same architecture and opset, with numbers that tell
wrong arithmetic apart.  Compiled libraries are cached per session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from rpcsrv.client.compiler import compile_onnx
from conftest import need_module
from zoo_weights import varied

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512"]


def test_all_nine_architectures_are_there():
    assert sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx")) == MODELS


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("light-zoo")


def _compiled(zoo_dir: Path, name: str) -> tuple[Path, onnx.ModelProto, str]:
    """(library, the varied model, its input name); compiled once per session."""
    model = varied(onnx.load(str(LIGHT / f"light_{name}.onnx")))
    lib = zoo_dir / f"{name}.blob"
    if not lib.exists():
        compiled = compile_onnx(model)
        compiled.export_library(str(lib))
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i.name for i in model.graph.input if i.name not in inits]
    return lib, model, inp


@pytest.mark.parametrize("name", MODELS)
def test_light_model_compiles_as_shipped(name):
    compiled = compile_onnx(str(LIGHT / f"light_{name}.onnx"))
    assert compiled.subgraphs and compiled.input_names


@pytest.mark.tvm
@pytest.mark.parametrize("name", MODELS)
def test_light_model_over_rpc_matches_onnxruntime(name, server, zoo_dir):
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    ort = need_module("onnxruntime")
    lib, model, inp = _compiled(zoo_dir, name)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the light models carry unused initializers ort warns about
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {inp: x})
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(lib))
    dev = sess.cpu(0)
    m = sess.load_module(lib.name)["default"](dev)
    m["set_input"](inp, tvm.runtime.tensor(x, dev))
    m["run"]()
    assert m["get_num_outputs"]() == len(want)
    for i, w in enumerate(want):
        got = m["get_output"](i).numpy()
        assert got.shape == w.shape and got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(w).max())))
