"""``byoc compare``: which node of a compiled model drifts from the ONNX reference on the board.

    byoc compare model.so model.onnx --input x=x.npy [--rtol 1e-4] [--atol 1e-5] [--steps 1] [--ops ...]
                 [--codegen NAME] [--json]

The board runs the library node by node in TVM's debug executor and, inside each ExampleJSON
subgraph, keeps every kernel's output (``rpcsrv_execute_node_steps`` / ``rpcsrv_get_step_output``).
onnxruntime runs ``model.onnx`` with every intermediate tensor of the model exposed as an output (not
the tensors the compiler made itself, such as an old Softmax's 2-D view).  Each board tensor is paired
with its ONNX tensor by compiling ``model.onnx`` again here, exactly as ``byoc compile`` did (same
``--ops`` and ``--codegen``, by default the codegen whose functions the library calls): the graph JSON
must come out identical to the library's, and for ExampleJSON the subgraphs' text too, so that each
ExampleJSON node ID names one ONNX tensor (another codegen's functions are compared by their outputs,
as host functions are).  The report gives max abs/rel error per node in execution order and names the
first node beyond ``|board - onnx| <= atol + rtol * |onnx|``.

Quantized tensors (int8/uint8 with a scale: ``TensorInfo.quant``; and the float result of a
DequantizeLinear) are compared in quantization steps: a step is one integer, ``scale`` in real value;
such a tensor agrees when no element is more than ``--steps`` steps (default 1) from onnxruntime's,
since onnxruntime's own int8 and float paths differ by a step on some elements.  Their rows give both
the steps and the real-valued error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from . import rpc
from .profile import DebugSession
from .run import UserError, add_plugin_flags, load_board_plugins, parse_inputs, plugin_failures


@dataclass
class Row:
    """One board tensor against its ONNX counterpart."""

    graph_node: str  # the graph executor node (subgraph symbol)
    step: int  # ExampleJSON node ID inside the subgraph (for a host function: its output index)
    kernel: str  # ExampleJSON op, or "(host function)"
    tensor: str  # ONNX tensor name ("" when it has no ONNX counterpart)
    onnx_node: str  # the ONNX node producing it (name or op type)
    onnx_op: str
    shape: tuple
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    ok: Optional[bool] = None  # None: not compared
    scale: float = float("nan")  # a quantized tensor's step (the real value of one integer); nan for float ones
    max_steps: float = float("nan")  # the largest difference in steps


# ---------------------------------------------------------------------------------------- pairing
def step_tensors(fn, graph) -> dict[int, str]:
    """ExampleJSON node ID → ONNX tensor name for one partitioned function, numbered the way
    ``rpcsrv.client.compiler.codegen.examplejson_text`` numbers them (inputs, constants, then each op's used
    outputs); :func:`pair_subgraphs` checks the text it writes, so a change there cannot go unseen."""
    ids: dict[str, int] = {}
    for t in list(fn.inputs) + list(fn.constants):
        ids[t] = len(ids)
    used = {t for op in fn.ops for t in op.inputs} | set(fn.outputs)
    for op in fn.ops:
        for out in op.outputs:
            if out and out in used:
                ids[out] = len(ids)
    return {i: t for t, i in ids.items()}


def library_codegen(graph: dict, module: str) -> Optional[str]:
    """The installed codegen whose functions a byoc-compiled graph calls (TVM's ``tvmgen_<module>_<codegen>_main_<k>``),
    None when no single one fits."""
    from .compiler.codegens import available

    calls = {n.get("attrs", {}).get("func_name", "") for n in graph.get("nodes", []) if n.get("op") == "tvm_op"}
    found = {m.group(1) for f in calls if (m := re.fullmatch(rf"tvmgen_{re.escape(module)}_(\w+)_main_\d+", f))}
    return found.pop() if len(found) == 1 and found <= set(available()) else None


def pair_subgraphs(lib_path: str, onnx_path: str, input_shapes: dict, ops=None, codegen: Optional[str] = None):
    """Compile ``onnx_path`` again (with ``codegen``, by default the one whose functions the library calls);
    returns ``(graph, {symbol: {ExampleJSON ID: tensor}}, {symbol: output tensors})`` (the last for every function,
    host functions too) after checking that the library holds exactly that graph JSON, and for ExampleJSON that
    text (else the pairing would lie)."""
    from rpcsrv.loader import LoaderError, load_library

    from .compiler import CompileError, compile_onnx, resolve_ops
    from .compiler.codegen import examplejson_text
    from .compiler.codegens import get_codegen
    from .compiler.partition import partition

    try:
        nodes = list(load_library(lib_path).root.walk())
    except LoaderError as exc:
        raise UserError(f"{lib_path}: {exc}{plugin_failures()}") from None
    factories = [n for n in nodes if hasattr(n, "graph_json") and hasattr(n, "params")]
    graphs = [json.loads(n.graph_json) for n in factories]
    if codegen is None and factories:
        codegen = library_codegen(graphs[0], getattr(factories[0], "module_name", "default"))
    try:
        compiled = compile_onnx(onnx_path, input_shapes=input_shapes, ops=ops, codegen=codegen)
        graph = compiled.graph  # after compile_onnx's simplifications: partitioning it again is repeatable
        gen = get_codegen(compiled.codegen)
        part = partition(graph, resolve_ops(ops, gen), compiled.module_name, host=bool(compiled.host_functions),
                         codegen=gen)
    except CompileError as exc:
        raise UserError(f"{onnx_path}: {exc}") from None
    regions = [fn for fn in part.functions if fn.kind != "host"]
    same = graphs == [json.loads(compiled.graph_json)]
    if same and gen.name == "examplejson":
        ours = {examplejson_text(fn, graph)[0] for fn in regions}
        same = ours == {sg.code for sg in compiled.subgraphs} == {n.code for n in nodes if hasattr(n, "code")}
    if not same:
        raise UserError(f"{lib_path} was not compiled from {onnx_path} with these options: its graph or its "
                        f"{compiled.codegen_title} subgraphs differ from what byoc compile makes of the model now "
                        f"(pass the --ops and --codegen used for byoc compile)")
    pairs = {fn.symbol: step_tensors(fn, graph) for fn in regions} if gen.name == "examplejson" else {}
    return graph, pairs, {fn.symbol: list(fn.outputs) for fn in part.functions}


# ---------------------------------------------------------------------------------------- the two sides
def onnx_intermediates(onnx_path: str, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Run the model in onnxruntime (no graph optimisation) with those of ``names`` that its nodes compute
    exposed as extra outputs (a name the compiler made is not asked for); an error is a ``UserError``."""
    import onnx

    try:
        import onnxruntime as ort
    except ImportError:
        raise UserError("byoc compare runs the model in onnxruntime: pip install onnxruntime") from None
    model = onnx.load(onnx_path)
    computed = {o for n in model.graph.node for o in n.output if o}
    have = {o.name for o in model.graph.output}
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names)
                               if n in computed and n not in have])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feed = {i.name: np.asarray(inputs[i.name]) for i in sess.get_inputs() if i.name in inputs}
        outs = sess.run(None, feed)
    except Exception as exc:  # onnxruntime's own errors: one line, naming the model
        text = " ".join(str(exc).split())
        raise UserError(f"onnxruntime cannot run {onnx_path}: {text[:300]}") from None
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def board_steps(dbg: DebugSession) -> list[tuple[str, str, int, str, np.ndarray]]:
    """In execution order, ``(graph node, kind, index, op, value)``: every ExampleJSON kernel output
    (kind ``"step"``, index = its ExampleJSON ID) of each node; for a node whose kernels the board
    cannot see (a host function), each of the node's outputs (kind ``"output"``, index = output)."""
    out = []
    for nid, node in enumerate(dbg.info.nodes):
        if node["op"] != "tvm_op":
            continue
        steps = json.loads(dbg.module["rpcsrv_execute_node_steps"](nid))
        if steps:
            get = dbg.module["rpcsrv_get_step_output"]
            out.extend((node["name"], "step", s["id"], s["op"], get(k).numpy()) for k, s in enumerate(steps))
            continue
        get = dbg.module["get_node_output"]
        for k in range(dbg.info.row_ptr[nid + 1] - dbg.info.row_ptr[nid]):
            out.append((node["name"], "output", k, node["attrs"]["func_name"], get(nid, k).numpy()))
    return out


