"""The graph executor: storage plan, TVM's functions and their errors, factory behaviour."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exec_helpers import SEED, GraphBuilder, seed_graph_json
from rpcsrv.executor import (ExampleJSONRuntime, ExecutorError, GraphExecutorFactoryRuntime,
                             GraphExecutorModule, GraphJSONError, RuntimeModule)
from rpcsrv.loader import save_param_dict
from rpcsrv.protocol.dtypes import Device

CPU = Device(1, 0)
rng = np.random.default_rng(1)


class FuncModule(RuntimeModule):
    """A library module exporting plain Python functions (stands in for host code)."""

    type_key = "test_funcs"

    def __init__(self, funcs, imports=None):
        super().__init__(imports)
        self.funcs = funcs

    def get_function(self, name):
        return self.funcs.get(name)


def seed_executor():
    lib = FuncModule({}, [ExampleJSONRuntime(SEED)])
    return GraphExecutorModule(seed_graph_json(), lib, [CPU])


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_seed_graph_inputs_by_name_and_index():
    ex = seed_executor()
    a, b, c, d = (rand(10, 10) for _ in range(4))
    ex.get_function("set_input")("input0", a)
    ex.get_function("set_input")(1, b)
    ex.set_input("input2", c)
    ex.set_input(3, d)
    ex.get_function("run")()
    assert ex.get_function("get_num_outputs")() == 1 and ex.get_function("get_num_inputs")() == 4
    np.testing.assert_allclose(ex.get_output(0), (a + b - c) * d, rtol=1e-6)
    np.testing.assert_array_equal(ex.get_input("input2"), c)
    np.testing.assert_array_equal(ex.get_input(1), b)
    assert ex.get_input("nope") is None  # TVM returns nothing; its Python client raises
    assert ex.get_input_index("input3") == 3 and ex.get_input_index("nope") == -1


def test_functions_the_classic_client_fetches_exist():
    ex = seed_executor()
    for name in ("set_input", "set_input_zero_copy", "set_output_zero_copy", "run", "get_output",
                 "get_input", "get_num_outputs", "get_input_index", "get_input_info",
                 "get_num_inputs", "load_params", "share_params", "get_output_info"):
        assert callable(ex.get_function(name)), name
    assert ex.get_function("no_such") is None and ex.type_key == "GraphExecutor"


def test_get_output_into_array_and_by_name():
    ex = seed_executor()
    for i in range(4):
        ex.set_input(i, np.full((10, 10), i + 1, np.float32))
    ex.run()
    out = np.zeros((10, 10), np.float32)
    assert ex.get_output(0, out) is None
    assert (out == (1 + 2 - 3) * 4).all()
    np.testing.assert_array_equal(ex.get_output("subgraph_0"), out)
    with pytest.raises(ExecutorError, match=r"out is float32 \[10, 5\], the output is float32 \[10, 10\]"):
        ex.get_output(0, np.zeros((10, 5), np.float32))
    with pytest.raises(ExecutorError, match="out is int64"):
        ex.get_output(0, np.zeros((10, 10), np.int64))
    with pytest.raises(ExecutorError, match="output index 1 out of range"):
        ex.get_output(1)
    with pytest.raises(ExecutorError, match="Invalid output node:nope"):
        ex.get_output("nope")


def test_wrong_input_name_shape_dtype_and_index():
    ex = seed_executor()
    with pytest.raises(ExecutorError, match=r"no input named 'x' in the graph \(inputs: input0, input1"):
        ex.set_input("x", rand(10, 10))
    with pytest.raises(ExecutorError, match=r"'input1': expected float32 \[10, 10\], got float32 \[10\]"):
        ex.set_input("input1", rand(10))
    with pytest.raises(ExecutorError, match="expected float32 .*got float64"):
        ex.set_input(0, np.zeros((10, 10)))
    with pytest.raises(ExecutorError, match=r"input index 4 out of range \(the graph has 4 inputs\)"):
        ex.set_input(4, rand(10, 10))
    with pytest.raises(ExecutorError, match="Input key is not a string"):
        ex.get_input_index(0)


def test_run_from_inputs_returns_copies_of_the_outputs():
    ex = seed_executor()
    ones = np.ones((10, 10), np.float32)
    outs = ex.get_function("run_from_inputs")(1, 0, "input0", ones, 1, ones, "input2", ones, "input3", ones * 3)
    assert len(outs) == 1 and (outs[0] == 3).all()
    assert not np.shares_memory(outs[0], ex.get_output(0))
    with pytest.raises(ExecutorError, match="even number of key-value pairs"):
        ex.run_from_inputs(1, 0, "input0")


def test_set_input_from_raw_bytes():
    ex = seed_executor()
    a = rand(10, 10)
    ex.set_input("input0", a.tobytes())
    np.testing.assert_array_equal(ex.get_input(0), a)
    with pytest.raises(ExecutorError, match="got 12 bytes, the input .* takes 400"):
        ex.set_input(0, b"x" * 12)


def chain_graph(share: bool):
    """x -> neg -> neg -> neg -> y; with ``share`` the planner's reuse: entries 1 and 3 share sid 1."""
    g = GraphBuilder()
    x = g.input("x", (4,))
    a = g.op("neg", [x], [((4,), "float32")], sids=[1])
    b = g.op("neg", [a], [((4,), "float32")], sids=[2])
    c = g.op("neg", [b], [((4,), "float32")], sids=[1 if share else 3])
    return g.json([c])


