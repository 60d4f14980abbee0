"""Runs of int8 steps as one step (``examplejson/qchain_fold.py``, ``kernels/quant/qchain.py``, ``qchain.c``).

onnxruntime-quantized CNNs (``bench/quant_models.py``, small sizes: QDQ and QOperator, per tensor and per
channel, uint8 and int8 activations) load with their int8 steps joined into a few steps, and give the very
integers the steps give one by one (the run with a step hook, which takes them one by one) and onnxruntime's
within one step; a call whose input is not what the run was made for takes the steps one by one; the arena's
offsets never overlap two buffers that are live at once; a run is cut where a result is read outside it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module, need_program

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

need_module("onnx", "builds the models")
ort = need_module("onnxruntime", "quantizes the models and is the reference")
import quant_models  # noqa: E402

from rpcsrv.client.compiler import compile_onnx  # noqa: E402
from rpcsrv.executor.examplejson import qchain_fold  # noqa: E402
from rpcsrv.executor.kernels.quant import qchain  # noqa: E402

CASES = [("resnet18", "qdq", True, "QUInt8"), ("resnet18", "qoperator", False, "QInt8"),
         ("mobilenetv2", "qdq", False, "QInt8"), ("mobilenetv2", "qoperator", True, "QUInt8")]


def _loaded(case, tmp_path):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    name, fmt, pc, act = case
    fm = quant_models.float_model(name, small=True)
    model = quant_models.quantized(fm, fmt, pc, act)
    lib = tmp_path / "m.so"
    compile_onnx(model).export_library(str(lib))
    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    feeds = quant_models.inputs_of(fm, seed=3)
    for key, value in feeds.items():
        ex.get_function("set_input")(key, value)
    return model, ex, feeds, [fn for fn in ex._functions.values() if hasattr(fn, "_stepwise")]


def _run(ex, hook=None):
    from rpcsrv.executor import module

    token = module.STEP_HOOK.set(hook) if hook else None
    try:
        ex.get_function("run")()
    finally:
        if token is not None:
            module.STEP_HOOK.reset(token)
    return ex.get_function("get_output")(0).copy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_int8_runs_join_and_give_the_steps_integers(case, tmp_path):
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    model, ex, feeds, fns = _loaded(case, tmp_path)
    joined = [s for fn in fns for s in fn.steps if hasattr(s[1], "chain")]
    stepwise = sum(len(fn._stepwise) for fn in fns)
    assert joined and sum(len(fn.steps) for fn in fns) <= 6 < stepwise, [s[0].op for fn in fns for s in fn.steps]
    seen = []
    got, one_by_one = _run(ex), _run(ex, hook=lambda *a: seen.append(a[1].op))
    assert len(seen) == stepwise  # the hooked run took the steps one by one
    np.testing.assert_array_equal(got, one_by_one)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    step = quant_models.output_step(model) or 1e-3 * float(np.abs(want).max())
    assert (np.abs(got.astype(np.float64) - want) <= step * 1.001).mean() >= 0.99


def test_an_input_the_run_was_not_made_for_takes_the_steps_one_by_one(tmp_path):
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    _, ex, feeds, fns = _loaded(CASES[0], tmp_path)
    fn = fns[0]
    node, run = next((s[0], s[1]) for s in fn.steps if hasattr(s[1], "chain"))
    (x,) = feeds.values()
    x = np.asarray(x, np.float32)
    assert run.chain.fits((x,)) and node.inputs == (fn.graph.inputs[0].id,)
    strided = np.asfortranarray(x)  # the same values, not C-contiguous: not what the run was made for
    assert not run.chain.fits((strided,))
    np.testing.assert_array_equal(np.asarray(run(strided)), np.asarray(run(x)))


def test_arena_offsets_never_overlap_live_buffers():
    rng = random.Random(5)
    for _ in range(200):
        count = rng.randint(1, 12)
        writes = list(range(count))
        last = {k: rng.randint(k, count) for k in writes if rng.random() < 0.9}  # (count: read by nobody inside)
        sizes = {k: 64 * rng.randint(1, 9) for k in writes}
        offsets, size = qchain._offsets(writes, last, count - 1, sizes)
        for a in writes[:-1]:
            assert 0 <= offsets[a] and offsets[a] + sizes[a] <= size
            for b in writes[:-1]:
                if a < b <= last.get(a, a):  # a still to be read when b is written
                    assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)


def test_a_run_is_cut_where_a_result_is_read_outside_it():
    class N:
        def __init__(self, nid, inputs):
            self.id, self.inputs = nid, inputs

    # steps 0..4 linkable; 5 reads step 1's result, step 3's reads step 0's
    steps = [(N(10, (1,)),), (N(11, (10,)),), (N(12, (11,)),), (N(13, (12, 10)),), (N(14, (13,)),), (N(15, (11,)),)]
    parts = qchain_fold._parts([0, 1, 2, 3, 4], steps, outputs=[14])
    assert parts == [[0], [1], [2, 3, 4]]  # 1 is read by 5; then 0 by 3, in another part
    assert qchain_fold._parts([0, 1, 2, 3, 4], steps, outputs=[12]) == [[0], [1], [2], [3, 4]]
