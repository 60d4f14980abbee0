"""``byoc profile``: where the time goes on the board, node by node and kernel by kernel.

    byoc profile model.so --host 127.0.0.1 --port 9090 --input x=x.npy [--repeat 5] [--number 10]
                 [--plot profile.png] [--json]

Uploads the library and creates TVM's debug graph executor on the board with the factory's
``lib["debug_create"]("default", dev)`` (params set; it runs where the library runs, in the board's
native worker too), then asks it for ``rpcsrv_profile_steps``: seconds per graph node and per
ExampleJSON kernel inside each subgraph, for each repeat. The report gives each node's mean time and
spread, its share of the total, its function, input and output shapes and the kernels inside it.
``--plot`` draws the slowest nodes and kernels as horizontal bars with matplotlib (``pip install
rpcsrv[plot]``) and writes the report as JSON beside the image (``profile.json`` for
``profile.png``). ``--dump-root DIR`` also writes the
files TVM's debug executor writes (graph dump, every node's output as a param dict, Chrome trace).

A Relax library (``relax.VMExecutable``, apache-tvm >= 0.21) is profiled through the VM's
``rpcsrv_profile``: each kernel, builtin or VM function that ``--function`` (default ``main``) calls
is a row, with its calls per run, its time per run over ``--repeat`` runs and its argument shapes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from . import rpc
from .run import UserError, add_plugin_flags, load_board_plugins, parse_inputs, plugin_failures


# ---------------------------------------------------------------------------------------- the library
def read_library(lib_path: str) -> tuple[str, dict[str, np.ndarray], str]:
    """The graph JSON, params and module name of a library compiled by ``byoc compile`` (read here)."""
    from rpcsrv.loader import LoaderError, load_library

    if not Path(lib_path).is_file():
        raise UserError(f"library {lib_path!r} does not exist")
    try:
        loaded = load_library(lib_path)
    except LoaderError as exc:
        raise UserError(f"{lib_path}: {exc}{plugin_failures()}") from None
    for node in loaded.root.walk():
        if hasattr(node, "graph_json"):
            return node.graph_json, dict(node.params), getattr(node, "module_name", "default")
    raise UserError(f"{lib_path} holds no graph executor factory (is it a model compiled by byoc compile?)")


class GraphInfo:
    """What the report needs from the graph JSON: node names, functions, entry shapes and dtypes."""

    def __init__(self, graph_json: str):
        doc = json.loads(graph_json)
        self.nodes = doc["nodes"]
        self.row_ptr = doc["node_row_ptr"]
        self.shapes = doc["attrs"]["shape"][1]
        self.dtypes = doc["attrs"]["dltype"][1]
        self.arg_nodes = doc["arg_nodes"]

    def entry(self, nid: int, index: int = 0) -> int:
        return self.row_ptr[nid] + index

    def describe(self, eid: int) -> dict:
        return {"shape": list(self.shapes[eid]), "dtype": self.dtypes[eid]}

    def inputs_of(self, nid: int) -> list[dict]:
        return [self.describe(self.entry(src, idx)) for src, idx, *_ in self.nodes[nid]["inputs"]]

    def outputs_of(self, nid: int) -> list[dict]:
        return [self.describe(eid) for eid in range(self.row_ptr[nid], self.row_ptr[nid + 1])]

    def input_names(self, params) -> list[str]:
        return [self.nodes[n]["name"] for n in self.arg_nodes if self.nodes[n]["name"] not in params]


def _shape_text(items: list[dict]) -> str:
    return ", ".join(f"{d['dtype']}[{'x'.join(map(str, d['shape']))}]" if "shape" in d else d.get("type", "?")
                     for d in items)


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "all": list(values)}


# ---------------------------------------------------------------------------------------- the board
class DebugSession:
    """A library uploaded and loaded on a board with a debug executor over it, inputs set."""

    def __init__(self, lib_path: str, host: str, port: int, key: str = "",
                 inputs: Optional[dict[str, np.ndarray]] = None):
        self.graph_json, self.params, module_name = read_library(lib_path)
        self.info = GraphInfo(self.graph_json)
        inputs = dict(inputs or {})
        names = self.info.input_names(self.params)
        missing = [n for n in names if n not in inputs]
        unknown = [n for n in inputs if n not in names]
        if missing or unknown:
            wanted = ", ".join(f"{n} ({_shape_text([self.info.describe(self.info.entry(self._nid(n)))])})"
                               for n in names)
            raise UserError(f"--input must give every model input: {wanted}"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        try:
            self.sess = rpc.connect(host, port, key=key)
        except OSError as exc:
            raise UserError(f"cannot reach the board at {host}:{port}: {exc}") from None
        path = Path(lib_path)
        self.sess.upload(path.read_bytes(), path.name)
        self.lib = self.sess.load_module(path.name)
        self.dev = self.sess.cpu(0)
        self.module = self.lib.get_function("debug_create", True)(module_name, self.dev)
        for name, value in inputs.items():
            self.module["set_input"](name, self.sess.array(np.asarray(value)))

    def _nid(self, name: str) -> int:
        return next(i for i, n in enumerate(self.info.nodes) if n["name"] == name)

    def close(self) -> None:
        self.module = self.lib = None
        self.sess.close()

    def __enter__(self) -> "DebugSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def build_report(info: GraphInfo, steps: dict, run_seconds: list[float], number: int, repeat: int,
                 model: str = "") -> dict:
    """The profile report from the board's ``rpcsrv_profile_steps`` answer and the graph."""
    nodes = []
    for entry in steps["nodes"]:
        nid = entry["index"]
        seconds = _stats(entry["seconds"])
        kernels = [{"symbol": k["symbol"], "id": k["id"], "op": k["op"], "shape": k["shape"], "dtype": k["dtype"],
                    "seconds": _stats(k["seconds"])} for k in entry["steps"]]
        for k in kernels:
            k["share_of_node"] = k["seconds"]["mean"] / seconds["mean"] if seconds["mean"] > 0 else 0.0
        nodes.append({"index": nid, "name": entry["name"], "func_name": entry["func_name"],
                      "ops": [k["op"] for k in kernels], "inputs": info.inputs_of(nid),
                      "outputs": info.outputs_of(nid), "seconds": seconds, "kernels": kernels})
    total = sum(n["seconds"]["mean"] for n in nodes)
    for n in nodes:
        n["share"] = n["seconds"]["mean"] / total if total > 0 else 0.0
        for k in n["kernels"]:
            k["share"] = k["seconds"]["mean"] / total if total > 0 else 0.0
    return {"model": model, "number": number, "repeat": repeat, "total_node_seconds": total,
            "run_seconds": _stats(run_seconds) if run_seconds else None, "nodes": nodes}


