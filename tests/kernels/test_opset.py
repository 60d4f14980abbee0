"""The op catalogue (``rpcsrv.loader.opset``) against the kernels bound to it and against ONNX's cases.

* binding: every entry has exactly one kernel, whose signature agrees with it; a kernel without an
  entry, or one that disagrees, fails when it is registered;
* the declared dtype rules are the kernels' own: a "float" op refuses integers, a "same" op mixed dtypes;
* every attribute value and input count in ONNX's node conformance cases passes the catalogue's
  checks, except the values the board refuses on purpose (which it names).
"""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels import KERNELS, register
from rpcsrv.executor.kernels import registry
from rpcsrv.loader.opset import OPS, REQUIRED, Attr, OpSpec, node_problems, onnx_op_to_kernel


def test_every_entry_has_its_kernel_and_every_kernel_its_entry():
    assert set(KERNELS) == set(OPS)
    assert all(KERNELS[name].spec is OPS[name] for name in OPS)


def test_a_kernel_without_an_entry_fails_at_registration():
    with pytest.raises(ValueError, match="no entry in the op catalogue"):
        register("frobnicate")(lambda x: x)


@pytest.mark.parametrize("fn, message", [
    (lambda a, b, *, fmod=0: a, "attributes"),  # add has no attribute
    (lambda a: a, "inputs"),  # add has two inputs
    (lambda a, b=None: a, "inputs"),  # ... both required
    (lambda *xs: xs, "inputs"),
    (lambda a, b, **attrs: a, "kwargs"),
])
def test_a_kernel_that_disagrees_with_its_entry_is_named(fn, message):
    problems = registry._signature_problems(fn, OPS["add"])
    assert problems and message in " ".join(problems)


def test_defaults_must_agree():
    def leaky(x, *, alpha=0.02):
        return x

    assert "defaults to 0.02" in " ".join(registry._signature_problems(leaky, OPS["leaky_relu"]))

    def cast(x, *, to=1, saturate=1, round_mode="up"):
        return x

    assert "to defaults" in " ".join(registry._signature_problems(cast, OPS["cast"]))  # `to` is required


def test_an_entry_without_a_kernel_fails_the_import_check(monkeypatch):
    monkeypatch.setitem(OPS, "frobnicate", OpSpec("frobnicate", ("x",), ("y",)))
    with pytest.raises(ImportError, match="frobnicate"):
        registry.check_complete()


FLOAT_ONLY = sorted(n for n, s in OPS.items() if s.dtypes == "float")
SAME = sorted(n for n, s in OPS.items() if s.dtypes.startswith("same"))


@pytest.mark.parametrize("name", FLOAT_ONLY)
def test_float_rule_is_the_kernels_own(name):
    assert node_problems(name, {}, [True], ["int32"])  # the compiler refuses ...
    with pytest.raises(ValueError, match="floating-point"):  # ... what the kernel refuses
        KERNELS[name](np.arange(3, dtype=np.int32))


@pytest.mark.parametrize("name", SAME)
def test_same_dtype_rule_is_the_kernels_own(name):
    spec = OPS[name]
    n = max(spec.required_inputs, 2)
    which = spec.same_dtype_inputs() or list(range(n))
    args = [np.ones(3, np.float32) for _ in range(n)]
    args[which[-1]] = np.ones(3, np.float64)
    if name == "where":
        args[0] = np.ones(3, bool)
    dtypes = [a.dtype.name for a in args]
    assert any("share one dtype" in p for p in node_problems(name, {}, [True] * n, dtypes))
    with pytest.raises(ValueError, match="differ"):
        KERNELS[name](*args)


@pytest.mark.parametrize("name, attrs, inputs, expect", [
    ("resize", {"antialias": 1}, [True, False, True], "antialias=1 is not supported (antialiased"),
    ("batch_normalization", {"training_mode": 1}, [True] * 5, "training_mode=1 is not supported"),
    ("resize", {"mode": "bicubic"}, [True, False, True], "mode='bicubic' is not supported"),
    ("conv", {"stride": [2, 2]}, [True, True], "does not implement attribute(s) stride"),
    ("conv", {"group": "2"}, [True, True], "group must be an integer"),
    ("conv", {"activation": "nope"}, [True, True], "activation 'nope' is not a one-input op"),
    ("conv", {"activation": "add"}, [True, True], "activation 'add' is not a one-input op"),
    ("conv", {"activation": "clip", "activation_attrs": {"lo": 1}}, [True, True],
     "activation clip: does not implement attribute(s) lo"),
    ("conv", {"activation_attrs": {}}, [True, True], "activation_attrs given without activation"),
    ("concat", {}, [True], "attribute axis is required"),
    ("add", {}, [True], "takes 2 required input(s), got 1"),
    ("add", {}, [False, True], "required input(s) [0] absent"),
    ("conv", {}, [True] * 4, "up to 3 in all, got 4"),
    ("max", {}, [], "takes 1 required input(s) and up to any number in all, got 0"),
    ("frob", {}, None, "no op 'frob'"),
])
def test_problems_are_named(name, attrs, inputs, expect):
    problems = node_problems(name, attrs, inputs)
    assert any(expect in p for p in problems), problems


