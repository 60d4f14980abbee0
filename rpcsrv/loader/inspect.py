"""``rpcsrv inspect``: what a library holds, for a vendor debugging it before it reaches the board.

``inspect_library`` returns a JSON-serialisable summary: container and architecture, blob layout
and position, the module tree, for each graph executor factory its inputs, outputs, op nodes
(with the ``func_name`` each calls) and params, each constant table, and for a module of a
plugin's kind (ExampleJSON, a vendor's) what its plugin says (``ModuleKind.summarize`` / ``format``)
and which plugin it is.  ``format_inspection`` renders it as text.  The summary is read-only and
tolerant: a graph JSON that does not parse is reported as such instead of failing the inspection
(the executor is the authority on whether it runs).
"""

from __future__ import annotations

import re

import numpy as np

from ..protocol.dtypes import dtype_str
from .graph_json import GraphJSONError, parse_graph_json
from .library import load_library
from .vm_executable import VMExecutableModule
from .vm_text import format_vm, summarize_vm
from .modules import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, UnknownModule
from .plugins import KINDS, OWNERS, kind_of, refusal


def _array_info(name: str, arr: np.ndarray) -> dict:
    return {"name": name, "shape": list(arr.shape), "dtype": dtype_str(arr.dtype), "nbytes": int(arr.nbytes)}


def summarize_graph(graph_json: str, params: dict) -> dict:
    """Inputs, outputs, op nodes and params of a graph executor JSON (``graph_json.py``, the one reader)."""
    info = {"params": [_array_info(n, a) for n, a in params.items()],
            "param_bytes": int(sum(a.nbytes for a in params.values()))}
    try:
        g = parse_graph_json(graph_json)
    except GraphJSONError as exc:
        info["graph_error"] = f"graph JSON not understood: {exc}"
        return info

    def entry(nid: int, index: int, name: str) -> dict:
        eid = g.entry_id(nid, index)
        return {"name": name, "shape": list(g.shape[eid]), "dtype": g.dltype[eid]}

    info["inputs"] = [entry(nid, 0, g.nodes[nid].name) for nid in g.arg_nodes if g.nodes[nid].name not in params]
    names = g.output_names()  # the model's names, when kept
    info["outputs"] = [entry(nid, index, names[i] if names else f"output {i} ({g.nodes[nid].name})")
                       for i, (nid, index) in enumerate(g.heads)]
    info["ops"] = [{"name": n.name, "func_name": n.func_name, "inputs": len(n.inputs)}
                   for n in g.nodes if n.op == "tvm_op"]
    return info


def _module_info(mod, index: dict) -> dict:
    info = {"index": index[id(mod)], "type_key": mod.type_key,
            "imports": [index[id(m)] for m in mod.imports]}
    if isinstance(mod, GraphExecutorFactoryModule):
        info["module_name"] = mod.module_name
        info["graph"] = summarize_graph(mod.graph_json, mod.params)
    elif isinstance(mod, ConstLoaderModule):
        info["constants"] = [_array_info(n, a) for n, a in mod.arrays.items()]
        info["const_vars_by_symbol"] = {k: list(v) for k, v in mod.const_vars_by_symbol.items()}
    elif isinstance(mod, HostLibraryModule):
        info["symbols"] = list(mod.symbols)
    elif isinstance(mod, VMExecutableModule):
        info["vm"] = summarize_vm(mod)
    elif isinstance(mod, UnknownModule):
        info["payload_bytes"] = len(mod.payload)
        info["note"] = f"{refusal(mod.type_key)}: rpcsrv cannot run this module"
    kind = kind_of(mod)
    if kind is not None:
        info["plugin"] = OWNERS[mod.type_key]
        try:
            if kind.summarize is not None:
                info.update(kind.summarize(mod))
            if kind.functions is not None:
                info["exports"] = {"label": kind.label, "functions": list(kind.functions(mod))}
        except Exception as exc:  # a plugin's summary must not fail the inspection
            info["summary_error"] = f"{type(exc).__name__}: {exc}"
    return info


def inspect_library(source) -> dict:
    """A JSON-serialisable summary of the library at ``source`` (path or bytes)."""
    lib = load_library(source)
    modules = lib.modules()
    index = {id(m): i for i, m in enumerate(modules)}
    infos = [_module_info(m, index) for m in modules]
    return {
        "path": lib.path, "container": lib.container, "arch": lib.arch, "member": lib.member,
        "symbol": lib.symbol, "layout": lib.layout,
        "blob": {"offset": lib.blob_offset, "size": lib.blob_size},
        "host_symbols": list(lib.symbols),
        "modules": infos,
        "functions": _function_kinds(infos, lib.symbols),
    }


