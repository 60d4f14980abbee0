"""``byoc compare``: which node of a compiled model drifts from the ONNX reference on the board.

    byoc compare model.so model.onnx --input x=x.npy [--rtol 1e-4] [--atol 1e-5] [--ops ...] [--json]

The board runs the library node by node in TVM's debug executor and, inside each ExampleJSON
subgraph, keeps every kernel's output (``rpcsrv_execute_node_steps`` / ``rpcsrv_get_step_output``).
onnxruntime runs ``model.onnx`` with every intermediate tensor exposed as an output.  Each board
tensor is paired with its ONNX tensor by compiling ``model.onnx`` again here, exactly as ``byoc
compile`` did (same ``--ops``): the ExampleJSON text must come out identical to the library's, and
then each ExampleJSON node ID names one ONNX tensor.  The report gives max abs/rel error per node in
execution order and names the first node beyond ``|board - onnx| <= atol + rtol * |onnx|``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from . import rpc
from .profile import DebugSession
from .run import UserError, parse_inputs


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


def pair_subgraphs(lib_path: str, onnx_path: str, input_shapes: dict, ops=None):
    """Compile ``onnx_path`` again; returns ``(graph, {symbol: {ExampleJSON ID: tensor}}, {symbol:
    output tensors})`` (the last for every function, host functions too) after checking that the
    library holds exactly that ExampleJSON text (else the pairing would lie)."""
    from rpcsrv.loader import LoaderError, load_library

    from .compiler import CompileError, compile_onnx, resolve_ops
    from .compiler.codegen import examplejson_text
    from .compiler.codegens import get_codegen
    from .compiler.partition import partition

    try:
        compiled = compile_onnx(onnx_path, input_shapes=input_shapes, ops=ops)
        graph = compiled.graph  # after compile_onnx's simplifications: partitioning it again is repeatable
        codegen = get_codegen(compiled.codegen)
        part = partition(graph, resolve_ops(ops, codegen), compiled.module_name, host=bool(compiled.host_functions),
                         codegen=codegen)
    except CompileError as exc:
        raise UserError(f"{onnx_path}: {exc}") from None
    try:
        codes = {node.code for node in load_library(lib_path).root.walk() if hasattr(node, "code")}
    except LoaderError as exc:
        raise UserError(f"{lib_path}: {exc}") from None
    regions = [fn for fn in part.functions if fn.kind != "host"]
    ours = {examplejson_text(fn, graph)[0] for fn in regions}
    if ours != {sg.code for sg in compiled.subgraphs} or ours != codes:
        raise UserError(f"{lib_path} was not compiled from {onnx_path} with these options: its ExampleJSON "
                        f"subgraphs differ from what byoc compile makes of the model now (pass the --ops "
                        f"used for byoc compile)")
    return (graph, {fn.symbol: step_tensors(fn, graph) for fn in regions},
            {fn.symbol: list(fn.outputs) for fn in part.functions})


# ---------------------------------------------------------------------------------------- the two sides
def onnx_intermediates(onnx_path: str, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Run the model in onnxruntime with ``names`` exposed as extra outputs (no graph optimisation)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(onnx_path)
    have = {o.name for o in model.graph.output}
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names if n not in have])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: np.asarray(inputs[i.name]) for i in sess.get_inputs() if i.name in inputs}
    outs = sess.run(None, feed)
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
    rel = diff / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
    ok = not nan_mismatch and bool(np.all(diff <= atol + rtol * np.abs(r)))
    return float(np.nanmax(diff)), float(np.nanmax(np.where(diff == 0, 0.0, rel))), ok


def compare_library(lib_path: str, onnx_path: str, host: str, port: int, inputs: dict, key: str = "",
                    rtol: float = 1e-4, atol: float = 1e-5, ops=None) -> list[Row]:
    shapes = {name: tuple(np.asarray(v).shape) for name, v in inputs.items()}
    graph, pairs, outputs = pair_subgraphs(lib_path, onnx_path, shapes, ops)
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
        rows.append(row)
    if not any(r.ok is not None for r in rows):
        raise UserError("no board tensor could be paired with an ONNX tensor: nothing was compared")
    return rows


# ---------------------------------------------------------------------------------------- output
def first_bad(rows: list[Row]) -> Optional[Row]:
    return next((r for r in rows if r.ok is False), None)


def _where(r: Row) -> str:
    return f"host output {r.step}" if r.kernel == "(host function)" else f"{r.kernel} #{r.step}"


def format_rows(rows: list[Row], rtol: float, atol: float) -> str:
    lines = [f"{'#':>3} {'ONNX node':<28} {'op':<14} {'kernel':<18} {'max abs':>10} {'max rel':>10}  "]
    for k, r in enumerate(rows):
        status = "-" if r.ok is None else ("ok" if r.ok else "DIFFERS")
        lines.append(f"{k:>3} {(r.onnx_node or '(no ONNX tensor)')[:28]:<28} {r.onnx_op[:14]:<14} "
                     f"{_where(r)[:18]:<18} {r.max_abs:10.3g} {r.max_rel:10.3g}  {status}")
    bad = first_bad(rows)
    if bad is None:
        lines.append(f"all {sum(r.ok is not None for r in rows)} compared tensors agree "
                     f"(atol {atol:g}, rtol {rtol:g})")
    else:
        lines.append(f"first difference: ONNX node {bad.onnx_node!r} ({bad.onnx_op}, tensor {bad.tensor!r}), "
                     f"{_where(bad)} in {bad.graph_node}: max abs {bad.max_abs:.3g}, "
                     f"max rel {bad.max_rel:.3g} (atol {atol:g}, rtol {rtol:g})")
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
    p.add_argument("--ops", help="the --ops given to byoc compile, if any")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Exit status 0 when everything agrees, 1 when a node differs, 2 on a usage error."""
    try:
        rows = compare_library(args.library, args.model, args.host, args.port, parse_inputs(args.input),
                               args.key, args.rtol, args.atol, args.ops)
    except (UserError, rpc.RPCError) as exc:
        print(f"byoc: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        bad = first_bad(rows)
        print(json.dumps({"rows": [asdict(r) for r in rows], "first_difference": asdict(bad) if bad else None},
                         indent=1, default=str))
    else:
        print(format_rows(rows, args.rtol, args.atol))
    return 1 if first_bad(rows) else 0
