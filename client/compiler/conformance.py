"""ONNX backend node test cases (shipped in the ``onnx`` wheel) through compiler, exporter and a runner.

Each case has a model and data sets (inputs, expected outputs) and its tolerance.  A case is
*in scope* when every node of its model maps to a kernel of the board's table; the others are
counted as skipped with the ops they lack.  A case passes when compile → export (raw blob) → run
gives outputs with the expected dtype and shape, equal within ONNX's backend tolerance
(the case's ``rtol``/``atol``, by default ``rtol=1e-3, atol=1e-7``).

The ``runner`` is a callable ``runner(library_path, inputs: dict[str, ndarray], num_outputs)
-> list[ndarray]``: one of ``conformance_rpc``'s, which take each case to a board over RPC (the
command line starts a local ``rpcsrv serve`` for that), or the tests' in-process runner.

Inputs that decide output *shapes* (a Reshape target, Expand shape, ...) are model inputs in these
cases; when shape inference cannot finish, the case is compiled again with its non-float inputs
bound as constants (TVM's ``bind_params`` step), which is recorded in the result.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rpcsrv.loader.opset import OPS, onnx_op_to_kernel

from .errors import CompileError
from .model import compile_onnx
from .onnx_import import board_dtype

RTOL, ATOL = 1e-3, 1e-7
Runner = Callable[[str, dict, int], list]


@dataclass
class CaseResult:
    name: str
    op: str
    ok: bool
    reason: str = ""
    bound: list[str] = field(default_factory=list)
    seconds: float = 0.0


@functools.lru_cache(maxsize=1)
def node_cases() -> list:
    """The ONNX backend's node test cases, generated in memory by the ``onnx`` wheel
    (``onnx.backend.test.case.node.collect_testcases``: ``name``, ``model``, ``data_sets``,
    ``rtol``, ``atol``)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the generators divide by zero on purpose
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases() if c.model is not None and c.data_sets]


def _primary_op(name: str, kernels: list[str]) -> str:
    """The op a case tests: the longest kernel name (underscores ignored) its name starts with."""
    flat = name.removeprefix("test_").replace("_", "")
    hits = [k for k in kernels if flat.startswith(k.replace("_", ""))]
    return max(hits, key=len) if hits else kernels[0]


def case_ops(model: onnx.ModelProto) -> list[str]:
    """Kernel names of the model's nodes ('domain:OpType' for foreign domains)."""
    return [onnx_op_to_kernel(n.op_type) if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
            for n in model.graph.node if n.op_type != "Constant" or n.domain not in ("", "ai.onnx")]


def _data_sets(case) -> list[tuple[dict, list]]:
    """(inputs by name, expected outputs) per data set; only plain tensors are accepted."""
    model = case.model
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    out = []
    for inputs, outputs in case.data_sets:
        values = [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
                  for v in list(inputs) + list(outputs)]
        if any(not isinstance(v, (np.ndarray, np.generic)) for v in values):
            raise CompileError("sequence/optional values are not supported (tensors only)")
        values = [np.asarray(v) for v in values]
        out.append((dict(zip(names, values[:len(inputs)])), values[len(inputs):]))
    return out


def _compare(got, want, rtol: float = RTOL, atol: float = ATOL) -> str:
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        try:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError:
            err = np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))) if g.size else 0
            return f"output {i}: values differ (max abs error {err:.3g})"
    return ""


def _reason(exc: Exception) -> str:
    """One line saying why: the server's own error rather than the RPC client's wrapping of it."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.rstrip(":").endswith("Error caught from RPC call")] or [""]
    kind = type(exc).__name__
    line = lines[0]
    return line if line.startswith(kind + ":") or (kind == "RPCError" and ": " in line) else f"{kind}: {line}"


def run_case(case, runner: Runner, tmp: str | None = None) -> CaseResult:
    """Compile, export and run one case with every test data set; never raises."""
    start = time.perf_counter()
    model = case.model
    ops = case_ops(model)
    result = CaseResult(case.name, _primary_op(case.name, ops) if ops else "constant", False)
    try:
        data = _data_sets(case)
        ins = data[0][0]
        try:
            compiled = compile_onnx(model)
        except CompileError as exc:
            if "without a static shape" not in str(exc):
                raise
            result.bound = [k for k, v in ins.items() if v.dtype.kind not in "fc"]
            if not result.bound:
                raise
            compiled = compile_onnx(model, bind_inputs={k: ins[k] for k in result.bound})
        with tempfile.TemporaryDirectory(dir=tmp) as d:
            path = compiled.export_library(os.path.join(d, "case.blob"))
            for ins, outs in data:
                feed = {k: v for k, v in ins.items() if k not in result.bound}
                got = runner(path, feed, len(compiled.output_names))
                result.reason = _compare(got, outs, getattr(case, "rtol", RTOL), getattr(case, "atol", ATOL))
                if result.reason:
                    break
        result.ok = not result.reason
    except CompileError as exc:
        result.reason = f"compile: {str(exc).splitlines()[0]}"
    except Exception as exc:  # a runner or kernel failure is this case's result
        result.reason = _reason(exc)
    result.seconds = time.perf_counter() - start
    return result


def _foreign_dtypes(case) -> list[str]:
    """Element types in the case's data or Cast targets that the board has no dtype for."""
    found = set()
    for inputs, outputs in case.data_sets:
        for v in list(inputs) + list(outputs):
            if isinstance(v, onnx.TensorProto):
                found.add(onnx.TensorProto.DataType.Name(v.data_type))
            elif isinstance(v, (np.ndarray, np.generic)) and board_dtype(v.dtype) is None:
                found.add(str(v.dtype))
    for node in case.model.graph.node:
        for a in node.attribute:
            if a.name == "to" and a.type == onnx.AttributeProto.INT:
                found.add(onnx.TensorProto.DataType.Name(a.i))
    bad = []
    for name in sorted(found):
        try:
            np_dtype = helper.tensor_dtype_to_np_dtype(onnx.TensorProto.DataType.Value(name))
        except Exception:
            np_dtype = name
        if board_dtype(np_dtype) is None:
            bad.append(name)
    return bad


