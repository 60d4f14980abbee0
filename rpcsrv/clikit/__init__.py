"""Command-line plumbing shared by ``rpcsrv`` and ``byoc``: help that shows defaults, the version
string, and the one-line exit on a closed pipe.

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
