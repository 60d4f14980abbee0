"""The JSON-runtime payload and graph format: round trips, and every kind of broken input refused with
a message that names what is wrong (the loader for the format, the executor for what it cannot run)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jsonrt_helpers import EXPORTS, json_module, run_graph, with_consts
from rpcsrv.executor import ExecutorError, build_runtime
from rpcsrv.loader import LoaderError, build_blob, load_library, parse_blob
from rpcsrv.loader.jsonrt import CODEC, JSON_RUNTIME_KEYS, JSONRuntimeModule, JSONRuntimePayload
from rpcsrv.loader.jsonrt_graph import GraphBuilder, JSONGraphError, dump_json_graph, parse_json_graph
from rpcsrv.loader.modules import PAYLOADS


def small() -> tuple[GraphBuilder, list]:
    g = GraphBuilder("ext_0")
    x = g.input("x", (2, 3))
    w = g.const("ext_0_const_0", (3,))
    y = g.kernel("add", [x, w], (2, 3))
    return g, [y]


def test_every_json_runtime_key_is_registered():
    for key in ("tensorrt", "arm_compute_lib", "dnnl_json", "clml", "bnns_json", "json"):
        assert key in JSON_RUNTIME_KEYS and PAYLOADS[key] is CODEC


def test_fixture_payloads_round_trip_byte_for_byte():
    from rpcsrv.extract import payload_entries

    seen = 0
    for path in EXPORTS.glob("*.so"):
        for key, raw in payload_entries(str(path)):
            if key in JSON_RUNTIME_KEYS:
                value = JSONRuntimePayload.parse(raw)
                mod = CODEC.decode(value, key)
                assert JSONRuntimePayload.build(CODEC.encode(mod)) == raw
                graph = parse_json_graph(mod.graph_json)
                assert parse_json_graph(dump_json_graph(graph)) == graph
                seen += 1
    assert seen == 9  # one TensorRT module, eight ACL ones


@pytest.mark.parametrize("layout", ["classic", "ffi"])
@pytest.mark.parametrize("key", sorted(JSON_RUNTIME_KEYS))
def test_built_tree_round_trips(key, layout):
    """Both blob layouts: TVM HEAD's JSONRuntimeBase (``SaveToBytes``) writes the same three fields."""
    g, heads = small()
    mod = json_module(g, heads, type_key=key)
    tree = parse_blob(build_blob(with_consts(mod, {"ext_0_const_0": np.ones(3, "float32")}), layout))
    back = tree.imports[0]
    assert isinstance(back, JSONRuntimeModule) and back.type_key == key
    assert (back.symbol, back.graph_json, back.const_names) == (mod.symbol, mod.graph_json, mod.const_names)
    assert back.graph == g.graph(heads)


def test_truncated_payload_is_refused_with_its_offset():
    g, heads = small()
    blob = build_blob(with_consts(json_module(g, heads), {"ext_0_const_0": np.ones(3, "float32")}))
    for cut in (len(blob) // 2, len(blob) - 40):
        with pytest.raises(LoaderError, match="runs past the end|cannot fit|offset"):
            parse_blob(blob[:cut])


def _graph_error(mutate) -> str:
    g, heads = small()
    doc = json.loads(dump_json_graph(g.graph(heads)))
    mutate(doc)
    with pytest.raises(JSONGraphError) as info:
        parse_json_graph(json.dumps(doc))
    return str(info.value)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["nodes"][2].__setitem__("inputs", [[3, 0, 0], [1, 0, 0]]), "node 2 .* not an earlier node"),
    (lambda d: d["nodes"][2].__setitem__("inputs", [[0, 1, 0], [1, 0, 0]]), "node 0 has 1 output"),
    (lambda d: d["nodes"][2]["attrs"].__setitem__("num_inputs", "3"), "num_inputs is 3 but it has 2"),
    (lambda d: d["nodes"][1].__setitem__("op", "weight"), "node 1: op must be one of input, const, kernel"),
    (lambda d: d["nodes"][0]["attrs"].__setitem__("dtype", [["float33"]]), "unknown dtype 'float33'"),
    (lambda d: d["nodes"][0]["attrs"].__setitem__("shape", [[[2, -3]]]), "non-negative integers"),
    (lambda d: d["nodes"][2]["attrs"].__setitem__("extra", ["1"]), "attribute 'extra' must be a list of strings"),
    (lambda d: d["nodes"][2]["attrs"].__setitem__("axis", "1"), "one-element list wrapping"),
    (lambda d: d.__setitem__("node_row_ptr", [0, 1, 2, 4]), "node_row_ptr .* does not match"),
    (lambda d: d.__setitem__("arg_nodes", [0]), "arg_nodes .* must list each input and const node once"),
    (lambda d: d.__setitem__("heads", [[5, 0, 0]]), r"output \[5, 0\] is not an output"),
    (lambda d: d.pop("heads"), "missing 'heads'"),
    (lambda d: d.__setitem__("edges", []), r"unknown key\(s\) \['edges'\]"),
])
def test_bad_graphs_are_refused_naming_the_node(mutate, message):
    import re

    assert re.search(message, _graph_error(mutate)), _graph_error(mutate)


