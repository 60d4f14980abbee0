"""The ``byoc`` command: compile ONNX models into BYOC libraries (and run them on a board).

Subcommands are registered, each by one function ``add_parser(subparsers)`` that adds its parser
and sets ``func`` (``func(args) -> exit status``):

* ``SUBCOMMANDS`` holds the ones defined here (``compile``);
* ``PLUGIN_MODULES`` names modules that define ``add_parser`` themselves (``rpcsrv.client.run``,
  ``rpcsrv.client.demo``, ``rpcsrv.client.bench``); a module that does not exist (yet) is skipped.

User errors (``CompileError``, ``run.UserError``, RPC and loader errors, ``OSError``) print one line
``byoc: error: ...`` and exit with status 2, never a traceback; so does a closed pipe (``| head``).
Every parser shows defaults in ``--help``; ``-v`` is accepted before or after the subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable

from rpcsrv.clikit import broken_pipe, command_parser, package_version, verbose_after

from .compiler import CompileError, parse_shape
from .export import FORMATS, LAYOUTS

PLUGIN_MODULES = tuple(f"rpcsrv.client.{name}" for name in ("run", "demo", "bench", "profile", "compare"))


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
    compiled = compile_onnx(args.model, input_shapes=shapes, ops=args.ops, host_fallback=not args.no_host,
                            codegen=args.codegen)
    executor = getattr(args, "executor", "graph")
    layout = "ffi" if executor == "relax" else args.layout
    path = compiled.export_library(args.output, fmt=args.format, layout=layout, cc=args.cc, executor=executor)
    if not args.quiet:
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {layout} layout, {executor} executor)")
        print(compiled.summary())
    if args.verbose:
        for sg in compiled.subgraphs:
            print(f"\n# {compiled.codegen_title} of {sg.symbol}\n{sg.code}", end="")
        print(f"\n# graph JSON\n{compiled.graph_json}")
    return 0


def add_compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile an ONNX model into a BYOC library",
                       description="Compile an ONNX model for a BYOC accelerator (--codegen) and write the "
                                   "library a board loads (.so, .tar or raw blob).")
    p.add_argument("model", help="the ONNX model file")
    p.add_argument("-o", "--output", required=True, help="library to write (model.so, model.tar, model.blob)")
    p.add_argument("--input-shape", action="append", metavar="NAME=SHAPE",
                   help="concrete shape of an input with dynamic dimensions, e.g. data=1x3x224x224 "
                        "(repeat for several inputs)")
    p.add_argument("--codegen", default="examplejson", metavar="NAME",
                   help="the accelerator's codegen: the built-in examplejson or an installed one (entry-point "
                        "group byoc.codegens)")
    p.add_argument("--ops", help="comma-separated ops the accelerator has (default: every op of the "
                                 "codegen), e.g. add,sub,mul; a float op names its int8 forms too (conv: "
                                 "q_linear_conv of a quantized model)")
    p.add_argument("--no-host", action="store_true",
                   help="refuse nodes outside --ops instead of compiling them to host C functions")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from the file name: .so/.dylib, "
                                                     ".tar, .tar.gz/.tgz/.tar.bz2/.tar.xz, .blob)")
    p.add_argument("--layout", choices=tuple(LAYOUTS), default="classic",
                   help="blob layout: TVM's classic one or tvm-ffi's (default classic)")
    p.add_argument("--cc", help="C compiler for .so/.tar, e.g. arm-linux-gnueabihf-gcc (default: cc)")
    p.add_argument("--executor", choices=["graph", "relax"], default="graph",
                   help="graph: a graph executor library (TVM 0.7-0.20 clients); relax: a Relax VM executable "
                        "(TVM >= 0.21 clients, relax.VirtualMachine; tvm-ffi layout)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="also print each subgraph's text (ExampleJSON, or the codegen's listing) and the graph JSON")
    p.set_defaults(func=run_compile)


#: subcommand name -> function adding its parser
SUBCOMMANDS: dict[str, Callable] = {"compile": add_compile_parser}


#: help of the flags several subcommands share (used where a subcommand gives none)
COMMON_HELP = {
    "host": "the board's address", "port": "the board's port",
    "key": "the key the board was started with (rpcsrv serve --key)",
    "library": "a library compiled by `byoc compile` (.so, .tar or raw blob)",
}


def build_parser() -> argparse.ArgumentParser:
    parser, sub = command_parser("byoc", "Compile ONNX models into TVM BYOC libraries without TVM, and run them "
                                         "on an rpcsrv board.", f"byoc (rpcsrv) {package_version()}", "more output")
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
    for choice in sub._choices_actions:  # a subcommand without a description shows its help line
        child = sub.choices[choice.dest]
        child.description = child.description or (choice.help[:1].upper() + choice.help[1:] + ".")
    for child in sub.choices.values():
        for action in child._actions:  # the board flags every subcommand shares, said once here
            if not action.help and action.dest in COMMON_HELP:
                action.help = COMMON_HELP[action.dest]
    verbose_after(sub, "more output")
    return parser


def _user_errors() -> tuple:
    """Exceptions that are the user's or the environment's doing: one line, exit status 2."""
    from rpcsrv.loader import LoaderError

    from .rpc import RPCError
    from .run import UserError

    return CompileError, UserError, RPCError, LoaderError, OSError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return broken_pipe("byoc")
    except _user_errors() as exc:
        text = str(exc) if not isinstance(exc, OSError) or not exc.strerror else \
            f"{exc.strerror}" + (f": {exc.filename!r}" if exc.filename else "")
        print(f"byoc: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("byoc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