def profile_library(lib_path: str, host: str, port: int, key: str = "", inputs: Optional[dict] = None,
                    number: int = 10, repeat: int = 5, dump_root: Optional[str] = None) -> dict:
    """Profile ``lib_path`` on the board; see :func:`build_report` for the result.  With
    ``dump_root``, also write TVM's debug-executor dump files there (:func:`dump_tvmdbg`)."""
    if number < 1 or repeat < 1:
        raise UserError("--number and --repeat must be at least 1")
    with DebugSession(lib_path, host, port, key, inputs) as dbg:
        steps = json.loads(dbg.module["rpcsrv_profile_steps"](number, repeat))
        run_seconds = dbg.module.time_evaluator("run", dbg.dev, number=number, repeat=repeat)()
        if dump_root:
            dump_tvmdbg(dbg, dump_root, number, repeat)
        return build_report(dbg.info, steps, [float(s) for s in run_seconds], number, repeat, Path(lib_path).name)


# ---------------------------------------------------------------------------------------- Relax libraries
def is_relax_library(lib_path: str) -> bool:
    """True for a library holding a Relax VM executable (apache-tvm >= 0.21 builds)."""
    from rpcsrv.loader import LoaderError, load_library

    try:
        return any(getattr(n, "type_key", "") == "relax.VMExecutable" for n in load_library(lib_path).root.walk())
    except LoaderError as exc:
        raise UserError(f"{lib_path}: {exc}{plugin_failures()}") from None


