"""How run plans fail (``kernels/plans.py``, ``plan_support``'s contract): a step no plan takes gives None
(``NotPlannable`` included) and no log; a planner's own error gives None too (the board runs the table kernel),
is logged once per op and error type, and fails the test it happened in (tests/conftest.py); a sweep of bad
attribute values and odd shapes over every planner finds no error but ``NotPlannable``."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PLAN_LOGGER, need_program
from rpcsrv.executor.kernels import KERNELS, plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.plan_support import NotPlannable, attribute_values
from rpcsrv.loader.opset import OPS

F32 = np.dtype(np.float32)
RNG = np.random.default_rng(7)


@pytest.fixture
def c_kernels(monkeypatch):
    need_program("cc", "plans call the compiled kernels, built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    compiled.reset()
    assert compiled.status()["in_use"], compiled.status()
    yield
    compiled.reset()


def test_the_plans_logger_is_the_one_the_suite_watches():
    assert plans.LOG.name == PLAN_LOGGER


def test_not_plannable_is_no_plan_and_no_log(monkeypatch, no_plan_bugs):
    def planner(*_args):
        with attribute_values():
            int("four")

    monkeypatch.setitem(plans.PLANNERS, "test_op", planner)
    assert plans.plan("test_op", None, {}, [], (1,), np.float32) is None
    monkeypatch.setitem(plans.PLANNERS, "test_op", lambda *_args: (_ for _ in ()).throw(NotPlannable("no")))
    assert plans.plan("test_op", None, {}, [], (1,), np.float32) is None
    assert no_plan_bugs == []


def test_a_planners_own_error_is_no_plan_logged_once(monkeypatch, no_plan_bugs):
    def buggy(*_args):
        raise IndexError("a bug in the plan")

    monkeypatch.setitem(plans.PLANNERS, "test_op", buggy)
    monkeypatch.setattr(plans, "_reported", set())
    assert plans.plan("test_op", None, {}, [], (1,), np.float32) is None
    assert plans.plan("test_op", None, {}, [], (1,), np.float32) is None
    assert [r.levelname for r in no_plan_bugs] == ["ERROR"]
    assert "test_op" in no_plan_bugs[0].getMessage() and "IndexError: a bug in the plan" in no_plan_bugs[0].getMessage()
    assert no_plan_bugs[0].exc_info[0] is IndexError  # the traceback is in the log
    no_plan_bugs.clear()  # provoked on purpose: not a failure of this test


def test_an_error_in_the_plans_own_code_is_not_taken_for_an_attribute(monkeypatch):
    """``attribute_values`` is for reading attribute values: an error outside it is not ``NotPlannable``."""
    with pytest.raises(NotPlannable):
        with attribute_values():
            float("x")
    with pytest.raises(KeyError):
        with attribute_values():
            {}["missing"]


def _spec(*shape):
    return tuple(shape), F32


def _arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


#: op -> (attributes, inputs, shape) of steps that plan (each planner's paths), varied below
CASES = {
    "conv": [({"group": 4, "pads": [1, 1, 1, 1]}, [_spec(1, 4, 6, 6), _arr(4, 1, 3, 3), _arr(4)], (1, 4, 6, 6)),
             ({"pads": [1, 1, 1, 1]}, [_spec(1, 3, 16, 16), _arr(8, 3, 3, 3), _arr(8)], (1, 8, 16, 16)),
             ({}, [_spec(1, 4, 6, 6), _arr(8, 4, 1, 1), _arr(8)], (1, 8, 6, 6)),
             ({"strides": [2, 2]}, [_spec(1, 4, 9, 9), _arr(8, 4, 5, 5), _arr(8)], (1, 8, 3, 3)),
             ({"input_shuffle": 2}, [_spec(1, 4, 6, 6), _arr(8, 4, 1, 1)], (1, 8, 6, 6)),
             ({"pads": [1, 1, 1, 1]}, [_spec(1, 32, 28, 28), _arr(32, 32, 3, 3)], (1, 32, 28, 28))],
    "scaled_residual_conv": [({}, [_spec(1, 4, 6, 6), _spec(1, 4, 1, 1), _arr(8, 4, 1, 1), _arr(8), _spec(1, 8, 6, 6)],
                              (1, 8, 6, 6))],
    "max_pool": [({"kernel_shape": [2, 2], "strides": [2, 2]}, [_spec(1, 2, 8, 8)], (1, 2, 4, 4))],
    "average_pool": [({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [_spec(1, 2, 8, 8)], (1, 2, 8, 8))],
    "global_average_pool": [({}, [_spec(1, 2, 8, 8)], (1, 2, 1, 1))],
    "reduce_mean": [({"axes": [2, 3]}, [_spec(1, 2, 8, 8)], (1, 2, 1, 1))],
    "softmax": [({"axis": -1}, [_spec(2, 8)], (2, 8))],
    "hard_sigmoid": [({"alpha": 0.2}, [_spec(2, 8)], (2, 8))],
    "add": [({}, [_spec(1, 4, 6, 6), _arr(4, 1, 1)], (1, 4, 6, 6))],
    "matmul": [({"activation": "relu"}, [_spec(16, 8), _arr(8, 6), _arr(6)], (16, 6))],
    "gemm": [({"transB": 1}, [_spec(1, 8), _arr(6, 8), _arr(6)], (1, 6))],
    "flatten": [({"axis": 1}, [_spec(1, 4, 6, 6)], (1, 144))],
    "layer_normalization": [({"axis": -1}, [_spec(2, 8), _arr(8), _arr(8)], (2, 8))],
}
#: attribute values of every kind a text or a JSON graph may carry
BAD = [None, "x", [], [0], [0, 0], [-1, -1], [1, 2, 3], [[1, 2]], [1.5, 2.5], [3.0, 3.0], -1, 0, 2.5, float("inf"),
       float("nan"), True, {"a": 1}, {"min": "x"}, ["min"], 10**30, "SAME_UPPER", "VALID", "clip"]


@pytest.mark.parametrize("op", list(CASES))
def test_bad_attributes_and_shapes_are_no_plan_never_a_plan_error(op, c_kernels, no_plan_bugs):
    """Every planner, its steps' attributes replaced one at a time by values of every kind, and each declared
    size made 0, 1 or 7: no plan or a plan, and no error other than ``NotPlannable`` (the fixture fails the
    test on a logged one)."""
    kernel = KERNELS["conv" if op.endswith("conv") else op]
    names = sorted(set(OPS["conv" if op.endswith("conv") else op].attrs) | {"activation", "activation_attrs"})
    for attrs, inputs, shape in CASES[op]:
        assert plans.plan(op, kernel, attrs, inputs, shape, F32) is not None, (op, attrs)  # the sweep's base
        for name in names:
            for value in BAD:
                plans.plan(op, kernel, {**attrs, name: value}, inputs, shape, F32)
        for k in range(len(shape)):
            for size in (0, 1, 7):
                plans.plan(op, kernel, attrs, inputs, shape[:k] + (size,) + shape[k + 1:], F32)
        for i, spec in enumerate(inputs):
            if isinstance(spec, tuple):
                for k in range(len(spec[0])):
                    for size in (0, 1, 3):
                        odd = (spec[0][:k] + (size,) + spec[0][k + 1:], spec[1])
                        plans.plan(op, kernel, attrs, inputs[:i] + [odd] + inputs[i + 1:], shape, F32)
    assert no_plan_bugs == []
