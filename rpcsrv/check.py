"""``rpcsrv check``: the self-test of a new board.  What it says, in order:

* the machine (``uname``, the ELF machine of this Python, CPUs), Python, numpy and its BLAS
  (threadpoolctl);
* whether native code can run: which shim (prebuilt in the package, the cache, built by the board's
  compiler now, ``RPCSRV_NATIVE_SHIM``; with the compiled kernels, built into ``--cache-dir`` ahead of
  time, so that ``rpcsrv serve`` with the same flags finds them from its first session), which prebuilt
  ones the package holds, the compiler; if none fits, why and what to do;
* the limits in force, as ``rpcsrv serve`` with the same flags would set them (``check`` takes
  ``serve``'s limit and native flags, copied from its parser, so the two cannot drift apart);
* the sections other parts of rpcsrv provide, when installed (:data:`HOOKS`);
* two smoke runs, nothing compiled: an ExampleJSON graph built in memory with the loader's own
  builders, written as a raw blob and loaded like an upload; and the native kernel shipped prebuilt
  beside the shim (``rpcsrv/native/check_kernel.c``: tvm-ffi ABI, workspace, parallel tasks, errors),
  run the way the flags say (in a worker with ``--native isolated``).  Without a prebuilt kernel
  for this machine it is built by the board's compiler; with neither, the native smoke run is
  reported as not run, which is honest: such a board cannot run native code.

Exit status 0 when everything the flags enable works; 1 when a capability they enable is missing
(native code with ``--native isolated`` or ``inprocess`` and no shim, a failed smoke run, a hook that
reports a failure); 2 for a bad flag.  ``--json`` prints one JSON object instead of the text.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

#: (title, module, function) of the sections other parts provide; each is called if its module is
#: importable.  ``function()`` returns a dict with ``ok`` (bool) and ``summary`` (one line), optionally
#: ``required`` (a failure fails the check; default True) and more fields (kept in the JSON).
HOOKS = (
    ("confinement", "rpcsrv.native.confine", "report"),  # the native worker's confinement layers
    ("kernels", "rpcsrv.executor.kernels.clib.compiled", "report"),  # compiled executor kernels
)

#: ``serve`` flags that are not limits nor native options: ``check`` does not take them
_SERVE_ONLY = {"help", "verbose", "host", "port", "port_end", "key", "workdir", "dialect", "tracker", "custom_addr",
               "proxy", "log_json", "health_interval", "call_timeout"}


#: ``rpcsrv check --help``: what it does, in one line and in a paragraph
SUMMARY = "self-test this board: machine, BLAS, native code, limits, smoke runs"
DESCRIPTION = ("Print what this board is and can run (machine, Python, numpy's BLAS, native code: shim and compiler, "
               "the limits the flags set) and run an ExampleJSON and a native smoke test.  Takes the limit and "
               "native flags of `rpcsrv serve`; exits 1 if something they enable is missing.")


def add_parser(sub, serve_parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``check`` subcommand, with ``serve``'s limit and native flags (``serve_parser``'s actions)."""
    c = sub.add_parser("check", help=SUMMARY, description=DESCRIPTION)
    c.add_argument("--json", action="store_true", help="one JSON object instead of text")
    for action in serve_parser._actions:
        if action.dest not in _SERVE_ONLY:
            c._add_action(action)
    c.set_defaults(func=run_check)
    return c


# ------------------------------------------------------------------------------------------ sections

def machine() -> dict:
    from .native.machine import board

    return {"uname": " ".join(platform.uname()[i] for i in (0, 2, 4)), "elf": str(board()),
            "cpus": os.cpu_count()}


def python_numpy() -> dict:
    import numpy as np

    out: dict[str, Any] = {"python": f"{platform.python_implementation()} {platform.python_version()}",
                           "executable": sys.executable, "numpy": np.__version__, "blas": []}
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [{k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture",
                                                 "filepath")} for info in threadpool_info()
                       if info.get("user_api") == "blas"]
    except Exception as exc:  # threadpoolctl reads every loaded library; never let it stop the check
        out["blas_error"] = str(exc)
    return out