def profile_relax(lib_path: str, host: str, port: int, key: str = "", inputs: Optional[dict] = None,
                  repeat: int = 5, function: str = "main") -> dict:
    """Profile VM function ``function`` of a Relax library: ``repeat`` calls of the VM's
    ``rpcsrv_profile`` after one warm-up call; each called kernel, builtin or VM function is a node."""
    inputs = dict(inputs or {})
    try:
        sess = rpc.connect(host, port, key=key)
    except OSError as exc:
        raise UserError(f"cannot reach the board at {host}:{port}: {exc}") from None
    with sess:
        path = Path(lib_path)
        sess.upload(path.read_bytes(), path.name)
        vm = sess.load_module(path.name)["vm_load_executable"]()
        vm["vm_initialization"](1, 0, 2)  # cpu(0), pooled allocator: what relax.VirtualMachine does
        arity = vm["get_function_arity"](function)
        names = [vm["get_function_param_name"](function, i) for i in range(arity)]
        if sorted(names) != sorted(inputs):
            raise UserError(f"--input must give every parameter of {function}: {', '.join(names)}")
        args = [sess.array(np.asarray(inputs[n])) for n in names]
        prof = vm["rpcsrv_profile"]
        prof(function, *args)  # warm-up
        runs = [json.loads(prof(function, *args)) for _ in range(repeat)]
    per_name: dict[str, dict] = {}
    for run in runs:
        for call in run["calls"]:
            entry = per_name.setdefault(call["name"], {"seconds": [], "calls": call["calls"], "args": call["args"]})
            entry["seconds"].append(call["total_seconds"])
    nodes = [{"index": k, "name": name, "func_name": name, "ops": [name], "calls_per_run": e["calls"],
              "inputs": e["args"], "outputs": [], "kernels": [],
              "seconds": _stats(e["seconds"] + [0.0] * (repeat - len(e["seconds"])))}
             for k, (name, e) in enumerate(per_name.items())]
    total = sum(n["seconds"]["mean"] for n in nodes)
    for n in nodes:
        n["share"] = n["seconds"]["mean"] / total if total > 0 else 0.0
    return {"model": path.name, "executor": "relax.VirtualMachine", "function": function, "number": 1,
            "repeat": repeat, "total_node_seconds": total, "run_seconds": _stats([r["total_seconds"] for r in runs]),
            "nodes": nodes}