def _function_kinds(infos: list[dict], host_symbols: list[str]) -> dict:
    """Each graph ``func_name``: a plugin module's function (by its label, e.g. "ExampleJSON subgraph"),
    host code (a native symbol), builtin or missing."""
    exported = {f: m["exports"]["label"] for m in infos if "exports" in m for f in m["exports"]["functions"]}
    host = set(host_symbols)
    kinds = {}
    for m in infos:
        for op in m.get("graph", {}).get("ops", []):
            name = op["func_name"]
            kinds[name] = (exported[name] if name in exported
                           else "host code" if name in host or f"__tvm_ffi_{name}" in host
                           else "builtin" if name in ("__nop", "__copy") else "missing")
    return kinds


def _shape(info: dict) -> str:
    return f"{info.get('dtype')}{list(info.get('shape') or [])}"


def _natural(name: str) -> list:
    """A sort key that puts ``main_2`` before ``main_10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def display_order(modules: list[dict]) -> list[dict]:
    """The modules as the text shows them: in index order, except that the modules exporting functions
    trade places so that their functions come in name order (``main_0``, ``main_1``, ...).  TVM's
    serializer numbers the modules a const loader imports last to first; the indices stay the file's."""
    slots = [k for k, m in enumerate(modules) if m.get("exports", {}).get("functions")]
    ordered = sorted((modules[k] for k in slots), key=lambda m: _natural(m["exports"]["functions"][0]))
    shown = list(modules)
    for k, m in zip(slots, ordered):
        shown[k] = m
    return shown


def _exports(m: dict) -> str:
    functions = m.get("exports", {}).get("functions") or []
    return f": {', '.join(functions[:3])}{', ...' if len(functions) > 3 else ''}" if functions else ""


def format_inspection(info: dict, disasm: bool = False) -> str:
    """Human-readable text for an ``inspect_library`` summary."""
    in_c = (info.get("member") or "").endswith(".c")
    packed = info["container"].startswith("tar.")  # a compressed tar: offsets in the decompressed member
    out = [f"{info.get('path') or '<bytes>'}: {info['container']} ({info['arch']})"
           + (f", member {info['member']}" if info.get("member") else ""),
           "no module blob: a plain host library (TVM's LibraryModule), its functions run natively"
           if info["layout"] == "none" else
           f"blob: {info['layout']} layout, {info['blob']['size']} bytes at offset "
           f"{info['blob']['offset']}" + (" of the decoded C array" if in_c else
                                          " of the decompressed member" if packed else "")
           + (f" (symbol {info['symbol']})" if info.get("symbol") else "")]
    out.append("module tree:")
    shown = display_order(info["modules"])
    for m in shown:
        imports = f" -> imports {m['imports']}" if m["imports"] else ""
        plugin = f" (plugin {m['plugin']})" if "plugin" in m else ""
        out.append(f"  [{m['index']}] {m['type_key']}{plugin}{imports}{_exports(m)}")
    for m in shown:
        head = f"[{m['index']}] {m['type_key']}"
        kind = KINDS.get(m["type_key"]) if "plugin" in m else None
        if kind is not None and kind.format is not None and "summary_error" not in m:
            try:
                out.extend(kind.format(head, m))
            except Exception as exc:  # a plugin's text must not fail the inspection
                out.append(f"{head}: (plugin {m['plugin']} could not format it: {type(exc).__name__}: {exc})")
        elif "summary_error" in m:
            out.append(f"{head}: (plugin {m['plugin']} could not summarize it: {m['summary_error']})")
        elif "graph" in m:
            g = m["graph"]
            out.append(f"{head} (module name {m['module_name']!r}):")
            if "graph_error" in g:
                out.append(f"  {g['graph_error']}")
            for i in g.get("inputs", []):
                out.append(f"  input  {i['name']}: {_shape(i)}")
            for o in g.get("outputs", []):
                out.append(f"  output {o['name']}: {_shape(o)}")
            for op in g.get("ops", []):
                out.append(f"  op     {op['name']} -> {op['func_name']} ({op['inputs']} inputs)")
            out.append(f"  params: {len(g['params'])}, {g['param_bytes']} bytes")
            for p in g["params"]:
                out.append(f"    {p['name']}: {_shape(p)} {p['nbytes']} bytes")
        elif "constants" in m:
            out.append(f"{head}: {len(m['constants'])} constant(s)")
            for c in m["constants"]:
                out.append(f"  {c['name']}: {_shape(c)} {c['nbytes']} bytes")
            for sym, names in m["const_vars_by_symbol"].items():
                out.append(f"  {sym} needs {names}")
        elif "symbols" in m:
            out.append(f"{head}: host library, {len(m['symbols'])} function symbol(s)")
            out.extend(f"  {s}" for s in m["symbols"])
        elif "vm" in m:
            out.extend(format_vm(head, m["vm"], disasm))
        elif "payload_bytes" in m:
            out.append(f"{head}: {m['payload_bytes']} bytes, {m['note']}")
    if info.get("functions"):
        out.append("functions the graph calls:")
        out.extend(f"  {name}: {kind}" for name, kind in info["functions"].items())
    return "\n".join(out)