def test_graph_that_is_not_json():
    with pytest.raises(JSONGraphError, match="does not parse"):
        parse_json_graph('{"nodes": [')


def test_const_names_must_match_the_graph():
    g, heads = small()
    mod = JSONRuntimeModule("ext_0", dump_json_graph(g.graph(heads)), ["other"], type_key="tensorrt")
    with pytest.raises(LoaderError, match=r"tensorrt payload: tensorrt module 'ext_0': the graph's const nodes "
                                          r"are \['ext_0_const_0'\] but the module lists constants \['other'\]"):
        parse_blob(build_blob(with_consts(mod, {"other": np.ones(3, "float32")})))


def _build(g, heads, consts, key="json"):
    return build_runtime(parse_blob(build_blob(with_consts(json_module(g, heads, type_key=key), consts))))


def test_unknown_op_is_refused_at_load_naming_node_and_op():
    g = GraphBuilder()
    x = g.input("x", (4,))
    y = g.kernel("nn.relu", [x], (4,))
    g.kernel("qnn.conv2d_transpose", [y], (4,))
    with pytest.raises(ExecutorError, match=r"arm_compute_lib module 'ext_0' node 2: op 'qnn.conv2d_transpose' has "
                                            "no kernel on this board"):
        _build(g, [type(y)(2)], {}, key="arm_compute_lib")


@pytest.mark.parametrize("attrs,message", [
    (dict(data_layout="NCHW8c", kernel_layout="OIHW"), "data layout 'NCHW8c' is not supported"),
    (dict(data_layout="NCHW", kernel_layout="GOIHW"), "kernel layout 'GOIHW' is not supported"),
    (dict(data_layout="NCHW", kernel_layout="OIHW", strides=["x", "1"]), "attribute 'strides' must be integers"),
    (dict(data_layout="NCHW", kernel_layout="OIHW", out_dtype="int32"), "out_dtype int32 differs"),
    (dict(data_layout="NCHW", kernel_layout="OIHW", activation_type="softsign"), "fused activation 'softsign'"),
])
def test_unsupported_attributes_are_refused_at_load(attrs, message):
    g = GraphBuilder()
    y = g.kernel("nn.conv2d", [g.input("x", (1, 2, 4, 4)), g.const("w", (2, 2, 1, 1))], (1, 2, 4, 4), **attrs)
    with pytest.raises(ExecutorError, match=f"json module 'ext_0' node 2 op 'nn.conv2d': {message}"):
        _build(g, [y], {"w": np.ones((2, 2, 1, 1), "float32")})


def test_wrong_kernel_input_count_is_refused_at_load():
    g = GraphBuilder()
    x = g.input("x", (2, 3))
    y = g.kernel("nn.batch_norm", [x, x], (2, 3))
    with pytest.raises(ExecutorError, match="node 1 op 'nn.batch_norm': takes 5 input"):
        _build(g, [y], {})


def test_constants_missing_or_mistyped_are_refused_at_load():
    g, heads = small()
    with pytest.raises(ExecutorError, match="module 'ext_0': constant\\(s\\) 'ext_0_const_0' not found"):
        build_runtime(parse_blob(build_blob(json_module(g, heads))))  # no const loader at all
    with pytest.raises(ExecutorError, match="constant 'ext_0_const_0' from the const loader is float64 \\[3\\], "
                                            "the graph declares float32 \\[3\\]"):
        _build(g, heads, {"ext_0_const_0": np.ones(3)})


def test_wrong_arguments_at_call():
    g, heads = small()
    rt = _build(g, heads, {"ext_0_const_0": np.arange(3, dtype="float32")})
    fn = rt.find_function("ext_0")
    x, out = np.ones((2, 3), "float32"), np.zeros((2, 3), "float32")
    with pytest.raises(ExecutorError, match=r"ext_0 takes 1 input\(s\) and 1 output\(s\) \(2 arguments\), got 1"):
        fn(x)
    with pytest.raises(ExecutorError, match=r"argument 0 \(input\): expected float32 \[2, 3\], got float32 \[3, 2\]"):
        fn(np.ones((3, 2), "float32"), out)
    fn(x, out)
    np.testing.assert_array_equal(out, x + np.arange(3))
    assert rt.find_function("get_symbol")() == "ext_0"


def test_kernel_failure_names_node_and_op():
    g = GraphBuilder()
    x = g.input("x", (2, 3))
    y = g.kernel("reshape", [x], (3, 2), newshape=[3, 2])
    z = g.kernel("add", [y, x], (3, 2))  # (3, 2) + (2, 3) does not broadcast
    with pytest.raises(ExecutorError, match="json module 'ext_0' node 2 op 'add' failed"):
        run_graph(g, [z], [np.ones((2, 3), "float32")])


def test_broken_library_file_is_refused(tmp_path):
    data = (EXPORTS / "trt_cnn.so").read_bytes()
    at = data.find(b'"node_row_ptr"', data.find(b'"symbol"'))  # in the tensorrt graph
    broken = tmp_path / "broken.so"
    broken.write_bytes(data[:at] + b'"node_row_ptX"' + data[at + 14:])
    with pytest.raises(LoaderError, match=r"tensorrt payload: .*unknown key\(s\) \['node_row_ptX'\]"):
        load_library(str(broken))