# ---------------------------------------------------------------------------------------- TVM's dump files
def dump_tvmdbg(dbg: DebugSession, dump_root: str, number: int, repeat: int) -> Path:
    """Write what TVM's ``debug_executor.create(..., dump_root)`` + ``run()`` writes, in its layout
    (v0.19 ``python/tvm/contrib/debugger/debug_result.py``), from the board's answers to TVM's own
    debug functions: ``run_individual`` for the times, ``execute_node`` + ``get_node_output`` for
    every node output.  Files, in ``<dump_root>/_tvmdbg_device_CPU_0/``: ``_tvmdbg_graph_dump.json``
    (the graph, each node with its op, input names, dtype and shape), ``output_tensors.params`` (a
    TVM param dict, keys ``<node>____topo-index:<i>____output-num:<j>``) and
    ``_tvmdbg_execution_trace.json`` (Chrome trace, one begin/end pair per node)."""
    from rpcsrv.loader import save_param_dict

    info, module = dbg.info, dbg.module
    blob = bytes(module["run_individual"](number, repeat, 0, 100, 0, 1))
    count = int(np.frombuffer(blob[:8], "<i8")[0])
    times = np.frombuffer(blob, "<f8", offset=8).reshape(count, repeat)
    tensors = {}
    for i, node in enumerate(info.nodes):
        module["execute_node"](i)
        for j in range(info.row_ptr[i + 1] - info.row_ptr[i]):
            tensors[f"{node['name']}____topo-index:{i}____output-num:{j}"] = module["get_node_output"](i, j).numpy()
    path = Path(dump_root) / "_tvmdbg_device_CPU_0"
    path.mkdir(parents=True, exist_ok=True)
    graph = json.loads(dbg.graph_json)
    for i, node in enumerate(graph["nodes"]):
        eid = info.entry(i)
        if node["op"] == "null":
            node.update(op="param", attrs={})
        else:
            node["op"] = node["attrs"]["func_name"]
        node["inputs"] = [info.nodes[src]["name"] for src, *_ in info.nodes[i]["inputs"]]
        node["attrs"]["T"] = f"type: {info.dtypes[eid]}"
        node["shape"] = info.shapes[eid]
    (path / "_tvmdbg_graph_dump.json").write_text(json.dumps(graph, indent=4))
    (path / "output_tensors.params").write_bytes(save_param_dict(tensors))
    starts = np.concatenate([[0.0], np.cumsum(times.mean(axis=1))])
    events = [{"ts": (starts[i] + d) * 1e6, "tid": 1, "pid": 1, "name": node["name"], "ph": ph}
              for i, node in enumerate(info.nodes) for ph, d in (("B", 0.0), ("E", times[i].mean()))]
    (path / "_tvmdbg_execution_trace.json").write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": events}))
    return path


# ---------------------------------------------------------------------------------------- output
def _us(seconds: float) -> str:
    return f"{seconds * 1e6:10.1f}"


def format_report(report: dict, kernels: bool = True) -> str:
    """The report as a table: slowest nodes first, each with the kernels inside it."""
    lines = [f"{'node':<36} {'mean us':>10} {'± us':>8} {'share':>6}  op(s) / shapes"]
    for n in sorted(report["nodes"], key=lambda n: -n["seconds"]["mean"]):
        s = n["seconds"]
        if n["outputs"]:
            what = (f"{','.join(dict.fromkeys(n['ops'])) or n['func_name']}: "
                    f"{_shape_text(n['inputs'])} -> {_shape_text(n['outputs'])}")
        else:  # a Relax VM call: destination-passing arguments, maybe called several times per run
            calls = n.get("calls_per_run", 1)
            what = (f"{calls} calls, " if calls > 1 else "") + f"args {_shape_text(n['inputs'])}"
        lines.append(f"{n['name'][:36]:<36} {_us(s['mean'])} {s['std'] * 1e6:8.1f} {n['share']:6.1%}  {what}")
        if kernels:
            for k in sorted(n["kernels"], key=lambda k: -k["seconds"]["mean"]):
                ks = k["seconds"]
                lines.append(f"  {k['op'] + ' #' + str(k['id']):<34} {_us(ks['mean'])} {ks['std'] * 1e6:8.1f} "
                             f"{k['share']:6.1%}  -> {k['dtype']}[{'x'.join(map(str, k['shape']))}]")
    lines.append(f"{'sum of nodes':<36} {_us(report['total_node_seconds'])}")
    if report.get("run_seconds"):
        r = report["run_seconds"]
        lines.append(f"{'plain run (best of repeats)':<36} {_us(r['min'])}")
    return "\n".join(lines)


def short_symbol(symbol: str) -> str:
    """``tvmgen_default_examplejson_main_3`` → ``main_3`` (labels stay readable); others unchanged."""
    match = re.fullmatch(r"tvmgen_\w*?_(main_\d+)", symbol)
    return match.group(1) if match else symbol


def kernel_label(k: dict) -> str:
    return f"{k['op']} #{k['id']} ({short_symbol(k['symbol'])})"


def plot_labels(report: dict, top: int) -> dict:
    """The bar labels of the plot, slowest first: graph nodes and ExampleJSON kernels."""
    nodes = sorted(report["nodes"], key=lambda n: -n["seconds"]["mean"])[:top]
    kernels = sorted((k for n in report["nodes"] for k in n["kernels"]), key=lambda k: -k["seconds"]["mean"])[:top]
    return {"nodes": [short_symbol(n["name"]) for n in nodes], "kernels": [kernel_label(k) for k in kernels]}


