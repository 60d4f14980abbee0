"""Models quantized by onnxruntime's own quantizer (``bench/quant_models.py``: ``quant_pre_process``, then
``quantize_static`` in the QDQ and QOperator formats, per tensor and per channel, uint8 and int8 activations, or
``quantize_dynamic``) compile with ``byoc compile`` (``client.compile_onnx``; the CLI once) and run through the
real apache-tvm client on ``rpcsrv serve``: ResNet- and MobileNetV2-style CNNs, a MiniLM-style encoder, and the
ResNet by ``quantize_dynamic`` too (DynamicQuantizeLinear + ConvInteger).  Their
outputs are within one quantization step of onnxruntime's on at least 99% of the elements, with the same classes.
Small sizes here; the real ones are in the benchmark (``bench/quant_bench.py``).

Locally (``load_module``), the board's fold and plans are checked too: every conv of a QDQ model becomes a
``q_linear_conv`` run by the compiled int8 kernels, and the dynamic MatMul chains one ``dynamic_quantize_matmul``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module, need_program, run_with_tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

onnx = need_module("onnx", "builds the models")
ort = need_module("onnxruntime", "quantizes the models and is the reference")
import quant_models  # noqa: E402

from rpcsrv.client.compiler import compile_onnx  # noqa: E402

CASES = [("resnet18", fmt, pc, act) for fmt in ("qdq", "qoperator") for pc in (False, True)
         for act in ("QUInt8", "QInt8")]
CASES += [("mobilenetv2", "qdq", False, "QUInt8"), ("mobilenetv2", "qdq", True, "QInt8"),
          ("mobilenetv2", "qoperator", True, "QUInt8"), ("mobilenetv2", "qoperator", False, "QInt8"),
          ("minilm", "dynamic", False, "QUInt8"), ("minilm", "dynamic", True, "QUInt8"),
          ("resnet18", "dynamic", False, "QUInt8")]  # DynamicQuantizeLinear + ConvInteger


def _id(case) -> str:
    name, fmt, pc, act = case
    return f"{name}-{fmt}-{'per_channel' if pc else 'per_tensor'}-{act}"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(quantized model, library path, inputs) per case, made once."""
    folder, cache = tmp_path_factory.mktemp("quantized"), {}

    def get(case):
        if case not in cache:
            name, fmt, pc, act = case
            fm = quant_models.float_model(name, small=True)
            model = quant_models.quantized(fm, fmt, pc, act)
            lib = folder / f"{_id(case)}.so"
            compile_onnx(model).export_library(str(lib))
            cache[case] = (model, lib, quant_models.inputs_of(fm, seed=9))
        return cache[case]

    return get


def _reference(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def check_close(model, got: np.ndarray, want: np.ndarray) -> None:
    """Within one quantization step of the output on >= 99% of the elements (a float output, as the dynamic
    format's: within 1e-3 of its range), and the same class per row."""
    assert got.shape == want.shape and got.dtype == want.dtype
    step = quant_models.output_step(model) or 1e-3 * float(np.abs(want).max())
    within = np.abs(got.astype(np.float64) - want) <= step * 1.001
    assert within.mean() >= 0.99, (within.mean(), float(np.abs(got - want).max()), step)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.tvm
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_quantized_model_over_rpc_matches_onnxruntime(case, made, server):
    model, lib, feeds = made(case)
    want = _reference(model, feeds)
    check_close(model, run_with_tvm(server, lib, feeds)[0], want)


def _steps(lib: Path):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    return ex, [s for fn in ex._functions.values() for s in getattr(fn, "_stepwise", ())]  # (before qchain_fold)


@pytest.mark.parametrize("case", [CASES[1], CASES[8], CASES[12]], ids=_id)
def test_the_board_folds_and_runs_the_int8_kernels(case, made):
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    model, lib, feeds = made(case)
    ex, steps = _steps(lib)
    ops = [s[0].op for s in steps]
    planned = {s[0].op for s in steps if getattr(s[1], "__module__", "").startswith("rpcsrv.executor.kernels.quant")}
    if case[0] == "minilm":
        assert "dynamic_quantize_matmul" in planned and "matmul_integer" not in ops, ops
    else:
        assert "conv" not in ops and "q_linear_conv" in planned, ops
        assert ops.count("dequantize_linear") == 1, ops  # the output's; every chain folded
    for name, value in feeds.items():
        ex.get_function("set_input")(name, value)
    ex.get_function("run")()
    check_close(model, ex.get_function("get_output")(0), _reference(model, feeds))


def test_byoc_compile_takes_a_qoperator_model(made, tmp_path):
    """The CLI on a QOperator file (com.microsoft ops: their shapes inferred by ``contrib_shapes``)."""
    model, _, _ = made(CASES[4])
    src = tmp_path / "q.onnx"
    onnx.save(model, str(src))
    assert any(n.domain == "com.microsoft" for n in model.graph.node)
    done = subprocess.run([sys.executable, "-m", "rpcsrv.client.cli", "compile", str(src), "-o",
                           str(tmp_path / "q.so")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "q.so").stat().st_size > 0
