"""What the install must bring: the ``tvm`` extra covers what TVM's own RPC server, tracker and proxy
import (a fresh virtualenv lacked ``cloudpickle``, so TVM's server never started), and the ``demo``
extra what ``byoc demo`` needs; the ``client`` extra (onnx, rich) is what ``byoc`` needs beyond the
board.  (``.ci/run`` installs into a fresh virtualenv, so a missing line in
pyproject.toml fails there; these tests say which line.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_module

PYPROJECT = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()


def extra(name: str) -> list[str]:
    m = re.search(rf"^{name} = \[(.*?)\]", PYPROJECT, flags=re.M | re.S)
    assert m, f"pyproject.toml has no extra {name!r}"
    return [re.split(r"[<>=\[ ]", s.strip().strip('"'))[0] for s in m.group(1).split(",") if s.strip()]


def test_extras_declare_what_tvm_tools_and_the_demo_import():
    assert {"apache-tvm", "cloudpickle", "tornado", "psutil"} <= set(extra("tvm"))
    assert "onnxruntime" in extra("demo")
    assert {"onnx", "rich"} <= set(extra("client"))  # byoc; the board's own install goes without them


def test_the_readme_commands_install_the_client_tools():
    """The board install is lean (tests/install/test_imports.py), so the scripts behind the README's two
    commands must ask for the client extra themselves."""
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    for name in ("demo.sh", "test.sh"):
        installs = re.findall(r"pip install [^\n]*'\.\[([a-z,]+)\]'", (scripts / name).read_text())
        assert installs and "client" in installs[0].split(","), f"scripts/{name} installs {installs}"


@pytest.mark.tvm
@pytest.mark.parametrize("module", ["tvm.exec.rpc_server", "tvm.rpc.tracker", "tvm.rpc.proxy", "cloudpickle", "psutil"])
def test_tvm_tools_import(module):
    need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"import {module} failed; is it in the tvm extra?\n{done.stderr[-800:]}"
