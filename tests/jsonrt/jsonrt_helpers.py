"""Builders for the JSON-runtime tests: payloads made from the format, whole libraries around them,
and single-node ONNX references."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
from exec_helpers import GraphBuilder as HostGraph  # noqa: E402

from rpcsrv.executor import build_runtime  # noqa: E402
from rpcsrv.loader import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob  # noqa: E402
from rpcsrv.loader.jsonrt import JSONRuntimeModule  # noqa: E402
from rpcsrv.loader.jsonrt_graph import GraphBuilder, dump_json_graph  # noqa: E402
from rpcsrv.loader.location import symbol_content  # noqa: E402

EXPORTS = Path(__file__).resolve().parent.parent / "data" / "tvm-exports"
FIXTURES = sorted(p.stem for p in EXPORTS.glob("*.so"))


def json_module(b: GraphBuilder, heads, symbol: str = "ext_0", type_key: str = "json") -> JSONRuntimeModule:
    """The loader node for builder ``b``'s graph with outputs ``heads``."""
    return JSONRuntimeModule(symbol, dump_json_graph(b.graph(list(heads))), b.const_names(), type_key=type_key)


def with_consts(mod: JSONRuntimeModule, consts: dict[str, np.ndarray]) -> ConstLoaderModule:
    """A const loader above ``mod`` holding ``consts``, as TVM's export puts it."""
    return ConstLoaderModule(dict(consts), {mod.symbol: list(mod.const_names)}, imports=[mod])


def run_graph(b: GraphBuilder, heads, inputs: list[np.ndarray], consts: dict | None = None,
              type_key: str = "json") -> list[np.ndarray]:
    """Build the module (through its payload bytes: build_blob / parse), bind ``consts``, run it once."""
    from rpcsrv.loader import parse_blob

    mod = json_module(b, heads, type_key=type_key)
    tree = parse_blob(build_blob(with_consts(mod, consts or {})))
    rt = build_runtime(tree)
    graph = b.graph(list(heads))
    outs = [np.zeros(graph.nodes[h.node].shapes[h.index], graph.nodes[h.node].dtypes[h.index]) for h in heads]
    rt.find_function(mod.symbol)(*inputs, *outs)
    return outs


def library(mod: JSONRuntimeModule, consts: dict, inputs: list[tuple[str, tuple, str]],
            outputs: list[tuple[tuple, str]]) -> bytes:
    """A raw blob file: factory (one call of ``mod.symbol``) -> const loader -> [module, _lib]."""
    g = HostGraph()
    ids = [g.input(name, shape, dtype) for name, shape, dtype in inputs]
    out = g.op(mod.symbol, ids, outputs)
    consts_node = ConstLoaderModule(dict(consts), {mod.symbol: list(mod.const_names)},
                                    imports=[mod, HostLibraryModule(symbols=[])])
    root = GraphExecutorFactoryModule(g.json([(out, i) for i in range(len(outputs))]), {}, "default",
                                      imports=[consts_node])
    return symbol_content(build_blob(root))


def onnx_ref(op_type: str, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    """``op_type`` run by onnx's reference evaluator on ``inputs``."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n, x in zip(names, inputs)]
    graph = helper.make_graph([node], "ref", info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]
