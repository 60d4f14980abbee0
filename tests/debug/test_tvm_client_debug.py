"""The older graph flow and the debug executor through apache-tvm 0.27's own RPC client.

0.27 no longer ships ``tvm.contrib.graph_executor`` or the debugger, but its RPC session reaches the
board's global functions: ``remote.get_function("tvm.graph_executor.create")(graph_json, lib, dev)``,
then the module's functions by name, with params saved by the real ``tvm.runtime.save_param_dict``.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from conftest import need_module
from debug_helpers import chain_graph_json, chain_inputs, chain_library, chain_reference

NODES = ["x", "w", "b", "mm_0", "ew_1", "tail_2"]


@pytest.fixture(scope="module")
def tvm():
    return need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")


@pytest.fixture(scope="module")
def chain_so(tmp_path_factory):
    return chain_library(tmp_path_factory.mktemp("chain") / "chain.so")


@pytest.fixture
def remote(tvm, server, chain_so):
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(chain_so))
    return sess, sess.load_module(chain_so.name), sess.cpu(0)


def _run_individual(blob: bytes, repeat: int) -> list[list[float]]:
    """What the classic client's ``GraphModuleDebug.run_individual`` decodes."""
    (count,) = struct.unpack_from("<q", blob)
    return [list(struct.unpack_from(f"<{repeat}d", blob, 8 + 8 * repeat * i)) for i in range(count)]