def select_cases(supported=None):
    """(in-scope cases, {case name: why skipped}) for the given op set (default: all kernels).

    Skipped: cases with ops outside the set, with sequence/optional values, or with element types
    the board has no dtype for (bfloat16, float8, int4, ...).
    """
    supported = set(OPS if supported is None else supported)
    chosen, skipped = [], {}
    for case in node_cases():
        missing = sorted(set(case_ops(case.model)) - supported)
        foreign = _foreign_dtypes(case)
        values = [v for ins, outs in case.data_sets for v in list(ins) + list(outs)]
        if missing:
            skipped[case.name] = f"ops {', '.join(missing)}"
        elif any(not isinstance(v, (np.ndarray, np.generic, onnx.TensorProto)) for v in values):
            skipped[case.name] = "types: sequence or optional values (the board holds tensors only)"
        elif foreign:
            skipped[case.name] = f"dtypes {', '.join(foreign)}"
        else:
            chosen.append(case)
    return chosen, skipped


def report(results: list[CaseResult]) -> str:
    """A table per op: cases, passed, and the reason of each failure."""
    by_op: dict[str, list[CaseResult]] = {}
    for r in results:
        by_op.setdefault(r.op, []).append(r)
    passed = sum(r.ok for r in results)
    lines = [f"{'op':<24} {'cases':>5} {'pass':>5}"]
    for op in sorted(by_op):
        rs = by_op[op]
        lines.append(f"{op:<24} {len(rs):>5} {sum(r.ok for r in rs):>5}")
        for r in rs:
            if not r.ok:
                lines.append(f"    FAIL {r.name}: {r.reason}")
    pct = 100.0 * passed / len(results) if results else 0.0
    lines.append(f"total: {passed}/{len(results)} passed ({pct:.1f}%)")
    return "\n".join(lines)


@contextlib.contextmanager
def local_board(port: int = 19090, port_end: int = 19390):
    """``(host, port)`` of a board of our own: ``rpcsrv serve`` in a child process on a free loopback
    port, stopped on exit."""
    cmd = [sys.executable, "-m", "rpcsrv", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--port-end", str(port_end)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r"serving on (\S+):(\d+)", line)
        if found is None:
            proc.kill()
            raise RuntimeError(f"the local board did not start: {proc.stderr.read().strip() or line.strip()}")
        yield found.group(1), int(found.group(2))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    """``python -m rpcsrv.client.compiler.conformance [--ops add,sub] [--rpc HOST:PORT [--client tvm]]``:
    run the cases on a board (a local ``rpcsrv serve`` unless ``--rpc`` names one), print the table."""
    import argparse
    import warnings

    from .conformance_rpc import RUNNERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="restrict to these kernels (default: the whole table)")
    parser.add_argument("--rpc", metavar="HOST:PORT", help="run on this rpcsrv board (default: start one locally)")
    parser.add_argument("--client", choices=("ours", "tvm"), default="ours",
                        help="RPC client: rpcsrv.client.rpc (default) or the real TVM client")
    parser.add_argument("--key", default="", help="device key for --rpc")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    cases, skipped = select_cases(args.ops.split(",") if args.ops else None)
    with contextlib.ExitStack() as stack:
        if args.rpc:
            host, _, port = args.rpc.rpartition(":")
            host, port = host or "127.0.0.1", int(port)
        else:
            host, port = stack.enter_context(local_board())
        runner = RUNNERS[args.client](host, port, args.key)
        stack.callback(runner.close)
        results = [run_case(c, runner) for c in cases]
    print(report(results))
    kinds: dict[str, int] = {}
    for why in skipped.values():
        kinds[why.split()[0].rstrip(":")] = kinds.get(why.split()[0].rstrip(":"), 0) + 1
    print(f"skipped {len(skipped)} case(s): " + ", ".join(f"{n} for {k}" for k, n in sorted(kinds.items())))
    return 0 if sum(r.ok for r in results) >= 0.95 * len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