def plot_report(report: dict, path: str, top: int = 15) -> Path:
    """Horizontal bars (mean time, spread as error bar, share as text) of the slowest nodes and kernels;
    writes the PNG and the report as JSON beside it (same name, ``.json``); returns the JSON path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'rpcsrv[plot]' (or pip install matplotlib)") from None
    labels = plot_labels(report, top)
    nodes = sorted(report["nodes"], key=lambda n: -n["seconds"]["mean"])[:top]
    kernels = sorted((k for n in report["nodes"] for k in n["kernels"]), key=lambda k: -k["seconds"]["mean"])[:top]
    relax = report.get("executor") == "relax.VirtualMachine"
    panels = [("VM calls" if relax else "graph nodes", labels["nodes"], nodes)]
    if kernels:
        panels.append(("ExampleJSON kernels", labels["kernels"], kernels))
    rows = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 1.2 + 0.45 * rows), squeeze=False)
    for ax, (title, names, items) in zip(axes[0], panels):
        means = [i["seconds"]["mean"] * 1e6 for i in items]
        spread = [i["seconds"]["std"] * 1e6 for i in items]
        y = range(len(items))
        ax.barh(y, means, xerr=spread, color="#4878a8", ecolor="#333333", capsize=3)
        ax.set_yticks(list(y), [n if len(n) <= 40 else n[:37] + "..." for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("mean time per run, all its calls (us)" if relax and not title.startswith("Ex")
                      else "mean time per call (us)")
        ax.set_title(f"slowest {title}")
        for k, item in enumerate(items):
            ax.text(means[k] + spread[k], k, f"  {means[k]:.1f} us, {item['share']:.1%}", va="center", fontsize=8)
        ax.set_xlim(0, max([m + s for m, s in zip(means, spread)] + [1e-3]) * 1.35)
    fig.suptitle(f"{report.get('model') or 'model'}: {report['total_node_seconds'] * 1e3:.3f} ms over all nodes "
                 f"(number {report['number']}, repeat {report['repeat']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    out = Path(path).with_suffix(".json")
    out.write_text(json.dumps({**report, "plot": {"image": Path(path).name, **labels}}, indent=1))
    return out


# ---------------------------------------------------------------------------------------- command
def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="time a compiled library on a board, node by node and kernel by kernel")
    p.add_argument("library")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--key", default="")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for each), or a .npz holding all of them")
    p.add_argument("--number", type=int, default=10, help="calls per measurement (default 10)")
    p.add_argument("--repeat", type=int, default=5, help="measurements per node, for the spread (default 5)")
    p.add_argument("--plot", metavar="PNG", help="draw the slowest nodes and kernels; the JSON goes beside it")
    p.add_argument("--top", type=int, default=15, help="bars per panel of the plot (default 15)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--function", default="main", help="the VM function to profile (Relax libraries; default main)")
    p.add_argument("--dump-root", metavar="DIR", help="also write TVM's debug-executor dump files there "
                                                      "(graph dump, every node output, Chrome trace)")
    add_plugin_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        load_board_plugins(args)
        inputs = parse_inputs(args.input)
        if is_relax_library(args.library):
            if args.dump_root:
                raise UserError("--dump-root is for graph-executor libraries (TVM's debug executor files)")
            report = profile_relax(args.library, args.host, args.port, args.key, inputs, args.repeat, args.function)
        else:
            report = profile_library(args.library, args.host, args.port, args.key, inputs, args.number, args.repeat,
                                     args.dump_root)
        written = plot_report(report, args.plot, args.top) if args.plot else None
    except (UserError, rpc.RPCError) as exc:
        print(f"byoc: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    if written is not None and not args.json:
        print(f"wrote {args.plot} and {written}")
    return 0
