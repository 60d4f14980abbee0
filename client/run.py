"""``byoc run``: upload a compiled library to a board, run it, fetch the outputs.

    byoc run model.so --host 127.0.0.1 --port 9090 --input x=x.npy [-o out.npz]

Everything that can be checked without the board is checked first, so that a mistake costs no
upload: the library is read locally (``rpcsrv.loader``) for its inputs and outputs, each ``--input``
must name one of them with the right shape and dtype, every input must be given, and ``-o`` must be
writable.  Outputs are saved under the model's own output names (kept in the graph JSON).

Uses our pure-Python client (no TVM needed), shows a progress bar for large uploads and prints how
long each phase took.

The library is read here as the board reads it, so the installed board plugins (entry-point group
``rpcsrv.runtimes``) load first, as ``rpcsrv serve`` loads them: ``--plugin NAME`` / ``--no-plugins``
choose (:func:`load_board_plugins`; ``byoc profile`` and ``byoc compare`` take the same flags).
"""

from __future__ import annotations

import argparse
import os
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from rpcsrv.clikit import add_plugin_flags

from . import rpc
from .graph_executor import GraphModule


class UserError(Exception):
    """A problem with what the user asked for (printed as one line, without a traceback)."""


def load_board_plugins(args: argparse.Namespace) -> dict:
    """Load the installed board plugins the flags choose (every one by default), so that a library with a
    plugin's modules can be read here; returns the registry's report (``rpcsrv.loader.plugins.report``)."""
    from rpcsrv.loader.plugins import load_plugins

    chosen, off = getattr(args, "plugin", None), getattr(args, "no_plugins", False)
    if chosen and off:
        raise UserError("--plugin and --no-plugins exclude each other")
    return load_plugins(chosen, enabled=not off)


def plugin_failures() -> str:
    """``; plugin x failed to load: ...`` for the plugins that did not load (for a library that needs one)."""
    from rpcsrv.loader.plugins import report

    return "".join(f"; plugin {p['name']} failed to load: {p['error']}" for p in report()["failed"])


@dataclass
class Signature:
    """A library's graph inputs (name -> (shape, dtype)) and output names, read from the file."""

    inputs: dict[str, tuple[tuple[int, ...], str]]
    outputs: list[str]


def read_signature(lib_path: str) -> Signature:
    """The inputs and outputs of the library's (first) graph executor factory."""
    import json

    from rpcsrv.loader import GraphExecutorFactoryModule, LoaderError, load_library
    from rpcsrv.loader.inspect import summarize_graph

    if not Path(lib_path).is_file():
        raise UserError(f"library {lib_path!r} does not exist")
    try:
        modules = load_library(lib_path).modules()
    except (LoaderError, OSError) as exc:
        raise UserError(f"cannot read library {lib_path!r}: {exc}{plugin_failures()}") from None
    factories = [m for m in modules if isinstance(m, GraphExecutorFactoryModule)]
    if not factories:
        raise UserError(f"library {lib_path!r} has no graph executor factory (nothing `byoc run` can run)")
    g = summarize_graph(factories[0].graph_json, factories[0].params)
    if "graph_error" in g:
        raise UserError(f"library {lib_path!r}: {g['graph_error']}")
    inputs = {i["name"]: (tuple(i["shape"] or ()), i["dtype"]) for i in g.get("inputs", [])}
    try:
        names = json.loads(factories[0].graph_json).get("metadata", {}).get("output_names") or []
    except (ValueError, AttributeError):
        names = []
    count = len(g.get("outputs", []))
    if len(names) != count or not all(isinstance(n, str) for n in names) or len(set(names)) != count:
        names = [f"output_{i}" for i in range(count)]  # a library made elsewhere: no names kept
    return Signature(inputs, names)


def _load_array(path: str, name: str) -> np.ndarray:
    if not os.path.exists(path):
        raise UserError(f"input file {path!r} does not exist")
    try:
        value = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"input {name!r}: {path!r} is not a .npy file ({exc})") from None
    if isinstance(value, np.lib.npyio.NpzFile):
        value.close()
        raise UserError(f"input {name!r}: {path!r} is an .npz archive; give a .npy file for one input "
                        f"(or pass the .npz alone, --input {path}, with arrays named after the inputs)")
    return value


def _load_npz(path: str) -> dict[str, np.ndarray]:
    if not os.path.exists(path):
        raise UserError(f"input file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path!r} is not an .npz archive ({exc})") from None


def parse_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    """``name=file.npy`` (or a ``.npz`` file whose arrays are named after the inputs)."""
    inputs: dict[str, np.ndarray] = {}
    for spec in specs:
        if "=" not in spec and spec.endswith(".npz"):
            inputs.update(_load_npz(spec))
            continue
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--input expects NAME=FILE.npy (or one FILE.npz), got {spec!r}")
        inputs[name] = _load_array(path, name)
    return inputs


