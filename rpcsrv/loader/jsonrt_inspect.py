"""What ``rpcsrv inspect`` says about a JSON-runtime module (``tensorrt``, ``arm_compute_lib``, ...).

:func:`summarize_json_runtime` returns a JSON-serialisable summary of one module: its symbol, inputs,
constants, kernel counts, every node and its outputs; a graph that does not parse is reported as
such (the executor refuses it at ``load_module``).  :func:`format_json_runtime` renders it as lines.

:data:`PLUGIN` declares the kind for the plugin interface (``plugins.py``), built in like ExampleJSON:
the codec (``jsonrt.py``), the runtime (``rpcsrv.executor.jsonrt``) and this summary.
"""

from __future__ import annotations

from .jsonrt import CODEC, JSON_RUNTIME_KEYS, JSONRuntimeModule
from .jsonrt_graph import JSONGraphError
from .plugins import ModuleKind, RuntimePlugin, file_name


def _type(shape, dtype) -> str:
    return f"{dtype}{list(shape)}"


def summarize_json_runtime(mod: JSONRuntimeModule) -> dict:
    info: dict = {"symbol": mod.symbol, "const_names": list(mod.const_names)}
    try:
        g = mod.graph
    except JSONGraphError as exc:
        info["graph_error"] = f"graph JSON not understood: {exc}"
        return info
    nodes = g.nodes

    def entry(e) -> dict:
        n = nodes[e.node]
        return {"node": e.node, "index": e.index, "name": n.name, "shape": list(n.shapes[e.index]),
                "dtype": n.dtypes[e.index]}

    info["inputs"] = [entry(e) for e in g.input_entries]
    info["outputs"] = [entry(h) for h in g.heads]
    ops: dict[str, int] = {}
    for n in nodes:
        if n.op == "kernel":
            ops[n.name] = ops.get(n.name, 0) + 1
    info["ops"] = ops
    info["nodes"] = [{"index": i, "op": n.op, "name": n.name,
                      "inputs": [[e.node, e.index] for e in n.inputs],
                      "outputs": [_type(s, d) for s, d in zip(n.shapes, n.dtypes)],
                      "attrs": dict(n.attrs)} for i, n in enumerate(nodes)]
    return info


def format_json_runtime(head: str, info: dict) -> list[str]:
    """Lines for one module's summary (``head`` names the module in the tree)."""
    if "graph_error" in info:
        return [f"{head} module {info['symbol']!r}:", f"  {info['graph_error']}"]
    ins = ", ".join(_type(i["shape"], i["dtype"]) for i in info["inputs"])
    outs = ", ".join(_type(o["shape"], o["dtype"]) for o in info["outputs"])
    ops = ", ".join(f"{k} x{v}" for k, v in info["ops"].items())
    lines = [f"{head} module {info['symbol']!r}: inputs [{ins}], {sum(info['ops'].values())} kernel(s) "
             f"({ops}), consts {len(info['const_names'])}, outputs [{outs}]"]
    for n in info["nodes"]:
        args = ", ".join(f"{a[0]}" if a[1] == 0 else f"{a[0]}.{a[1]}" for a in n["inputs"])
        what = f"{n['name']}({args})" if n["op"] == "kernel" else f"{n['op']} {n['name']}"
        lines.append(f"  %{n['index']} = {what} -> {', '.join(n['outputs'])}")
    return lines


KIND = ModuleKind(
    type_keys=tuple(JSON_RUNTIME_KEYS),
    codec=CODEC,  # (its runtime: rpcsrv.executor.jsonrt, attached by the executor)
    summarize=lambda m: {"json_graph": summarize_json_runtime(m)},
    format=lambda head, info: format_json_runtime(head, info["json_graph"]),
    functions=lambda m: [m.symbol],
    label="JSON-runtime function",
    extract=lambda m: ({"symbol": m.symbol, "const_names": list(m.const_names)},
                       [("graph_json", f"jsonrt/{file_name(m.symbol)}.json", m.graph_json,
                         f"{m.type_key} graph JSON of function {m.symbol!r}")]),
)

PLUGIN = RuntimePlugin("jsonrt", (KIND,), "TVM's JSON-runtime BYOC modules (TensorRT, ACL, DNNL, CLML, BNNS, json) "
                       "on the board's numpy kernels")
