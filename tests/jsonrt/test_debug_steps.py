"""The debug executor sees inside a JSON-runtime module as inside an ExampleJSON subgraph: the step hook
(``rpcsrv.executor.module.STEP_HOOK``) times each kernel of TVM's TensorRT partition and keeps its
outputs, checked against the fixture's own final output."""

from __future__ import annotations

import json

import numpy as np

from jsonrt_helpers import EXPORTS
from rpcsrv.executor import load_module
from rpcsrv.executor.module import STEP_HOOK
from rpcsrv.protocol.dtypes import Device

TRT_OPS = ["nn.conv2d", "nn.bias_add", "nn.relu", "nn.max_pool2d", "nn.conv2d", "nn.batch_norm", "nn.relu",
           "nn.global_avg_pool2d", "nn.batch_flatten", "nn.dense", "nn.bias_add", "nn.softmax"]


def _debug():
    factory = load_module(str(EXPORTS / "trt_cnn.so"))  # offloaded whole: no native code runs
    dbg = factory.get_function("debug_create")("default", Device(1, 0))
    for name, value in np.load(EXPORTS / "trt_cnn_inputs.npz").items():
        dbg.get_function("set_input")(name, value)
    return dbg


def test_profile_steps_times_each_kernel_of_the_tensorrt_graph():
    nodes = json.loads(_debug().get_function("rpcsrv_profile_steps")(1, 2))["nodes"]
    (node,) = nodes
    assert node["func_name"] == "tvmgen_default_tensorrt_main_0"
    assert [s["op"].removeprefix("tensorrt.") for s in node["steps"]] == TRT_OPS
    assert all(len(s["seconds"]) == 2 and min(s["seconds"]) > 0 for s in node["steps"])
    assert STEP_HOOK.get() is None


def test_step_outputs_end_in_the_modules_output():
    dbg = _debug()
    steps = json.loads(dbg.get_function("rpcsrv_execute_node_steps")("tvmgen_default_tensorrt_main_0"))
    assert [s["shape"] for s in steps][:2] == [[1, 8, 16, 16]] * 2 and steps[-1]["shape"] == [1, 10]
    last = dbg.get_function("rpcsrv_get_step_output")(len(steps) - 1)
    np.testing.assert_allclose(last, np.load(EXPORTS / "trt_cnn_expect.npz")["output_0"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(last.sum(), 1.0, rtol=1e-5)  # the softmax