def test_storage_sharing_follows_storage_id():
    calls = []

    def neg(src, dst):
        calls.append((src, dst))
        np.negative(src, out=dst)

    lib = FuncModule({"neg": neg})
    shared = GraphExecutorModule(chain_graph(True), lib, [CPU])
    assert np.shares_memory(shared.data_entry[1], shared.data_entry[3])
    assert not np.shares_memory(shared.data_entry[1], shared.data_entry[2])
    assert len(shared.pool) == 3
    shared.set_input("x", np.arange(4, dtype=np.float32))
    shared.run()
    assert shared.get_output(0).tolist() == [0, -1, -2, -3]
    # the functions are called with the planned buffers, inputs first then outputs (TVM's order)
    assert calls[0][1] is shared.data_entry[1] and calls[2][1] is shared.data_entry[3]
    separate = GraphExecutorModule(chain_graph(False), lib, [CPU])
    assert len(separate.pool) == 4 and not np.shares_memory(separate.data_entry[1], separate.data_entry[3])


def test_pool_entry_is_sized_for_its_largest_user_and_nop_reshape_views_it():
    g = GraphBuilder()
    x = g.input("x", (2, 3), sid=0)
    r = g.op("__nop", [x], [((6,), "float32")], sids=[0])
    y = g.op("neg", [r], [((6,), "float32")], sids=[1])
    ex = GraphExecutorModule(g.json([y]), FuncModule({"neg": lambda s, d: np.negative(s, out=d)}), [CPU])
    assert ex.pool[0].nbytes == 24 and np.shares_memory(ex.data_entry[0], ex.data_entry[1])
    ex.set_input("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    ex.run()
    assert ex.get_output(0).tolist() == [0, -1, -2, -3, -4, -5]


def test_flatten_data_passes_one_dimensional_views():
    seen = []
    g = GraphBuilder()
    x = g.input("x", (2, 2))
    y = g.op("f", [x], [((2, 2), "float32")], flatten=1)
    ex = GraphExecutorModule(g.json([y]), FuncModule({"f": lambda *a: seen.append([t.shape for t in a])}), [CPU])
    ex.run()
    assert seen == [[(4,), (4,)]]


def test_params_from_the_factory_and_load_params():
    g = GraphBuilder()
    x, w = g.input("x", (3,)), g.input("w", (3,))
    y = g.op("add", [x, w], [((3,), "float32")])
    lib = FuncModule({"add": lambda a, b, o: np.add(a, b, out=o)})
    factory = GraphExecutorFactoryRuntime(g.json([y]), {"w": np.ones(3, np.float32)}, imports=[lib])
    ex = factory.get_function("default")(CPU)
    ex.set_input("x", np.arange(3, dtype=np.float32))
    ex.run()
    assert ex.get_output(0).tolist() == [1, 2, 3]
    assert ex.get_input_info() == {"shape": {"x": (3,), "w": (3,)}, "dtype": {"x": "float32", "w": "float32"}}
    ex.get_function("load_params")(bytearray(save_param_dict({"w": np.full(3, 10, np.float32),
                                                              "unused": np.zeros(1, np.int8)})))
    ex.run()
    assert ex.get_output(0).tolist() == [10, 11, 12]
    assert ex.get_input_info()["shape"] == {"x": (3,)}  # loaded params leave the input info, as in TVM
    with pytest.raises(ExecutorError, match="load_params: invalid parameters file format"):
        ex.load_params(b"\x00" * 20)
    with pytest.raises(ExecutorError, match=r"load_params 'w': expected float32 \[3\], got float32 \[4\]"):
        ex.load_params(save_param_dict({"w": np.ones(4, np.float32)}))
    with pytest.raises(ExecutorError, match="expects the bytes of a saved param dict"):
        ex.load_params("w")


def test_factory_executors_have_their_own_buffers_and_share_params_links_them():
    factory = GraphExecutorFactoryRuntime(seed_graph_json(), {}, imports=[FuncModule({}, [ExampleJSONRuntime(SEED)])])
    one, two = factory.create(CPU), factory.create(CPU)
    assert not any(np.shares_memory(a, b) for a in one.pool.values() for b in two.pool.values())
    one.set_input("input3", np.full((10, 10), 2, np.float32))
    two.share_params(one, save_param_dict({"input3": np.zeros((10, 10), np.float32)}))
    assert np.shares_memory(two.get_input("input3"), one.get_input("input3"))
    for i in range(3):
        two.set_input(i, np.ones((10, 10), np.float32))
    two.run()
    assert (two.get_output(0) == 2).all()  # (1 + 1 - 1) * 2, with input3 read from `one`
    with pytest.raises(ExecutorError, match="share_params expects a GraphExecutor module, got GraphExecutorFactory"):
        two.share_params(factory, save_param_dict({}))


def test_zero_copy_input_and_output():
    ex = seed_executor()
    ins = [np.full((10, 10), v, np.float32) for v in (1, 2, 3, 4)]
    for i, arr in enumerate(ins):
        ex.get_function("set_input_zero_copy")(i, arr)
    out = np.zeros((10, 10), np.float32)
    ex.get_function("set_output_zero_copy")(0, out)
    ex.run()
    assert (out == 0).all()  # (1 + 2 - 3) * 4
    ins[0][:] = 5  # the executor reads the caller's memory, no set_input needed
    ex.run()
    assert (out == 16).all()
    with pytest.raises(ExecutorError, match="expected float32 \\[10, 10\\]"):
        ex.set_input_zero_copy(0, np.zeros(3, np.float32))


def test_factory_functions_and_devices():
    factory = GraphExecutorFactoryRuntime(seed_graph_json(), {"input3": np.ones((10, 10), np.float32)},
                                          imports=[FuncModule({}, [ExampleJSONRuntime(SEED)])])
    assert json.loads(factory.get_function("get_graph_json")())["arg_nodes"] == [0, 1, 2, 3]
    assert list(factory.get_function("get_graph_params")()) == ["input3"]
    assert factory.get_function("remove_params")().params == {}
    assert factory.get_function("run") is None
    with pytest.raises(ExecutorError, match="device cuda\\(0\\) is not available on this board"):
        factory.get_function("default")(Device(2, 0))
    with pytest.raises(ExecutorError, match="at least one device"):
        factory.create()
    assert factory.get_function("debug_create")("default", CPU).type_key == "GraphExecutorDebug"
    with pytest.raises(ExecutorError, match="debug_create: this library has module 'default', not 'other'"):
        factory.get_function("debug_create")("other", CPU)


def test_missing_function_is_an_error_when_the_executor_is_created():
    factory = GraphExecutorFactoryRuntime(seed_graph_json("subgraph_9"), {},
                                          imports=[FuncModule({}, [ExampleJSONRuntime(SEED)])])
    with pytest.raises(ExecutorError,
                       match="no such function in module: subgraph_9 .*searched test_funcs → examplejson"):
        factory.create(CPU)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("heads"), "missing heads"),
    (lambda d: d.update(extra=1), "key 'extra' is not supported"),
    (lambda d: d["nodes"][4].update(op="relu"), "node 4 .*op 'relu' is not supported"),
    (lambda d: d["nodes"][4]["attrs"].pop("num_outputs"), "tvm_op attrs lack num_outputs"),
    (lambda d: d["nodes"][4]["attrs"].update(num_inputs="four"), "'num_inputs' must be an integer"),
    (lambda d: d["nodes"][4]["inputs"].append([9, 0, 0]), "refers to node 9"),
    (lambda d: d["node_row_ptr"].pop(), "node_row_ptr must have 6 entries"),
    (lambda d: d["attrs"]["shape"][1].pop(), r"attrs\['shape'\] has 4 entries, the graph has 5"),
    (lambda d: d["attrs"]["dltype"][1].__setitem__(0, "floaty"), r"attrs\['dltype'\]\[0\] 'floaty'"),
    (lambda d: d["attrs"].update(storage_id=["list_str", []]), r"attrs\['storage_id'\] must be \['list_int'"),
    (lambda d: d.update(arg_nodes=[4]), "arg_nodes lists 4, which is not an input"),
])
def test_malformed_graph_json(mutate, message):
    doc = json.loads(seed_graph_json())
    mutate(doc)
    with pytest.raises(GraphJSONError, match=message):
        GraphExecutorFactoryRuntime(json.dumps(doc), {})
    with pytest.raises(GraphJSONError, match="not valid JSON"):
        GraphExecutorFactoryRuntime("{nodes", {})


def test_two_executors_run_at_once_in_two_threads():
    import threading

    factory = GraphExecutorFactoryRuntime(seed_graph_json(), {}, imports=[FuncModule({}, [ExampleJSONRuntime(SEED)])])
    bad = []

    def session(value: float):
        ex = factory.create(CPU)
        for i in range(4):
            ex.set_input(i, np.full((10, 10), value if i == 0 else 1, np.float32))
        for _ in range(200):
            ex.run()
            if not (ex.get_output(0) == value).all():  # (v + 1 - 1) * 1
                bad.append(value)

    threads = [threading.Thread(target=session, args=(float(v),)) for v in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