def check_inputs(inputs: dict[str, np.ndarray], sig: Signature) -> None:
    """Every input given, each by a name the graph has, with its shape and dtype."""
    expected = ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'} {d}" for n, (s, d) in sig.inputs.items())
    for name, value in inputs.items():
        if name not in sig.inputs:
            raise UserError(f"the model has no input {name!r} (inputs: {expected or 'none'})")
        shape, dtype = sig.inputs[name]
        if tuple(value.shape) != shape:
            raise UserError(f"input {name!r}: shape {'x'.join(map(str, value.shape)) or 'scalar'} given, "
                            f"the model wants {'x'.join(map(str, shape)) or 'scalar'}")
        if str(value.dtype) != dtype:
            raise UserError(f"input {name!r}: dtype {value.dtype} given, the model wants {dtype} "
                            f"(convert with x.astype('{dtype}'))")
    missing = [n for n in sig.inputs if n not in inputs]
    if missing:
        raise UserError(f"no value for input(s) {', '.join(missing)}: give --input NAME=FILE.npy for each "
                        f"(inputs: {expected})")


def check_output_path(path: Optional[str]) -> None:
    """``-o`` must be an ``.npz`` in an existing, writable folder (checked before the run)."""
    if path is None:
        return
    target = Path(path)
    if target.suffix != ".npz":
        raise UserError(f"-o {path!r}: outputs are saved as an .npz archive; name it *.npz")
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UserError(f"-o {path!r} is a folder")
    if not folder.is_dir():
        raise UserError(f"-o {path!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"-o {path!r}: not writable")


class Timer:
    def __init__(self):
        self.phases: list[tuple[str, float]] = []

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        yield
        self.phases.append((name, time.perf_counter() - t0))

    def summary(self) -> str:
        width = max(len(n) for n, _ in self.phases)
        lines = [f"  {n:<{width}}  {t * 1e3:9.1f} ms" for n, t in self.phases]
        total = sum(t for _, t in self.phases)
        return "\n".join(["timing:"] + lines + [f"  {'total':<{width}}  {total * 1e3:9.1f} ms"])


def upload_with_progress(sess: rpc.RPCSession, path: Path, show: bool) -> None:
    data = path.read_bytes()
    if not show or len(data) < (4 << 20):
        sess.upload(data, path.name)
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn()) as bar:
        task = bar.add_task(f"upload {path.name}", total=len(data))
        sess.upload(data, path.name, progress=lambda sent: bar.update(task, completed=sent))


def connect(host: str, port: int, key: str = "") -> rpc.RPCSession:
    """A session with the board, or a ``UserError`` that says why not."""
    try:
        return rpc.connect(host, port, key=key)
    except OSError as exc:
        raise UserError(f"cannot reach the board at {host}:{port}: {exc.strerror or exc}") from None
    except rpc.RPCError as exc:
        raise UserError(f"the board at {host}:{port} refused the session: {exc}") from None


def run_library(lib_path: str, host: str, port: int, key: str = "", inputs: Optional[dict] = None,
                progress: bool = True) -> tuple[list[np.ndarray], Timer]:
    """Upload, load, create the graph executor on ``cpu(0)``, set inputs, run, fetch all outputs."""
    path = Path(lib_path)
    if not path.is_file():
        raise UserError(f"library {lib_path!r} does not exist")
    timer = Timer()
    with timer.phase("connect"):
        sess = connect(host, port, key)
    try:
        with sess:
            with timer.phase("upload"):
                upload_with_progress(sess, path, progress)
            with timer.phase("load_module"):
                lib = sess.load_module(path.name)
            dev = sess.cpu(0)
            with timer.phase("create executor"):
                gmod = GraphModule(lib["default"](dev))
            with timer.phase("set inputs"):
                for name, value in (inputs or {}).items():
                    gmod.set_input(name, value)
            with timer.phase("run"):
                gmod.run()
            with timer.phase("get outputs"):
                outputs = [gmod.get_output(i).numpy() for i in range(gmod.get_num_outputs())]
    except rpc.RPCError as exc:
        raise UserError(f"the board reported: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}") \
            from None
    except OSError as exc:
        raise UserError(f"lost the connection to the board at {host}:{port}: {exc.strerror or exc}") from None
    return outputs, timer


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a compiled library on a board through RPC",
                       description="Upload a library to an rpcsrv board, run its graph on the given inputs "
                                   "and print (or save) the outputs.  Inputs are checked against the "
                                   "library before anything is sent.")
    p.add_argument("library", help="the library to run (.so, .tar or raw blob from `byoc compile`)")
    p.add_argument("--host", default="127.0.0.1", help="the board's address")
    p.add_argument("--port", type=int, default=9090, help="the board's port")
    p.add_argument("--key", default="", help="the key the board was started with (rpcsrv serve --key)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for each), or one .npz holding all of them by name")
    p.add_argument("-o", "--output", default=None, metavar="FILE.npz",
                   help="save the outputs, named as in the model, to this .npz")
    p.add_argument("--no-progress", action="store_true", help="no progress bar for large uploads")
    add_plugin_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    check_output_path(args.output)
    load_board_plugins(args)
    sig = read_signature(args.library)
    inputs = parse_inputs(args.input)
    check_inputs(inputs, sig)
    outputs, timer = run_library(args.library, args.host, args.port, args.key, inputs,
                                 progress=not args.no_progress)
    names = sig.outputs if len(sig.outputs) == len(outputs) else [f"output_{i}" for i in range(len(outputs))]
    for name, out in zip(names, outputs):
        print(f"{name}: shape {out.shape} dtype {out.dtype} "
              f"min {out.min() if out.size else '-'} max {out.max() if out.size else '-'}")
    if args.output:
        try:
            np.savez(args.output, **dict(zip(names, outputs)))
        except OSError as exc:
            raise UserError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
        print(f"saved {len(outputs)} output(s) to {args.output}")
    print(timer.summary())
    return 0
