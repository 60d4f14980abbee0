"""``rpcsrv`` command line: ``serve`` (the board's RPC server) and ``inspect`` (read a library)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import trio


def _serve(args: argparse.Namespace) -> int:
    from .protocol import Dialect
    from .server import ServerConfig
    from .session import Limits

    cfg = ServerConfig(
        host=args.host, port=args.port, port_end=args.port_end, key=args.key or "",
        workdir=Path(args.workdir) if args.workdir else None,
        dialect=None if args.dialect == "auto" else Dialect(args.dialect),
        limits=Limits(max_memory=args.max_memory_mb << 20, max_workspace=args.max_workspace_mb << 20),
        native="off" if args.no_native else args.native,
    )

    # deployment (rpcsrv/board.py): tracker, proxy, graceful SIGTERM/SIGINT, farm logs
    from .board import BoardOptions, run_board
    from .farmlog import configure
    from .registration import parse_hostport

    configure(args.verbose, args.log_json)
    try:
        opts = BoardOptions(tracker=parse_hostport(args.tracker, "--tracker") if args.tracker else None,
                            custom_addr=args.custom_addr,
                            proxy=parse_hostport(args.proxy, "--proxy") if args.proxy else None)
    except ValueError as exc:
        print(f"rpcsrv: error: {exc}", file=sys.stderr)
        return 2
    if (opts.tracker or opts.proxy) and not cfg.key:
        print("rpcsrv: error: --tracker and --proxy need --key", file=sys.stderr)
        return 2
    try:
        trio.run(run_board, cfg, opts)
    except KeyboardInterrupt:
        print("rpcsrv: stopped", file=sys.stderr)
    except OSError as exc:
        print(f"rpcsrv: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .loader import LoaderError
    from .loader.inspect import format_inspection, inspect_library

    try:
        info = inspect_library(args.file)
    except (LoaderError, OSError) as exc:
        print(f"rpcsrv inspect: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_inspection(info, disasm=args.disasm))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpcsrv", description="TVM RPC server for boards without TVM")
    p.add_argument("-v", "--verbose", action="store_true", help="log each session")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve TVM RPC clients")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9090)
    s.add_argument("--port-end", type=int, default=None, help="try ports up to this one (exclusive)")
    s.add_argument("--key", default="", help="the key clients must present (TVM's rpc key)")
    s.add_argument("--workdir", default=None, help="parent folder of the per-session workspaces")
    s.add_argument("--dialect", choices=["auto", "classic", "ffi"], default="auto",
                   help="packed-argument encoding: detect per client (default) or fix it")
    s.add_argument("--max-memory-mb", type=int, default=4096, help="device memory per session")
    s.add_argument("--max-workspace-mb", type=int, default=4096, help="workspace bytes per session")
    s.add_argument("--tracker", metavar="HOST:PORT", help="register with this TVM RPC tracker under --key")
    s.add_argument("--custom-addr", help="address the tracker hands to clients (default: what it sees)")
    s.add_argument("--proxy", metavar="HOST:PORT", help="serve through this TVM RPC proxy instead of listening")
    s.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    s.add_argument("--native", choices=["isolated", "inprocess", "off"], default="isolated",
                   help="native host code in uploaded libraries: run it in a worker process per session "
                        "(default; a crash ends only that session), in the server process (trusted "
                        "boards), or refuse it")
    s.add_argument("--no-native", action="store_true", help="refuse libraries with native code (--native off)")
    s.set_defaults(func=_serve)
    i = sub.add_parser("inspect", help="show what an exported library holds")
    i.add_argument("file")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--disasm", action="store_true", help="disassemble Relax VM executables")
    i.set_defaults(func=_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
