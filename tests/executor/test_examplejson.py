"""The ExampleJSON runtime: the seed text unchanged, the documented extension, and bad input."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from conftest import SHARED
from exec_helpers import SEED
from rpcsrv.executor import ExampleJSONError, ExampleJSONRuntime, ExecutorError

rng = np.random.default_rng(0)


def rand(*shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def test_seed_text_runs_unchanged():
    mod = ExampleJSONRuntime(SEED)
    a, b, c, d = (rand(10, 10) for _ in range(4))
    out = np.zeros((10, 10), np.float32)
    assert mod.get_function("subgraph_0")(a, b, c, d, out) is None
    np.testing.assert_allclose(out, (a + b - c) * d, rtol=1e-6)


def test_seed_text_taken_from_the_byoc_guide_itself():
    # a cross-check against the guide's own text where the background documents sit beside the repo
    # (not copied into the repo: it is TVM's text); SEED above is the same block, always tested
    seeds = SHARED / "seeds"
    if not seeds.is_dir():
        pytest.skip(f"{seeds} not present (background documents); the SEED copy is tested above")
    text = next(seeds.glob("001_*.txt")).read_text(encoding="utf-8")
    start = text.index("\nsubgraph_0\n") + 1
    block = text[start:text.index("\n\n", start)]
    assert block.splitlines()[-1].strip() == "mul 6 inputs: 5 3 shape: 10 10"
    mod = ExampleJSONRuntime(block)
    a, b, c, d = (rand(10, 10) for _ in range(4))
    out = np.zeros((10, 10), np.float32)
    mod.get_function("subgraph_0")(a, b, c, d, out)
    np.testing.assert_allclose(out, (a + b - c) * d, rtol=1e-6)


def test_old_json_rt_header_and_several_subgraphs():
    text = SEED + "json_rt_1\n  input 0 3\n  input 1 3\n  sub 2 inputs: 0 1 shape: 3\n"
    mod = ExampleJSONRuntime(text)
    assert mod.get_function("json_rt_1") is not None and mod.get_function("nope") is None
    out = np.zeros(3, np.float32)
    mod.get_function("json_rt_1")(np.ones(3, np.float32), np.full(3, 4, np.float32), out)
    assert out.tolist() == [-3, -3, -3]


def test_extension_dtype_consts_outputs_and_comments():
    text = """
    # two outputs, an int32 graph and a named constant
    tvmgen_default_examplejson_main_0
      input 0 2 2 dtype: int32
      const 1 2 2 dtype: int32 name: w
      add 2 inputs: 0 1 shape: 2 2 dtype: int32
      mul 3 inputs: 2 0 shape: 2 2 dtype: int32 attrs: {}
      output 3 2
    """
    mod = ExampleJSONRuntime(text)
    sym = "tvmgen_default_examplejson_main_0"
    assert mod.const_names(sym) == ["w"] and mod.unbound(sym) == ["w"]
    w = np.array([[1, 2], [3, 4]], np.int32)
    mod.bind(sym, {"w": w, "other": np.zeros(1)}, "test")
    x = np.array([[5, 6], [7, 8]], np.int32)
    o0, o1 = np.zeros((2, 2), np.int32), np.zeros((2, 2), np.int32)
    mod.get_function(sym)(x, o0, o1)
    np.testing.assert_array_equal(o0, (x + w) * x)
    np.testing.assert_array_equal(o1, x + w)


def test_init_function_binds_constants_in_line_order():
    text = "f\n input 0 2\n const 1 2 name: a\n const 2 2 name: b\n sub 3 inputs: 1 2 shape: 2\n" \
           " add 4 inputs: 3 0 shape: 2\n"
    mod = ExampleJSONRuntime(text)
    assert mod.get_function("__init_f")([np.full(2, 5, np.float32), np.ones(2, np.float32)]) == 0
    out = np.zeros(2, np.float32)
    mod.get_function("f")(np.zeros(2, np.float32), out)
    assert out.tolist() == [4, 4]
    with pytest.raises(ExecutorError, match="2 constant"):
        mod.get_function("__init_f")([np.ones(2, np.float32)])


def test_multi_output_op_runs_once_and_absent_inputs_are_none():
    calls = []

    def split2(x, maybe, axis=0):
        calls.append(maybe)
        return tuple(np.split(x, 2, axis=axis))

    kernels = {"split": split2}
    text = ('g\n input 0 4\n split 1 inputs: 0 -1 shape: 2 attrs: {"axis": 0}\n'
            ' split 2 inputs: 0 -1 shape: 2 attrs: {"axis": 0, "output_index": 1}\n output 2 1\n')
    mod = ExampleJSONRuntime(text, kernels)
    hi, lo = np.zeros(2, np.float32), np.zeros(2, np.float32)
    mod.get_function("g")(np.arange(4, dtype=np.float32), hi, lo)
    assert lo.tolist() == [0, 1] and hi.tolist() == [2, 3]
    assert calls == [None]  # one kernel call for both nodes, the absent input passed as None


def test_intermediates_are_released_after_their_last_use():
    made, alive_at_step = [], []

    def step(x, maybe=None):
        alive_at_step.append([ref() is not None for ref in made])
        out = x + 1
        made.append(weakref.ref(out))
        return out

    text = "g\n input 0 2\n step 1 inputs: 0 -1 shape: 2\n step 2 inputs: 1 shape: 2\n" \
           " step 3 inputs: 2 -1 shape: 2\n step 4 inputs: 3 1 shape: 2\n"
    mod = ExampleJSONRuntime(text, {"step": step})
    out = np.zeros(2, np.float32)
    mod.get_function("g")(np.zeros(2, np.float32), out)
    assert out.tolist() == [4, 4]
    # node 2 is dead once node 3 exists; node 1 is kept for node 4
    assert alive_at_step == [[], [True], [True, True], [True, False, True]]


def test_kernel_result_must_match_the_declared_shape_and_dtype():
    kernels = {"add": lambda a, b: (a + b).astype(np.float64), "sub": lambda a, b: (a - b)[:1]}
    a = np.ones(2, np.float32)
    bad_dtype = ExampleJSONRuntime("g\n input 0 2\n add 1 inputs: 0 0 shape: 2\n", kernels)
    with pytest.raises(ExecutorError, match=r"line 3: add node 1.*float64 \[2\].*float32 \[2\]"):
        bad_dtype.get_function("g")(a, np.zeros(2, np.float32))
    bad_shape = ExampleJSONRuntime("g\n input 0 2\n sub 1 inputs: 0 0 shape: 2\n", kernels)
    with pytest.raises(ExecutorError, match=r"line 3: sub node 1.*\[1\]"):
        bad_shape.get_function("g")(a, np.zeros(2, np.float32))


def test_kernel_exception_names_the_node():
    def boom(a, b):
        raise ValueError("operands could not be broadcast")

    mod = ExampleJSONRuntime("g\n input 0 2\n input 1 2\n add 2 inputs: 0 1 shape: 2\n", {"add": boom})
    with pytest.raises(ExecutorError, match="g line 4: add node 2 failed: ValueError: operands"):
        mod.get_function("g")(np.ones(2, np.float32), np.ones(2, np.float32), np.zeros(2, np.float32))


def test_bad_call_arguments():
    f = ExampleJSONRuntime(SEED).get_function("subgraph_0")
    ok = [np.ones((10, 10), np.float32) for _ in range(5)]
    with pytest.raises(ExecutorError, match=r"4 input\(s\) and 1 output\(s\) \(5 arguments\), got 4"):
        f(*ok[:4])
    with pytest.raises(ExecutorError,
                       match=r"argument 2 \(input 2\): expected float32 \[10, 10\], got float32 \[10, 9\]"):
        f(ok[0], ok[1], np.ones((10, 9), np.float32), ok[3], ok[4])
    with pytest.raises(ExecutorError, match=r"argument 4 \(output 6\): expected float32.*got int32"):
        f(*ok[:4], np.ones((10, 10), np.int32))
    with pytest.raises(ExecutorError, match="expected a tensor, got int"):
        f(1, *ok[1:])


@pytest.mark.parametrize("text, message", [
    ("input 0 2\n", "line 1: 'input 0 2' comes before any subgraph header"),
    ("g\n input 0 2\n frobnicate 1 inputs: 0 shape: 2\n", "line 3: unknown op 'frobnicate'"),
    ("g\n input 0 2\n add 1 inputs: 0 0\n", "line 3: op node 1 needs 'shape:"),
    ("g\n input 0 2\n add 1 inputs: 0 5 shape: 2\n", "line 3: node 1 uses node 5, which is not defined"),
    ("g\n input 0 2\n input 0 3\n", "line 3: node ID 0 already defined on line 2"),
    ("g\n input x 2\n", "line 2: node ID must be an integer, got 'x'"),
    ("g\n input 0 2 -1\n", "line 2: dimension must be >= 0"),
    ("g\n input 0 2 dtype: float7\n", "line 2: bad dtype 'float7'"),
    ("g\n input 0 2\n add 1 inputs: 0 0 shape: 2 attrs: {nope\n", "line 3: attrs is not valid JSON"),
    ("g\n input 0 2\n add 1 inputs: 0 0 shape: 2 attrs: [1]\n", "line 3: attrs must be a JSON object"),
    ("g\n input 0 2\n add 1 shape: 2 inputs: 0 0\n", "line 3: section 'inputs:' out of order"),
    ("g\n input 0 2\n add 1 inputs: 0 inputs: 0 shape: 2\n", "line 3: section 'inputs:' appears twice"),
    ("g\n input 0 2 shape: 2\n", "line 2: section 'shape:' is not allowed on input lines"),
    ("g\n const 0 2\n", "line 2: const node 0 needs 'name: NAME'"),
    ("g\n input 0 2\n output 7\n", "line 3: output node 7 is not defined"),
    ("g\n input 0 2\n output 0\n input 1 2\n", "line 4: node after the 'output' line"),
    ("g\n input 0 2\n add 1 7 inputs: 0 0 shape: 2\n", "line 3: unexpected '7' before 'inputs:'"),
    ("g\n input 0 2\ng\n input 0 2\n", "line 3: subgraph 'g' defined twice"),
    ("g\n", "line 1: subgraph 'g' has no nodes"),
    ("# only a comment\n\n", "no subgraph"),
    ("g\n input 0 2\n add\n", "line 3: subgraph 'add' has no nodes"),
    ("g\n input 0 2\n 3add 1 inputs: 0 0 shape: 2\n", "line 3: malformed line"),
])
def test_malformed_text_names_the_line(text, message):
    with pytest.raises(ExampleJSONError, match=message):
        ExampleJSONRuntime(text)


def test_unbound_constant_is_an_error_when_called():
    mod = ExampleJSONRuntime("g\n input 0 2\n const 1 2 name: w\n add 2 inputs: 0 1 shape: 2\n")
    with pytest.raises(ExecutorError, match="constant 'w' .* is not bound"):
        mod.get_function("g")(np.ones(2, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ExecutorError, match=r"constant 'w' from test is float32 \[3\], declared float32 \[2\]"):
        mod.bind("g", {"w": np.ones(3, np.float32)}, "test")


def test_concurrent_calls_do_not_share_intermediates():
    f = ExampleJSONRuntime(SEED).get_function("subgraph_0")
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        for _ in range(50):
            a, b, c, d = (r.standard_normal((10, 10)).astype(np.float32) for _ in range(4))
            out = np.empty((10, 10), np.float32)
            f(a, b, c, d, out)
            if not np.allclose(out, (a + b - c) * d, rtol=1e-5):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_steps_planned_again_only_when_a_constant_is_bound(monkeypatch):
    """Binding the graph params after every constant is bound (``bind_params``, only_missing) plans nothing
    again: plans keep packed weights, and a second planning held two copies at once."""
    text = "f\n input 0 2\n const 1 2 name: a\n add 2 inputs: 0 1 shape: 2\n"
    mod = ExampleJSONRuntime(text)
    fn, calls = mod.functions["f"], []
    real = type(fn).prepare
    monkeypatch.setattr(type(fn), "prepare", lambda self: (calls.append(1), real(self))[1])
    a = np.ones(2, np.float32)
    mod.bind("f", {"a": a}, "test")
    assert len(calls) == 1
    mod.bind_params({"a": a * 2}, "params")  # a is bound: nothing to bind, nothing to plan
    mod.bind("f", {"other": a}, "test")
    assert len(calls) == 1
    mod.bind("f", {"a": a * 3}, "test")  # bound again: planned again
    assert len(calls) == 2
    out = np.zeros(2, np.float32)
    mod.get_function("f")(np.ones(2, np.float32), out)
    assert out.tolist() == [4, 4]
