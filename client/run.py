"""``byoc run``: upload a compiled library to a board, run it, fetch the outputs.

    byoc run model.so --host 127.0.0.1 --port 9090 --input x=x.npy [-o out.npz]

Uses our pure-Python client (no TVM needed), shows a progress bar for large uploads and prints how
long each phase took.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from . import rpc
from .graph_executor import GraphModule


class UserError(Exception):
    """A problem with what the user asked for (printed without a traceback)."""


def parse_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    """``name=file.npy`` (or a ``.npz`` file whose arrays are named after the inputs)."""
    inputs: dict[str, np.ndarray] = {}
    for spec in specs:
        if "=" not in spec and spec.endswith(".npz"):
            with np.load(spec) as z:
                inputs.update({k: z[k] for k in z.files})
            continue
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--input expects name=file.npy, got {spec!r}")
        if not os.path.exists(path):
            raise UserError(f"input file {path!r} does not exist")
        inputs[name] = np.load(path)
    return inputs


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


def run_library(lib_path: str, host: str, port: int, key: str = "", inputs: Optional[dict] = None,
                progress: bool = True) -> tuple[list[np.ndarray], Timer]:
    """Upload, load, create the graph executor on ``cpu(0)``, set inputs, run, fetch all outputs."""
    path = Path(lib_path)
    if not path.is_file():
        raise UserError(f"library {lib_path!r} does not exist")
    timer = Timer()
    with timer.phase("connect"):
        try:
            sess = rpc.connect(host, port, key=key)
        except OSError as exc:
            raise UserError(f"cannot reach the board at {host}:{port}: {exc}") from None
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
    return outputs, timer


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a compiled library on a board through RPC")
    p.add_argument("library")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--key", default="")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for each), or a .npz holding all of them")
    p.add_argument("-o", "--output", default=None, help="save outputs to this .npz")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    outputs, timer = run_library(args.library, args.host, args.port, args.key, parse_inputs(args.input),
                                 progress=not args.no_progress)
    for i, out in enumerate(outputs):
        print(f"output {i}: shape {out.shape} dtype {out.dtype} "
              f"min {out.min() if out.size else '-'} max {out.max() if out.size else '-'}")
    if args.output:
        np.savez(args.output, **{f"output_{i}": o for i, o in enumerate(outputs)})
        print(f"saved {len(outputs)} output(s) to {args.output}")
    print(timer.summary())
    return 0
