"""``--help`` for every command and flag (defaults shown), ``--version``, ``-v`` on either side."""

from __future__ import annotations

import argparse

import pytest

from rpcsrv.client.cli import build_parser as byoc_parser
from rpcsrv.cli import build_parser as rpcsrv_parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("make", [byoc_parser, rpcsrv_parser])
def test_every_command_and_flag_has_help(make):
    parser = make()
    for name, child in {"": parser, **subparsers(parser)}.items():
        for action in child._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{parser.prog} {name}: {action.dest} has no help text"
        text = child.format_help()
        assert child.description or not name, f"{name} has no description"
        assert "usage:" in text


def test_serve_help_shows_host_port_and_limits_defaults(capsys):
    with pytest.raises(SystemExit) as stop:
        rpcsrv_parser().parse_args(["serve", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 127.0.0.1)", "(default: 9090)", "(default: 4096)", "(default: auto)"):
        assert shown in text


def test_run_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        byoc_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1)" in text and "(default: 9090)" in text


@pytest.mark.parametrize("make,prog", [(byoc_parser, "byoc"), (rpcsrv_parser, "rpcsrv")])
def test_version(make, prog, capsys):
    with pytest.raises(SystemExit) as stop:
        make().parse_args(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(prog) and any(ch.isdigit() for ch in out)


@pytest.mark.parametrize("argv", [["-v", "inspect", "x.so"], ["inspect", "x.so", "-v"], ["inspect", "-v", "x.so"]])
def test_rpcsrv_verbose_before_or_after_the_subcommand(argv):
    assert rpcsrv_parser().parse_args(argv).verbose is True
    assert rpcsrv_parser().parse_args(["inspect", "x.so"]).verbose is False


@pytest.mark.parametrize("argv", [["-v", "compile", "m.onnx", "-o", "m.so"], ["compile", "m.onnx", "-o", "m.so", "-v"],
                                  ["run", "m.so", "-v"], ["-v", "run", "m.so"]])
def test_byoc_verbose_before_or_after_the_subcommand(argv):
    assert byoc_parser().parse_args(argv).verbose is True
    assert byoc_parser().parse_args(["run", "m.so"]).verbose is False
