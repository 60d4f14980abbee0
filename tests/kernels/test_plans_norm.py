"""The LayerNormalization plan (``plans_norm``, ``norm.c``): against ``onnx.reference`` on odd row lengths (the
vector loops' tails), 2-D to 4-D inputs, with and without bias, other epsilons, NaN and inf rows; no plan for
other axes or attributes; inputs the plan was not made for and the kernels turned off run the table kernel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import test_plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.norm.norm import layer_normalization

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use


def reference(x, scale, b=None, **attrs):
    """Y of ONNX LayerNormalization (opset 17) by onnx.reference, in float64."""
    names = ["x", "s"] + ([] if b is None else ["b"])
    node = helper.make_node("LayerNormalization", names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.DOUBLE, None)
                                            for n in names],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = dict(zip(names, (v.astype(np.float64) for v in (x, scale, b) if v is not None)))
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _plan(x, scale, b, **attrs):
    inputs = [(x.shape, x.dtype), scale] + ([] if b is None else [b])
    return plans.plan("layer_normalization", layer_normalization, attrs, inputs, x.shape, np.float32)


CASES = [((1, 128, 256), {}), ((2, 5, 37), {"epsilon": 1e-3}), ((3, 17), {"axis": 1}), ((2, 3, 4, 9), {}),
         ((4, 1), {}), ((6, 64), {"axis": -1, "epsilon": 1e-12, "stash_type": 1})]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("bias", [False, True])
def test_planned_layer_normalization_matches_onnx_reference(case, bias, c_kernels):
    shape, attrs = case
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = (3 * rng.standard_normal(shape) + 1).astype(np.float32)
    scale = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32) if bias else None
    fn = _plan(x, scale, b, **attrs)
    assert fn is not None and fn.__name__ == "layer_normalization"
    got = fn(x, scale, b)
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, reference(x, scale, b, **attrs), rtol=1e-4, atol=1e-5)


def test_nan_and_inf_rows_stay_in_their_rows(c_kernels):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    x[1, 7], x[2, 39] = np.nan, np.inf
    scale, b = np.ones(40, np.float32), np.zeros(40, np.float32)
    got = _plan(x, scale, b)(x, scale, b)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()  # as numpy's kernel (inf - inf)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.isnan(layer_normalization(x, scale, b)[0]), np.isnan(got))
    np.testing.assert_allclose(got[[0, 3]], reference(x[[0, 3]], scale, b), rtol=1e-4, atol=1e-5)


def test_unplanned_layer_normalizations(c_kernels):
    x = np.zeros((2, 3, 8), np.float32)
    s8, s24 = np.ones(8, np.float32), np.ones((3, 8), np.float32)
    assert _plan(x, s24, None, axis=1) is None  # over more than the last axis
    assert _plan(x, s8, None, stash_type=0) is None
    assert plans.plan("layer_normalization", layer_normalization, {}, [(x.shape, x.dtype), (s8.shape, s8.dtype)],
                      x.shape, np.float32) is None  # a computed scale
    assert plans.plan("layer_normalization", layer_normalization, {}, [(x.shape, np.float64), s8.astype(np.float64)],
                      x.shape, np.float64) is None


def test_other_inputs_and_kernels_turned_off_run_the_table_kernel(c_kernels, monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 33)).astype(np.float32)
    scale, b = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    fn = _plan(x, scale, b)
    want = reference(x, scale, b)
    got = fn(np.asfortranarray(x), scale, b)  # not C-contiguous: the table kernel's (Y, Mean, InvStdDev)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
    s2 = scale * 2
    np.testing.assert_allclose(fn(x, s2, b)[0], reference(x, s2, b), rtol=1e-4, atol=1e-5)
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    assert compiled.library() is None
    np.testing.assert_allclose(fn(x, scale, b)[0], want, rtol=1e-4, atol=1e-5)
    assert _plan(x, scale, b) is None
