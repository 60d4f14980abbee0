"""Command-line plumbing shared by ``rpcsrv`` and ``byoc``: help that shows defaults, the version
string, the one-line exit on a closed pipe, and the board-plugin flags both commands take.

A leaf package (it imports nothing of rpcsrv), so the client may use it like the protocol and the
loader: both commands then look and fail alike without either importing the other.
"""

from __future__ import annotations

import argparse
import os
import sys


class HelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default (when it has a meaningful one) after its help text."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or not action.option_strings \
                or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every parser of both commands: defaults shown in ``--help``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def command_parser(prog: str, description: str, version: str, verbose_help: str):
    """A command's top parser and its subparsers: ``--version``, and ``-v`` (see :func:`verbose_after`)."""
    parser = Parser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=version)
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help=f"{verbose_help} (also accepted after the subcommand)")
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)


def verbose_after(sub, verbose_help: str) -> None:
    """``prog SUBCOMMAND -v`` as well as ``prog -v SUBCOMMAND``, for every subcommand of ``sub`` that
    has no ``-v`` of its own (absent there, the top parser's value stays)."""
    for child in sub.choices.values():
        if "-v" not in child._option_string_actions:
            child.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                               help=verbose_help)


def package_version() -> str:
    """The installed rpcsrv distribution's version (both commands ship in it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rpcsrv")
    except PackageNotFoundError:
        return "unknown (not installed)"


def broken_pipe(prog: str) -> int:
    """The reader went away (``prog ... | head``): one line, no traceback now or at exit; status 2."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print(f"{prog}: error: output closed early (broken pipe)", file=sys.stderr)
    return 2


def add_plugin_flags(p: argparse.ArgumentParser) -> None:
    """``--plugin NAME`` / ``--no-plugins``: which installed board plugins (entry-point group
    ``rpcsrv.runtimes``) load; the built-in module kinds are always there."""
    p.add_argument("--plugin", action="append", metavar="NAME", default=None,
                   help="load only this installed plugin (repeat for several; default: every installed one)")
    p.add_argument("--no-plugins", action="store_true", help="load no installed plugin (built-in kinds only)")