def native(mode: str) -> dict:
    from .native.shim import advice, status

    out = status()
    out["mode"] = mode
    out["required"] = mode != "off"
    if out["error"]:
        out["advice"] = advice()
    return out


def limits(args: argparse.Namespace) -> dict:
    from dataclasses import asdict

    from .board.limits import Limits
    from .serveopts import hardening_limits

    values = asdict(Limits(max_memory=args.max_memory_mb << 20, max_workspace=args.max_workspace_mb << 20,
                           **hardening_limits(args)))
    values.update(native="off" if args.no_native else args.native, isolate=args.isolate)
    return values


def _confine(args: argparse.Namespace) -> Any:
    """The confinement the serve flags ask for."""
    from .native.confine import ConfineOptions

    return ConfineOptions(args.native_confine == "on", args.native_user, tuple(args.native_env))


def hooks() -> dict:
    out = {}
    for title, module, function in HOOKS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue  # not part of this version
        try:
            result = getattr(mod, function)()
            out[title] = result if isinstance(result, dict) else {"ok": True, "summary": str(result)}
        except Exception as exc:
            out[title] = {"ok": False, "summary": f"{module}.{function}() failed: {type(exc).__name__}: {exc}"}
    return out


# ---------------------------------------------------------------------------------------- smoke runs

_EJ = "check_0\n  input 0 2 3\n  input 1 2 3\n  add 2 inputs: 0 1 shape: 2 3\n  mul 3 inputs: 2 1 shape: 2 3\n"