def test_what_the_board_takes_passes():
    assert node_problems("conv", {"pads": [1, 1, 1, 1], "activation": "clip",
                                  "activation_attrs": {"min": 0, "max": 6}}, [True, True, True]) == []
    assert node_problems("max", {}, [True] * 5) == []
    assert node_problems("clip", {}, [True, False, True]) == []  # an absent optional input in the middle
    assert node_problems("add", {}, [True, True, False]) == []  # trailing absent inputs are no inputs
    assert node_problems("constant_of_shape", {"value": [[1.5]], "dtype": "float16"}, [True]) == []
    assert node_problems("add", {}, [True, True], ["int64", "int64"]) == []


# -- against ONNX's node conformance cases (what the kernels are tested on)

REFUSED = {  # case name prefix -> the refusal the catalogue must give
    "test_batchnorm_epsilon_training_mode": "training_mode=1",
    "test_batchnorm_example_training_mode": "training_mode=1",
    "test_resize_downsample_scales_cubic_antialias": "antialias=1",
    "test_resize_downsample_scales_linear_antialias": "antialias=1",
    "test_resize_downsample_sizes_cubic_antialias": "antialias=1",
    "test_resize_downsample_sizes_linear_antialias": "antialias=1",
}


def _onnx_nodes():
    pytest.importorskip("onnx")
    from kernels_onnx_cases import _all_cases, attribute_value

    for case in _all_cases():
        for node in case.model.graph.node:
            if node.domain in ("", "ai.onnx") and onnx_op_to_kernel(node.op_type) in OPS:
                attrs = {a.name: attribute_value(a) for a in node.attribute}
                yield case.name, node, attrs


def test_the_catalogue_takes_every_onnx_case_but_the_refused_ones():
    wrong, refused, seen = [], {}, 0
    for name, node, attrs in _onnx_nodes():
        op = onnx_op_to_kernel(node.op_type)
        if node.op_type == "Split" and not {"split", "num_outputs"} & set(attrs) and len(node.input) < 2:
            attrs["num_outputs"] = len(node.output)  # as the compiler does
        problems = node_problems(op, attrs, [bool(i) for i in node.input])
        seen += 1
        if name in REFUSED:
            refused[name] = problems
        elif problems:
            wrong.append(f"{name} ({node.op_type}): {problems}")
    assert seen > 1000
    assert wrong == []
    assert set(refused) == set(REFUSED)
    for name, problems in refused.items():
        assert any(REFUSED[name] in p and "not supported" in p for p in problems), (name, problems)


def test_attr_kinds_are_known():
    with pytest.raises(ValueError, match="kind"):
        Attr("complex")
    assert Attr("int", REQUIRED).required and not Attr("int", None).required


@pytest.mark.parametrize("text, message", [
    ('g\n input 0 1 1 4 4\n const 1 4 name: s\n resize 2 inputs: 0 -1 1 shape: 1 1 2 2 attrs: {"antialias": 1}\n',
     r"line 4: op 'resize' \(node 2\): attribute antialias=1 is not supported"),
    ("g\n input 0 3 dtype: int32\n sqrt 1 inputs: 0 shape: 3 dtype: int32\n",
     r"line 3: op 'sqrt' \(node 1\): input x must be floating-point, got int32"),
    ("g\n input 0 3\n add 1 inputs: 0 shape: 3\n", r"takes 2 required input\(s\), got 1"),
    ('g\n input 0 3\n relu 1 inputs: 0 shape: 3 attrs: {"alpha": 0.1}\n', r"does not implement attribute\(s\) alpha"),
    ('g\n input 0 1 1 4 4\n max_pool 1 inputs: 0 shape: 1 1 2 2 attrs: {"kernel_shape": [2, 2], "output_index": 2}\n',
     r"output_index 2, but the op has 2 output\(s\)"),
    ('g\n input 0 2 2\n matmul 1 inputs: 0 0 shape: 2 2 attrs: {"activation": "softmx"}\n', "activation 'softmx'"),
])
def test_a_library_the_board_would_refuse_fails_when_loaded(text, message):
    from rpcsrv.executor import ExampleJSONError, ExampleJSONRuntime

    with pytest.raises(ExampleJSONError, match=message):
        ExampleJSONRuntime(text)