@pytest.mark.parametrize("devices", ["ints", "device"])
def test_graph_executor_create_and_load_params(tvm, remote, devices):
    sess, lib, dev = remote
    x, w, b = chain_inputs()
    create = sess.get_function("tvm.graph_executor.create")
    gmod = create(chain_graph_json(), lib, 1, 0) if devices == "ints" else create(chain_graph_json(), lib, dev)
    gmod["load_params"](tvm.runtime.save_param_dict({"w": tvm.runtime.tensor(w)}))
    gmod["set_input"]("x", tvm.runtime.tensor(x, dev))
    gmod["set_input"]("b", tvm.runtime.tensor(b, dev))
    gmod["run"]()
    np.testing.assert_allclose(gmod["get_output"](0).numpy(), chain_reference(x, w, b)[-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(gmod["get_input"]("w").numpy(), w)
    assert gmod["get_num_inputs"]() == 3


def test_graph_runtime_create_is_the_pre_08_name(tvm, remote):
    sess, lib, dev = remote
    gmod = sess.get_function("tvm.graph_runtime.create")(chain_graph_json(), lib, 1, 0)
    assert gmod["get_num_outputs"]() == 1


def test_create_bad_arguments_are_clear_errors(tvm, remote, server):
    sess, lib, dev = remote
    create = sess.get_function("tvm.graph_executor.create")
    with pytest.raises(Exception, match="graph JSON"):
        create("{not json", lib, 1, 0)
    with pytest.raises(Exception, match="must be a module"):
        create(chain_graph_json(), "lib", 1, 0)
    with pytest.raises(Exception, match="not available on this board"):
        create(chain_graph_json(), lib, 2, 0)
    with pytest.raises(Exception, match="invalid parameters file"):
        create(chain_graph_json(), lib, 1, 0)["load_params"](bytearray(b"nonsense"))
    assert server.alive()


def test_debug_executor_outputs_and_timings(tvm, remote):
    sess, lib, dev = remote
    x, w, b = chain_inputs()
    dbg = sess.get_function("tvm.graph_executor_debug.create")(chain_graph_json(), lib, 1, 0)
    for name, value in (("x", x), ("w", w), ("b", b)):
        dbg["set_input"](name, tvm.runtime.tensor(value, dev))
    times = _run_individual(bytes(dbg["run_individual"](10, 3, 1, 100, 0, 1)), 3)
    assert len(times) == len(NODES)
    assert all(t == 0 for row in times[:3] for t in row)  # inputs
    assert all(t > 0 for row in times[3:] for t in row)
    # the classic client's _run_per_layer: execute each node, copy each output back
    expected = [x, w, b, *chain_reference(x, w, b)]
    for i in range(len(NODES)):
        dbg["execute_node"](i)
        np.testing.assert_allclose(dbg["get_node_output"](i, 0).numpy(), expected[i], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dbg["debug_get_output"]("ew_1").numpy(), expected[4], rtol=1e-4, atol=1e-5)
    one = struct.unpack("<2d", bytes(dbg["run_individual_node"](3, 5, 2, 0, 100, 0, 1)))
    assert all(t > 0 for t in one)
    with pytest.raises(Exception, match="not the last executed node"):
        dbg["get_node_output"](1, 0)
    report = json.loads(dbg["profile_rpc"]())
    assert [c["Name"]["string"] for c in report["calls"]] == ["mm_0", "ew_1", "tail_2"]
    assert report["calls"][0]["Argument Shapes"]["string"] == "float32[64, 64], float32[64, 64], float32[64, 64]"
    assert report["device_metrics"]["cpu0"]["Name"]["string"] == "Total"


def test_sum_of_node_times_is_close_to_a_plain_run(tvm, remote):
    """Many single-call samples on both sides and the best of each.  The goal, within 20 %, is asserted
    when the machine is not overloaded; with more runnable processes than cores the best samples
    themselves drift (measured 0.7-1.4 at load 10 on 2 cores), so only a factor of 2 is asserted then,
    which still catches a node timed with the whole graph or counted twice.  ``bench/debug_bench.py``
    asserts the 20 % by hand."""
    sess, lib, dev = remote
    dbg = sess.get_function("tvm.graph_executor_debug.create")(chain_graph_json(), lib, 1, 0)
    for name, value in zip(("x", "w", "b"), chain_inputs()):
        dbg["set_input"](name, tvm.runtime.tensor(value, dev))
    quiet = os.getloadavg()[0] <= (os.cpu_count() or 1)
    low, high = (0.8, 1.2) if quiet else (0.5, 2.0)
    best_nodes = [float("inf")] * len(NODES)
    best_run, ratios = float("inf"), []
    timer = dbg.time_evaluator("run", dev, number=1, repeat=40)
    for _ in range(4):  # bounded: more samples only make the best ones better
        times = _run_individual(bytes(dbg["run_individual"](1, 40, 0, 100, 0, 1)), 40)
        best_nodes = [min(b, min(row)) for b, row in zip(best_nodes, times)]
        best_run = min(best_run, min(timer().results))
        ratios.append(sum(best_nodes) / best_run)
        if low <= ratios[-1] <= high:
            break
    assert low <= ratios[-1] <= high, f"sum of node times / plain run: {ratios} (load {os.getloadavg()[0]:.1f})"


def test_classic_flow_on_a_library_with_host_functions_and_params(tvm, server, tmp_path):
    """``relay.build``'s older flow on a partially offloaded byoc library: the graph JSON and params
    kept by the user, the library uploaded alone (its host code runs in the board's native worker),
    ``tvm.graph_executor.create`` + ``load_params`` from the real client; same output as the
    factory's ``lib["default"]``, and without the params it differs."""
    need_module("onnx")
    from rpcsrv.client.compiler import compile_onnx
    from onnx_models import cnn_input, small_cnn

    compiled = compile_onnx(small_cnn(), ops="conv,relu,global_average_pool,flatten,gemm")
    assert compiled.host_functions and sorted(compiled.params) == ["c", "d"]  # host constants are params
    so = compiled.export_library(str(tmp_path / "mixed.so"))
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(so)
    lib, dev = sess.load_module("mixed.so"), sess.cpu(0)
    x = tvm.runtime.tensor(cnn_input(), dev)
    factory = lib["default"](dev)
    factory["set_input"]("x", x)
    factory["run"]()
    want = factory["get_output"](0).numpy()
    for name in ("tvm.graph_executor.create", "tvm.graph_executor_debug.create"):
        gmod = sess.get_function(name)(compiled.graph_json, lib, 1, 0)
        gmod["set_input"]("x", x)
        gmod["run"]()
        assert not np.allclose(gmod["get_output"](0).numpy(), want)  # params not loaded yet
        params = {k: tvm.runtime.tensor(v) for k, v in compiled.params.items()}
        gmod["load_params"](tvm.runtime.save_param_dict(params))
        gmod["run"]()
        np.testing.assert_array_equal(gmod["get_output"](0).numpy(), want)
    times = _run_individual(bytes(gmod["run_individual"](1, 2, 0, 100, 0, 1)), 2)
    assert len(times) == len(json.loads(compiled.graph_json)["nodes"])
    assert all(t > 0 for row in times[-4:] for t in row)  # two ExampleJSON regions, two host functions
