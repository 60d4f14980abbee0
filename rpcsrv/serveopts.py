"""The ``rpcsrv serve`` options that ``rpcsrv check`` shares: their flags (limits, plugins, metrics),
the checks of their values before anything starts, and what they turn into (limits, the plugins
loaded).  ``CLIError`` is the one-line, status-2 error of every ``rpcsrv`` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .clikit import add_plugin_flags  # noqa: F401  (re-exported: the flags rpcsrv serve, check, inspect and extract take)


class CLIError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------------------- plugins

def load_plugins(args: argparse.Namespace) -> dict:
    """Load the plugins the flags choose (a broken one is one log line); returns the registry's report.  The
    choice stays with the registry (``rpcsrv.loader.plugins.choice``): a server's native workers load the same."""
    from .loader.plugins import load_plugins as load

    if args.plugin and args.no_plugins:
        raise CLIError("--plugin and --no-plugins exclude each other")
    return load(args.plugin, enabled=not args.no_plugins)


def plugin_line(report: dict) -> str:
    """``plugins: a (built-in), b (dist 1.0); failed: c; skipped: d``: one line for logs and inspect."""
    line = "plugins: " + ", ".join(f"{p['name']} ({p['source']})" for p in report["loaded"])
    if report["failed"]:
        line += "; failed: " + ", ".join(f"{p['name']} ({p['error']})" for p in report["failed"])
    if report["skipped"]:
        line += "; not loaded: " + ", ".join(report["skipped"])
    return line



# ---------------------------------------------------------------------------------------------- serve

def check_serve_args(args: argparse.Namespace) -> None:
    """Flag values that cannot work, refused before anything starts."""
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port {args.port} is not a TCP port (0-65535; 0 picks a free one)")
    if args.port_end is not None:
        if not 0 < args.port_end <= 65536:
            raise CLIError(f"--port-end {args.port_end} is not a TCP port (1-65536, exclusive)")
        if args.port_end <= args.port:
            raise CLIError(f"--port-end {args.port_end} must be greater than --port {args.port} "
                           f"(ports port..port-end-1 are tried)")
    for flag in ("max_memory_mb", "max_workspace_mb", *_LIMIT_MB_FLAGS):
        value = getattr(args, flag, None)
        if value is not None and value <= 0:
            raise CLIError(f"--{flag.replace('_', '-')} {value} must be a positive number of MB")
    for flag in _LIMIT_FLAGS:
        value = getattr(args, flag, None)
        if value is not None and value <= 0:
            raise CLIError(f"--{flag.replace('_', '-')} {value} must be positive")
    for flag in ("health_interval", "call_timeout"):  # (serve's own: check has neither)
        value = getattr(args, flag, None)
        if value is not None and not 0 < value < float("inf"):
            raise CLIError(f"--{flag.replace('_', '-')} must be a positive number of seconds, got {value:g}")
    if getattr(args, "call_timeout", None) is not None and (args.no_native or args.native != "isolated"
                                                            or not sys.platform.startswith("linux")):
        raise CLIError("--call-timeout needs --native isolated on Linux: a call running in the server process "
                       "cannot be stopped, only one in a session's worker process")
    from .native.replay import MAX_SPIN  # (the loan loop's bound: the worker refuses a longer poll)

    poll, most = getattr(args, "poll_us", 0), round(MAX_SPIN * 1e6)
    if not 0 <= poll <= most:
        raise CLIError(f"--poll-us {poll} must be 0 (sleep at once) to {most} microseconds")
    if args.workdir is not None:
        path = Path(args.workdir)
        if path.exists() and not path.is_dir():
            raise CLIError(f"--workdir {args.workdir!r} is a file, not a folder")
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise CLIError(f"--workdir {args.workdir!r} is not writable")
        if not path.exists() and not path.parent.is_dir():
            raise CLIError(f"--workdir {args.workdir!r}: its parent folder does not exist")
    _check_metrics_args(args)


def build_settings(args: argparse.Namespace):
    """``--cache-dir`` and ``--build`` as the board's build settings (``rpcsrv.config.toolchain``)."""
    from .config.toolchain import BuildSettings

    return BuildSettings(Path(args.cache_dir) if args.cache_dir else None, args.build != "off")


# the metrics endpoint's flags ------------------------------------------------------------------------
def _check_metrics_args(args: argparse.Namespace) -> None:
    if args.metrics_port is None:
        if args.metrics_host is not None:
            raise CLIError("--metrics-host needs --metrics-port")
        return
    if not 0 <= args.metrics_port <= 65535:
        raise CLIError(f"--metrics-port {args.metrics_port} is not a TCP port (0-65535; 0 picks a free one)")
    for name in ("prometheus_client", "h11"):
        try:
            __import__(name)
        except ImportError:
            raise CLIError(f"--metrics-port needs the Python package {name}: pip install 'rpcsrv[metrics]'") from None


def add_metrics_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics (/metrics), a status page (/) and /healthz on this port "
                        "(default: off; needs the 'metrics' extra)")
    s.add_argument("--metrics-host", default=None,
                   help="address of the metrics port (default: --host)")


#: the limit flags (``add_limit_flags``) that are rpcsrv.board.limits.Limits fields as given, and those in MB
_LIMIT_FLAGS = ("max_connections", "max_sessions", "max_handles", "max_ndim", "idle_timeout", "max_threads")
_LIMIT_MB_FLAGS = {"max_total_memory_mb": "max_total_memory", "max_packet_mb": "max_packet"}


def hardening_limits(args: argparse.Namespace) -> dict:
    """The limits given on the command line (absent ones keep rpcsrv.board.limits' defaults)."""
    out = {name: getattr(args, name) for name in _LIMIT_FLAGS if getattr(args, name, None) is not None}
    for flag, field in _LIMIT_MB_FLAGS.items():
        if getattr(args, flag, None) is not None:
            out[field] = getattr(args, flag) << 20
    return out


def add_limit_flags(s: argparse.ArgumentParser) -> None:
    """Flags of rpcsrv.board.limits.Limits (defaults and their reasons are documented there and in the README)."""
    s.add_argument("--max-total-memory-mb", type=int, default=None,
                   help="memory budget of all sessions together (default: half of physical memory)")
    s.add_argument("--max-connections", type=int, default=None, help="open sockets at once (default 512)")
    s.add_argument("--max-sessions", type=int, default=None, help="handshaken sessions at once (default 128)")
    s.add_argument("--max-handles", type=int, default=None, help="live handles per session (default 65536)")
    s.add_argument("--max-packet-mb", type=int, default=None, help="largest packet accepted (default 4096)")
    s.add_argument("--max-ndim", type=int, default=None, help="most tensor dimensions on the wire (default 32)")
    s.add_argument("--idle-timeout", type=float, default=None,
                   help="seconds without traffic before a connection is dropped (default 900)")
    s.add_argument("--max-threads", type=int, default=None, help="worker threads for all sessions (default 16)")
