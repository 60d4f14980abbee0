"""The ``byoc`` command: compile ONNX models into BYOC libraries (and run them on a board).

Subcommands are registered, each by one function ``add_parser(subparsers)`` that adds its parser
and sets ``func`` (``func(args) -> exit status``):

* ``SUBCOMMANDS`` holds the ones defined here (``compile``);
* ``PLUGIN_MODULES`` names modules that define ``add_parser`` themselves (``client.run``,
  ``client.demo``, ``client.bench``); a module that does not exist (yet) is skipped.

User errors (``CompileError``) print ``byoc: error: ...`` and exit with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable

from .compiler import CompileError, parse_shape
from .export import FORMATS, LAYOUTS

PLUGIN_MODULES = ("client.run", "client.demo", "client.bench", "client.profile", "client.compare")


def _input_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, shape = item.rpartition("=")
        if not sep or not name:
            raise CompileError(f"bad --input-shape {item!r}: expected NAME=SHAPE, e.g. data=1x3x224x224")
        if name in shapes:
            raise CompileError(f"--input-shape given twice for {name!r}")
        shapes[name] = parse_shape(shape)
    return shapes


def run_compile(args: argparse.Namespace) -> int:
    """``byoc compile``: compile, export, print what was written."""
    from .compiler import compile_onnx

    shapes = _input_shapes(args.input_shape or [])
    compiled = compile_onnx(args.model, input_shapes=shapes, ops=args.ops)
    path = compiled.export_library(args.output, fmt=args.format, layout=args.layout, cc=args.cc)
    if not args.quiet:
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {args.layout} layout)")
        print(compiled.summary())
    if args.verbose:
        for sg in compiled.subgraphs:
            print(f"\n# ExampleJSON of {sg.symbol}\n{sg.code}", end="")
        print(f"\n# graph JSON\n{compiled.graph_json}")
    return 0


def add_compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile an ONNX model into a BYOC library",
                       description="Compile an ONNX model for the ExampleJSON accelerator and write the "
                                   "library a board loads (.so, .tar or raw blob).")
    p.add_argument("model", help="the ONNX model file")
    p.add_argument("-o", "--output", required=True, help="library to write (model.so, model.tar, model.blob)")
    p.add_argument("--input-shape", action="append", metavar="NAME=SHAPE",
                   help="concrete shape of an input with dynamic dimensions, e.g. data=1x3x224x224 "
                        "(repeat for several inputs)")
    p.add_argument("--ops", help="comma-separated ops the accelerator has (default: every kernel of the "
                                 "board), e.g. add,sub,mul")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from the file name: .so/.dylib, "
                                                     ".tar, .tar.gz/.tgz/.tar.bz2/.tar.xz, .blob)")
    p.add_argument("--layout", choices=tuple(LAYOUTS), default="classic",
                   help="blob layout: TVM's classic one or tvm-ffi's (default classic)")
    p.add_argument("--cc", help="C compiler for .so/.tar, e.g. arm-linux-gnueabihf-gcc (default: cc)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print each subgraph's ExampleJSON text and the graph JSON")
    p.set_defaults(func=run_compile)


#: subcommand name -> function adding its parser
SUBCOMMANDS: dict[str, Callable] = {"compile": add_compile_parser}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="byoc", description="Compile ONNX models into TVM BYOC "
                                     "libraries without TVM, and run them on an rpcsrv board.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in SUBCOMMANDS.values():
        add(sub)
    for name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        if name.rpartition(".")[2] not in sub.choices and hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CompileError as exc:
        print(f"byoc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("byoc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