def _graph_json() -> str:
    entries = [[2, 3]] * 3
    return json.dumps({
        "nodes": [{"op": "null", "name": "x", "inputs": []}, {"op": "null", "name": "y", "inputs": []},
                  {"op": "tvm_op", "name": "check_0", "inputs": [[0, 0, 0], [1, 0, 0]],
                   "attrs": {"func_name": "check_0", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0, 1], "heads": [[2, 0, 0]], "node_row_ptr": [0, 1, 2, 3],
        "attrs": {"dltype": ["list_str", ["float32"] * 3], "storage_id": ["list_int", [0, 1, 2]],
                  "shape": ["list_shape", entries]}})


def _timed(run: Callable[[], str]) -> dict:
    start = time.perf_counter()
    try:
        detail = run()
    except Exception as exc:
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "detail": detail, "ms": round((time.perf_counter() - start) * 1e3, 1)}


def smoke_examplejson(folder: Path) -> dict:
    """(x + y) * y in an ExampleJSON subgraph under a graph executor factory, loaded from a raw blob."""
    import numpy as np

    from .executor import load_module
    from .loader import ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob
    from .protocol.dtypes import Device

    def run() -> str:
        tree = GraphExecutorFactoryModule(_graph_json(), {}, imports=[HostLibraryModule([], imports=[
            ExampleJSONModule(_EJ)])])
        blob = build_blob(tree)
        path = folder / "check.blob"
        path.write_bytes(len(blob).to_bytes(8, "little") + blob)
        ex = load_module(str(path)).get_function("default")(Device(1, 0))
        x, y = np.arange(6, dtype="float32").reshape(2, 3), np.full((2, 3), 1.5, "float32")
        ex.set_input("x", x)
        ex.set_input("y", y)
        ex.run()
        got = np.asarray(ex.get_output(0))
        if not np.allclose(got, (x + y) * y):
            raise AssertionError(f"wrong result {got.tolist()}")
        return "graph executor + ExampleJSON subgraph from a raw blob: (x + y) * y correct"
    return _timed(run)


def prepare(args: argparse.Namespace) -> None:
    """The shim and this CPU's compiled kernels built now, into the cache ``rpcsrv serve`` with the same
    ``--cache-dir`` uses (unless ``--build off``): a board prepared ahead of time serves them from its first
    session.  (The sections below report what was found or built.)"""
    from .config.toolchain import sweep
    from .serveopts import build_settings
    from .executor.kernels.clib import compiled
    from .native import shim

    settings = build_settings(args)
    sweep(settings.folder())  # what killed builds left there
    shim.POLICY.configure("inline", settings)
    compiled.POLICY.configure("inline", settings)
    compiled.reset()


def _check_kernel() -> tuple[Path | None, str]:
    from .native.shim import compiled, prebuilt

    for target, path, fits in prebuilt("libcheck.so"):
        if fits:
            return path, f"prebuilt for {target}"
    try:
        path = compiled("libcheck.so")
    except Exception as exc:
        return None, f"building it failed: {exc}"
    return (path, "built with this board's compiler") if path else (None, "no prebuilt kernel and no compiler")


def smoke_native(mode: str, max_memory: int, confine: Any = None, keep_spare: bool = False) -> dict:
    """The prebuilt check kernel through the server's own loading policy (a worker when isolated, confined
    as ``confine``, the serve flags' ``ConfineOptions``, says).  ``keep_spare``: a server's self-test, which
    leaves the warm spare worker running."""
    import numpy as np

    from .native.confine import ConfineOptions
    from .native.host import NativeSession

    if mode == "off":
        return {"ok": True, "detail": "not run: --native off", "skipped": True}
    path, origin = _check_kernel()
    if path is None:
        return {"ok": False, "detail": f"not run: {origin}"}

    def run() -> str:
        session = NativeSession(mode=mode, max_memory=max_memory, confine=confine or ConfineOptions())
        try:
            fn = session.load(str(path)).get_function("rpcsrv_check")
            a = np.linspace(-1, 1, 1000, dtype="float32")
            b = np.zeros_like(a)
            pointer = fn(a, b, 4)
            if not np.allclose(b, 2 * a + a.sum(dtype="float64"), atol=1e-3):
                raise AssertionError("wrong result from the native kernel")
            try:
                fn(a, b, 0)
            except Exception as exc:
                if "num_task must be" not in str(exc):
                    raise AssertionError(f"the kernel's error came back as: {exc}") from None
            else:
                raise AssertionError("the kernel's error did not reach Python")
            loan.append(_loan(session))
        finally:
            session.close()
            if not keep_spare:
                _stop_spare()
        where = "in a worker process" if mode == "isolated" else "in this process"
        return f"check kernel ({origin}) {where}: {pointer * 8}-bit pointers, 4 parallel tasks, errors ok"

    loan: list[str] = []
    out = _timed(run)
    if loan:
        out["loan"] = loan[0]
    return out


def _loan(session) -> str:
    """Whether the session's repeated native calls can be answered from the client's socket
    (``rpcsrv.native.replay``): what its confined worker reported, else this process's own reading."""
    confined = getattr(session, "confined", None)
    if confined is not None:
        return confined.get("loan", "absent: the worker did not say")
    from .native.replay import readiness

    return readiness()


def _stop_spare() -> None:
    """The server keeps a warm spare worker; ``check`` is not a server: stop it, and its starter."""
    process = sys.modules.get("rpcsrv.native.process")
    if process is not None:
        process.SPARES.close()


def self_test(mode: str, max_memory: int, confine: Any = None) -> list[str]:
    """The smoke runs alone, as a running server repeats them (``rpcsrv serve --health-interval``,
    ``rpcsrv.board.health``): the problems found, [] when both pass (the native one only where ``mode``
    runs native code)."""
    with tempfile.TemporaryDirectory(prefix="rpcsrv-health-") as folder:
        runs = {"examplejson": smoke_examplejson(Path(folder)),
                "native": smoke_native(mode, max_memory, confine, keep_spare=True)}
    return [f"{name} smoke run: {run['detail']}" for name, run in runs.items() if not run["ok"]]


# -------------------------------------------------------------------------------------------- report

def collect(args: argparse.Namespace) -> dict:
    from .serveopts import check_serve_args, load_plugins, plugin_line

    check_serve_args(argparse.Namespace(**{**vars(args), "port": 9090, "port_end": None, "workdir": None}))
    prepare(args)
    report: dict[str, Any] = {"machine": machine(), **python_numpy()}
    lim = limits(args)
    report["limits"] = lim
    report["native"] = native(lim["native"])
    plugins = load_plugins(args)  # the board plugins the flags choose, as `rpcsrv serve` loads them
    report["sections"] = {"plugins": {"ok": not plugins["failed"], "summary": plugin_line(plugins),
                                      "required": bool(args.plugin), **plugins}, **hooks()}
    with tempfile.TemporaryDirectory(prefix="rpcsrv-check-") as folder:
        report["smoke"] = {"examplejson": smoke_examplejson(Path(folder)),
                           "native": smoke_native(lim["native"], lim["max_memory"], _confine(args))}
    problems = [f"examplejson smoke run: {report['smoke']['examplejson']['detail']}"] \
        if not report["smoke"]["examplejson"]["ok"] else []
    if report["native"]["required"]:
        if report["native"]["error"]:
            problems.append(f"--native {lim['native']} needs native code, which cannot run here: "
                            f"{report['native']['error']}")
        elif not report["smoke"]["native"]["ok"]:
            problems.append(f"native smoke run: {report['smoke']['native']['detail']}")
    for title, section in report["sections"].items():
        if not section.get("ok", True) and section.get("required", True):
            problems.append(f"{title}: {section.get('summary', 'failed')}")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def _mb(n: int) -> str:
    return f"{n >> 20} MB"


def format_report(r: dict) -> str:
    m, n, lim = r["machine"], r["native"], r["limits"]
    blas = "; ".join(f"{b['internal_api']} {b['version']} ({b.get('architecture') or '?'}), "
                     f"{b['num_threads']} threads" for b in r["blas"]) \
        or r.get("blas_error", "none threadpoolctl can see (a reference BLAS?)")
    prebuilt = ", ".join(f"{t} ({w})" for t, w in n["prebuilt"].items()) or "none"
    lines = [f"machine   {m['uname']}; {m['elf']}; {m['cpus']} CPUs",
             f"python    {r['python']} ({r['executable']})",
             f"numpy     {r['numpy']}; BLAS: {blas}",
             f"native    --native {n['mode']}; shim: {n['shim'] or 'NONE'}",
             f"          compiler: {n['compiler'] or 'none'}; prebuilt in the package: {prebuilt}"]
    lines += [f"          passed over: {why}" for why in n["passed_over"]]
    if n["error"]:
        lines += [f"          cannot run native code: {n['error']}"]
    lines += [f"limits    memory {_mb(lim['max_memory'])}/session, {_mb(lim['max_total_memory'])} in all; "
              f"workspace {_mb(lim['max_workspace'])}/session; packets up to {_mb(lim['max_packet'])}",
              f"          {lim['max_connections']} connections, {lim['max_sessions']} sessions, "
              f"{lim['max_handles']} handles/session, {lim['max_ndim']} dims, {lim['max_threads']} threads, "
              f"idle timeout {lim['idle_timeout']:g} s; --isolate {lim['isolate']}"]
    for title, section in r["sections"].items():
        lines.append(f"{title:<9} {'ok' if section.get('ok', True) else 'FAILED'}: {section.get('summary', '')}")
    for name, smoke in r["smoke"].items():
        took = f" ({smoke['ms']} ms)" if "ms" in smoke else ""
        lines.append(f"smoke     {name}: {'ok' if smoke['ok'] else 'FAILED'}{took}: {smoke['detail']}")
        if "loan" in smoke:
            lines.append(f"          repeated native calls answered from the client's socket (loan): {smoke['loan']}")
    lines.append("result    OK" if r["ok"] else "result    FAILED: " + "; ".join(r["problems"]))
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    report = collect(args)
    print(json.dumps(report, indent=2, default=str) if args.json else format_report(report))
    return 0 if report["ok"] else 1