def errors(board: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[float, float, bool]:
    """Max abs and rel error, and whether every element is within ``atol + rtol * |ref|``."""
    if board.shape != ref.shape:
        return float("inf"), float("inf"), False
    b, r = board.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(b - r)
    if not diff.size:
        return 0.0, 0.0, True
    nan_mismatch = bool(np.any(np.isnan(b) != np.isnan(r)))
    diff = np.where(np.isnan(b) & np.isnan(r), 0.0, diff)
    with np.errstate(over="ignore", invalid="ignore"):
        rel = diff / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
    ok = not nan_mismatch and bool(np.all(diff <= atol + rtol * np.abs(r)))
    return float(np.nanmax(diff)), float(np.nanmax(np.where(diff == 0, 0.0, rel))), ok


def step_of(tensor: str, graph, producer: dict) -> float:
    """The real value of one quantization step of ``tensor`` (a per-tensor quantized tensor, or the float
    result of a DequantizeLinear of one), nan for any other."""
    info = graph.tensors.get(tensor)
    if info is not None and info.quant is not None and not info.quant.per_channel:
        return float(info.quant.scale)
    node = producer.get(tensor)
    if node is not None and node.op_type == "DequantizeLinear" and node.inputs[0] in graph.tensors:
        src = graph.tensors[node.inputs[0]].quant
        if src is not None and not src.per_channel:
            return float(src.scale)
    return float("nan")


def step_errors(board: np.ndarray, ref: np.ndarray, step: float, tolerance: float) -> tuple[float, float, bool]:
    """Max difference in steps, in real value, and whether no element is over ``tolerance`` steps."""
    if board.shape != ref.shape:
        return float("inf"), float("inf"), False
    if board.dtype.kind in "iu" and ref.dtype.kind in "iu":
        diff = np.abs(board.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)
    else:
        diff = np.abs(board.astype(np.float64) - ref.astype(np.float64)) / step
        diff = np.where(np.isnan(diff), np.inf, diff)
    most = float(diff.max()) if diff.size else 0.0
    return most, most * step, most <= tolerance * (1 + 1e-6)


def compare_library(lib_path: str, onnx_path: str, host: str, port: int, inputs: dict, key: str = "",
                    rtol: float = 1e-4, atol: float = 1e-5, ops=None, codegen: Optional[str] = None,
                    tolerance_steps: float = 1.0) -> list[Row]:
    shapes = {name: tuple(np.asarray(v).shape) for name, v in inputs.items()}
    graph, pairs, outputs = pair_subgraphs(lib_path, onnx_path, shapes, ops, codegen)
    producer = {t: n for n in graph.nodes for t in n.outputs if t}
    with DebugSession(lib_path, host, port, key, inputs) as dbg:
        steps = board_steps(dbg)

    def tensor_of(symbol: str, kind: str, index: int) -> str:
        if kind == "step":
            return pairs.get(symbol, {}).get(index, "")
        outs = outputs.get(symbol, [])
        return outs[index] if index < len(outs) else ""

    names = [tensor_of(sym, kind, index) for sym, kind, index, _, _ in steps]
    ref = onnx_intermediates(onnx_path, inputs, [n for n in names if n and n in producer])
    rows = []
    for (symbol, kind, index, op, value), tensor in zip(steps, names):
        node = producer.get(tensor)
        row = Row(symbol, index, op if kind == "step" else "(host function)", tensor if node else "",
                  (node.name or node.op_type) if node else "", node.op_type if node else "", tuple(value.shape))
        if node is not None and tensor in ref:
            row.max_abs, row.max_rel, row.ok = errors(value, ref[tensor], rtol, atol)
            row.scale = step_of(tensor, graph, producer)
            if row.scale == row.scale:  # a quantized tensor: agreement in steps
                row.max_steps, row.max_abs, row.ok = step_errors(value, ref[tensor], row.scale, tolerance_steps)
                row.max_rel = float("nan")  # of integers, a relative error says nothing
        rows.append(row)
    if not any(r.ok is not None for r in rows):
        raise UserError("no board tensor could be paired with an ONNX tensor: nothing was compared")
    return rows


# ---------------------------------------------------------------------------------------- output
def first_bad(rows: list[Row]) -> Optional[Row]:
    return next((r for r in rows if r.ok is False), None)


def _where(r: Row) -> str:
    return f"host output {r.step}" if r.kernel == "(host function)" else f"{r.kernel} #{r.step}"


def _drift(r: Row) -> str:
    if r.scale == r.scale:
        return f"{r.max_steps:.3g} step(s) of {r.scale:.3g} (max abs {r.max_abs:.3g})"
    return f"max abs {r.max_abs:.3g}, max rel {r.max_rel:.3g}"


def format_rows(rows: list[Row], rtol: float, atol: float, tolerance_steps: float = 1.0) -> str:
    lines = [f"{'#':>3} {'ONNX node':<28} {'op':<14} {'kernel':<18} {'max abs':>10} {'max rel':>10} {'steps':>6}  "]
    for k, r in enumerate(rows):
        status = "-" if r.ok is None else ("ok" if r.ok else "DIFFERS")
        shown = f"{r.max_steps:6.3g}" if r.scale == r.scale else f"{'-':>6}"
        rel = f"{r.max_rel:10.3g}" if r.scale != r.scale else f"{'-':>10}"
        lines.append(f"{k:>3} {(r.onnx_node or '(no ONNX tensor)')[:28]:<28} {r.onnx_op[:14]:<14} "
                     f"{_where(r)[:18]:<18} {r.max_abs:10.3g} {rel} {shown}  {status}")
    bad = first_bad(rows)
    limits = f"atol {atol:g}, rtol {rtol:g}; quantized tensors: {tolerance_steps:g} step(s)"
    if bad is None:
        lines.append(f"all {sum(r.ok is not None for r in rows)} compared tensors agree ({limits})")
    else:
        lines.append(f"first difference: ONNX node {bad.onnx_node!r} ({bad.onnx_op}, tensor {bad.tensor!r}), "
                     f"{_where(bad)} in {bad.graph_node}: {_drift(bad)} ({limits})")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="find the first node whose board output differs from onnxruntime")
    p.add_argument("library")
    p.add_argument("model", help="the ONNX model the library was compiled from")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--key", default="")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for each), or a .npz holding all of them")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of a match")
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance of a match")
    p.add_argument("--steps", type=float, default=1.0,
                   help="tolerance of a quantized tensor, in quantization steps")
    p.add_argument("--ops", help="the --ops given to byoc compile, if any")
    p.add_argument("--codegen", default=None, metavar="NAME",
                   help="the --codegen given to byoc compile (default: the one whose functions the library calls)")
    add_plugin_flags(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Exit status 0 when everything agrees, 1 when a node differs, 2 on a usage error."""
    try:
        load_board_plugins(args)
        rows = compare_library(args.library, args.model, args.host, args.port, parse_inputs(args.input),
                               args.key, args.rtol, args.atol, args.ops, args.codegen, args.steps)
    except (UserError, rpc.RPCError) as exc:
        print(f"byoc: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        bad = first_bad(rows)
        print(json.dumps({"rows": [asdict(r) for r in rows], "first_difference": asdict(bad) if bad else None},
                         indent=1, default=str))
    else:
        print(format_rows(rows, args.rtol, args.atol, args.steps))
    return 1 if first_bad(rows) else 0
