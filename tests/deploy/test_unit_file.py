"""deploy/rpcsrv.service starts ``rpcsrv serve`` with flags the command line really has."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from conftest import REPO
from rpcsrv.cli import build_parser

UNIT = REPO / "deploy" / "rpcsrv.service"


def _exec_start() -> str:
    text = UNIT.read_text()
    m = re.search(r"^ExecStart=(.*?)(?<!\\)$", text, re.M | re.S)
    return m.group(1).replace("\\\n", " ")


def _expand(cmd: str, env: dict) -> list[str]:
    # systemd: ${X} is one argument, $X splits on whitespace
    words = []
    for word in shlex.split(cmd):
        m = re.fullmatch(r"\$\{(\w+)\}", word)
        if m:
            words.append(env[m.group(1)])
        elif re.fullmatch(r"\$(\w+)", word):
            words += env[word[1:]].split()
        else:
            words.append(word)
    return words


def test_exec_start_parses_with_the_documented_settings():
    cmd = _exec_start()
    for args in ["", "--tracker tracker.lab:9190 --custom-addr 10.0.0.17 --log-json", "--proxy proxy.lab:9090"]:
        env = {"RPCSRV_HOST": "0.0.0.0", "RPCSRV_PORT": "9090", "RPCSRV_KEY": "board-x",
               "RUNTIME_DIRECTORY": "/run/rpcsrv", "CACHE_DIRECTORY": "/var/cache/rpcsrv", "RPCSRV_ARGS": args}
        argv = _expand(cmd, env)
        assert argv[0].endswith("/rpcsrv")
        ns = build_parser().parse_args(argv[1:])
        assert ns.command == "serve" and ns.key == "board-x" and ns.workdir == "/run/rpcsrv"
        assert ns.cache_dir == "/var/cache/rpcsrv"  # a DynamicUser has no home to cache its builds in
    assert "--tracker tracker.lab:9190" in UNIT.read_text()  # the documented example is the tested one


def test_unit_is_valid_for_systemd():
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # the parse test above still holds; systemd-analyze only adds syntax checks
    out = subprocess.run([analyze, "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    # the only complaint allowed on a machine without the install: the venv's rpcsrv is absent
    problems = [x for x in out.stderr.splitlines() if x.strip() and "is not executable" not in x]
    assert problems == [], out.stderr
