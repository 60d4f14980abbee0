"""``rpcsrv`` command line: ``serve`` (the board's RPC server), ``inspect`` and ``extract`` (read a library),
``check`` (the board's self-test, rpcsrv/check.py).

One function adds each subcommand's parser (``SUBCOMMANDS``), so a new flag or subcommand is a few
lines in one place.  Every failure the user can act on (a busy port, a bad flag value, a file that is
not a library, a closed pipe) is one line ``rpcsrv: error: ...`` and exit status 2, never a traceback.
``--help`` shows each flag's default; ``-v`` works before or after the subcommand.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Callable

import trio

from .clikit import broken_pipe, command_parser, package_version, verbose_after
from .serveopts import (CLIError, add_limit_flags, add_metrics_flags, hardening_limits, add_plugin_flags,
                        build_settings, check_serve_args, load_plugins, plugin_line)

try:
    _Group = BaseExceptionGroup  # noqa: F821 - a builtin from Python 3.11
except NameError:  # Python 3.10: the backport trio depends on
    from exceptiongroup import BaseExceptionGroup as _Group


def _first_oserror(exc: BaseException) -> OSError | None:
    """The OSError inside ``exc``, looking into (trio's) exception groups."""
    if isinstance(exc, OSError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _first_oserror(inner)
        if found is not None:
            return found
    return None


def serve_options(args: argparse.Namespace):
    """The ``ServeOptions`` the flags say (checked first), and how the server computes as its environment says."""
    from .board.limits import Limits
    from .board.options import NativeOptions, ServeOptions
    from .executor.compute import ComputeSettings
    from .native.confine import ConfineOptions
    from .protocol import Dialect

    check_serve_args(args)
    return ServeOptions(
        host=args.host, port=args.port, port_end=args.port_end, key=args.key or "",
        workdir=Path(args.workdir) if args.workdir else None,
        dialect=None if args.dialect == "auto" else Dialect(args.dialect),
        limits=Limits(max_memory=args.max_memory_mb << 20, max_workspace=args.max_workspace_mb << 20,
                      **hardening_limits(args)),
        native=NativeOptions("off" if args.no_native else args.native, args.isolate,
                             ConfineOptions(args.native_confine == "on", args.native_user, tuple(args.native_env))),
        poll_us=args.poll_us, compute=ComputeSettings.from_environment("RPCSRV_COMPUTE_NICE"),
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, build=build_settings(args),
        health_interval=args.health_interval, call_timeout=args.call_timeout)


def run_serve(args: argparse.Namespace) -> int:
    from .board.server import Server

    options = serve_options(args)

    # deployment (rpcsrv/farm/): tracker, proxy, graceful SIGTERM/SIGINT, farm logs
    from .farm.run import BoardOptions, run_board
    from .farm.logs import configure
    from .farm.registration import parse_hostport

    configure(args.verbose, args.log_json)
    logging.getLogger("rpcsrv.plugins").info(plugin_line(load_plugins(args)))
    _log_confinement(options)
    try:
        opts = BoardOptions(tracker=parse_hostport(args.tracker, "--tracker") if args.tracker else None,
                            custom_addr=args.custom_addr,
                            proxy=parse_hostport(args.proxy, "--proxy") if args.proxy else None,
                            self_test=_self_test(options))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if (opts.tracker or opts.proxy) and not options.key:
        raise CLIError("--tracker and --proxy need --key")
    try:
        trio.run(run_board, Server(options), opts)
    except KeyboardInterrupt:
        print("rpcsrv: stopped", file=sys.stderr)
    except (OSError, OverflowError, _Group) as exc:
        err = _first_oserror(exc)
        if err is None:
            if isinstance(exc, OverflowError):
                raise CLIError(f"cannot listen on {options.host}:{options.port}: {exc}") from None
            raise
        where = f"{options.host}:{options.port}" + (f"-{options.port_end - 1}" if options.port_end else "")
        raise CLIError(f"cannot listen on {where}: {err.strerror or err}") from None
    return 0


def _self_test(options):
    """The board's self-test for --health-interval: ``rpcsrv check``'s smoke runs, as the flags run native code."""
    if not options.health_interval:
        return None
    import functools

    from .check import self_test

    native = options.native
    return functools.partial(self_test, native.mode, options.limits.max_memory, native.confine)


def _log_confinement(options) -> None:
    """--native-confine/--native-user/--native-env: checked and logged once at start-up."""
    from .native import confine

    native = options.native
    log = logging.getLogger("rpcsrv.native")
    if native.mode == "inprocess":
        log.warning("native code runs unconfined in the server process (--native inprocess): it has all the "
                    "server's rights")
    if native.mode != "isolated":
        return
    layers = confine.layers(native.confine)
    if native.confine.enabled and layers["identity"].startswith("absent"):
        raise CLIError(layers["identity"][len("absent: "):])
    log.info("native worker confinement:\n%s", confine.report(layers))
    for name, state in layers.items():
        if not state.startswith("in force"):
            log.warning("native worker confinement: %s %s", name, state)


def add_serve_parser(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("serve", help="serve TVM RPC clients (the board side)",
                       description="Serve TVM RPC clients of both generations (classic TVM 0.7-0.20 and "
                                   "tvm-ffi TVM >= 0.21) on a TCP port.  Each connection gets its own "
                                   "session with a private workspace folder, removed when it ends.")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=9090, help="TCP port (0: any free port)")
    s.add_argument("--port-end", type=int, default=None,
                   help="try ports --port .. PORT_END-1 until one is free (like TVM's server)")
    s.add_argument("--key", default="", help="the key clients must present (TVM's rpc key; default: none)")
    s.add_argument("--workdir", default=None,
                   help="parent folder of the per-session workspaces (default: the system temp folder)")
    s.add_argument("--dialect", choices=["auto", "classic", "ffi"], default="auto",
                   help="packed-argument encoding: detect per client, or fix it to one TVM generation")
    s.add_argument("--max-memory-mb", type=int, default=4096, help="device memory per session, MB")
    s.add_argument("--max-workspace-mb", type=int, default=4096, help="workspace (uploaded files) per session, MB")
    add_limit_flags(s)
    s.add_argument("--tracker", metavar="HOST:PORT", help="register with this TVM RPC tracker under --key")
    s.add_argument("--custom-addr", help="address the tracker hands to clients (default: what it sees)")
    s.add_argument("--proxy", metavar="HOST:PORT", help="serve through this TVM RPC proxy instead of listening")
    s.add_argument("--poll-us", type=int, default=300, metavar="US",
                   help="after each answer, poll this long for the client's next request before sleeping (the "
                        "session's worker too, while it answers repeated native calls): a core busy up to US "
                        "microseconds per call for a faster round trip; 0 sleeps at once, as TVM's server does "
                        "(default 300)")
    s.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    add_metrics_flags(s)
    s.add_argument("--native", choices=["isolated", "inprocess", "off"], default="isolated",
                   help="native host code in uploaded libraries: run it in a worker process per session "
                        "(a crash ends only that session; confined, see --native-confine), in the server "
                        "process (trusted boards only: unconfined, native code has the server's rights), or "
                        "refuse it")
    s.add_argument("--no-native", action="store_true", help="refuse libraries with native code (--native off)")
    s.add_argument("--isolate", choices=["native", "all", "auto"], default="auto",
                   help="which libraries load in the session's worker process (with --native isolated): "
                        "those whose native code runs; all (every session computes in a process of its "
                        "own: sessions share no interpreter lock, any crash ends only its session; a "
                        "process per session and one message per call); or auto: all for a session that "
                        "loads while another session computes in the server, else native")
    add_plugin_flags(s)
    # --- native worker confinement (rpcsrv/native/confine.py) ---
    s.add_argument("--native-confine", choices=["on", "off"], default="on",
                   help="confine each session's native worker (--native isolated) before it loads uploaded "
                        "code: files (Landlock: its workspace only), no sockets, no fork/exec, no signals or "
                        "ptrace to other processes, an unprivileged user, a scrubbed environment, a memory "
                        "limit from --max-memory-mb. 'off' gives native code the server's rights. "
                        "--native inprocess is never confined: native code runs in the server itself")
    s.add_argument("--native-user", default="nobody",
                   help="the user a root server's native workers run as (default nobody)")
    s.add_argument("--native-env", action="append", default=[], metavar="NAME",
                   help="an environment variable passed to native workers (repeatable; NAME* for a prefix); "
                        "besides BLAS/OpenMP thread settings, no variable of the server's reaches them")
    # --- end native worker confinement ---
    s.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where the board caches the native shim and compiled kernels it builds (default: "
                        "$RPCSRV_CACHE_DIR, else ~/.cache/rpcsrv)")
    s.add_argument("--build", choices=["background", "off"], default="background",
                   help="build the native shim and this CPU's compiled kernels with the board's C compiler "
                        "(serve: in the background from its start, what is cached or prebuilt, else numpy, "
                        "serving until then, and native workers never compile; check: now, ahead of time), "
                        "or never run the compiler")
    # --- health and the call watchdog (rpcsrv/board/health.py, rpcsrv/native/proxy.py) ---
    s.add_argument("--health-interval", type=float, default=None, metavar="S",
                   help="run the board's self-test (rpcsrv check's smoke runs, a native call in a worker "
                        "included) every S seconds while no session is open; while it fails the board leaves "
                        "the tracker or proxy, /healthz answers 503 with the reason, and it rejoins when the "
                        "test passes (default: no self-test)")
    s.add_argument("--call-timeout", type=float, default=None, metavar="S",
                   help="a native call or graph run taking longer than S seconds is cut: its worker is killed, "
                        "the client gets an error saying so and the session ends (TVM's C++ server kills a "
                        "session's process at the client's -timeout; this bounds each call); every library then "
                        "loads in the session's worker (--isolate all). "
                        "Needs --native isolated (default: no limit but the session's timeout)")
    s.set_defaults(func=run_serve)
    return s


# -------------------------------------------------------------------------------------------- inspect

def run_inspect(args: argparse.Namespace) -> int:
    from .loader import LoaderError
    from .loader.inspect import format_inspection, inspect_library

    plugins = load_plugins(args)
    try:
        info = inspect_library(args.file)
    except (LoaderError, OSError) as exc:
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CLIError(text if text.startswith(f"{args.file}:") else f"{args.file}: {text}") from None
    info["plugins"] = plugins
    print(json.dumps(info, indent=2) if args.json else
          format_inspection(info, disasm=args.disasm) + "\n" + plugin_line(plugins))
    return 0


def add_inspect_parser(sub) -> argparse.ArgumentParser:
    i = sub.add_parser("inspect", help="show what an exported library holds",
                       description="Show the container, blob layout, module tree, graph inputs and outputs, "
                                   "params and ExampleJSON subgraphs of a TVM-exported library.")
    i.add_argument("file", help="the library (.so, .dylib, .o, .tar or raw blob)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--disasm", action="store_true", help="disassemble Relax VM executables")
    add_plugin_flags(i)
    i.set_defaults(func=run_inspect)
    return i


# -------------------------------------------------------------------------------------------- extract

def run_extract(args: argparse.Namespace) -> int:
    from .extract import extract_library
    from .loader import LoaderError

    load_plugins(args)
    try:
        manifest = extract_library(args.file, args.output, only=args.only)
    except (LoaderError, OSError, ValueError) as exc:
        raise CLIError(f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
    for entry in manifest["files"]:
        print(f"{entry['path']}: {entry['what']}")
    print(f"wrote {len(manifest['files'])} file(s) and manifest.json to {args.output}")
    return 0


def add_extract_parser(sub) -> argparse.ArgumentParser:
    e = sub.add_parser("extract", help="write every part of a library as plain files",
                       description="Write the parts of a library as plain files: graph JSON, params (TVM "
                                   "param dict and .npz), ExampleJSON subgraphs, each module payload's raw "
                                   "bytes by type key, the host symbols, and manifest.json saying what "
                                   "each file is.")
    e.add_argument("file", help="the library (.so, .dylib, .o, .tar or raw blob)")
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write (created)")
    e.add_argument("--only", metavar="TYPE_KEY", default=None,
                   help="only the modules of this type key (e.g. examplejson, GraphExecutorFactory)")
    add_plugin_flags(e)
    e.set_defaults(func=run_extract)
    return e


# ---------------------------------------------------------------------------------------------- check

def add_check_parser(sub) -> argparse.ArgumentParser:
    """``rpcsrv check`` (rpcsrv/check.py): takes serve's limit and native flags, copied from its parser."""
    from .check import add_parser

    return add_parser(sub, add_serve_parser(argparse.ArgumentParser().add_subparsers()))


# ---------------------------------------------------------------------------------------------- main

#: subcommand name -> function adding its parser
SUBCOMMANDS: dict[str, Callable] = {"serve": add_serve_parser, "inspect": add_inspect_parser,
                                    "extract": add_extract_parser, "check": add_check_parser}


def build_parser() -> argparse.ArgumentParser:
    p, sub = command_parser("rpcsrv", "A TVM RPC server for boards without the TVM runtime, and tools to read "
                                      "the libraries it runs.", f"rpcsrv {package_version()}", "log each session")
    for add in SUBCOMMANDS.values():
        add(sub)
    verbose_after(sub, "log each session")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        print(f"rpcsrv: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return broken_pipe("rpcsrv")


if __name__ == "__main__":
    sys.exit(main())
