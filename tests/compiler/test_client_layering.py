"""The client (``client/``, installed as ``rpcsrv.client``) may import only ``rpcsrv.protocol`` and
``rpcsrv.loader`` (the wire and the library formats), never the board's executor or server.

Checked twice: statically on every client module's import statements at any depth (top level,
inside functions, ``importlib.import_module`` of a literal name), and by importing every client
module in a fresh interpreter and looking at what ended up in ``sys.modules`` (which also catches
a loader module that drags the executor in).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
ALLOWED = ("rpcsrv.protocol", "rpcsrv.loader", "rpcsrv.clikit",  # clikit: the CLI plumbing both commands share
           "rpcsrv.client")  # itself: client/ installs as rpcsrv.client


def imported_names(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module name) of every import in ``source``; relative imports resolved against ``module``.

    ``from X import Y`` gives both ``X`` and ``X.Y`` (Y may be a submodule)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = module.split(".")
            base = parts[:len(parts) - node.level] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, name)] + [(node.lineno, f"{name}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def forbidden(names: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The rpcsrv modules among ``names`` outside protocol and loader (the bare package is harmless)."""
    return [(line, n) for line, n in names if n.startswith("rpcsrv.")
            and not any(n == a or n.startswith(a + ".") for a in ALLOWED)]


MODULES = sorted(CLIENT.rglob("*.py"))


def _module_name(path: Path) -> str:
    """``client/x/y.py`` -> ``rpcsrv.client.x.y`` (the name it installs under)."""
    return "rpcsrv." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(ROOT)) for p in MODULES])
def test_client_module_imports_only_protocol_and_loader(path):
    importer = _module_name(path) + (".__init__" if path.name == "__init__.py" else "")  # a package is its own base
    assert forbidden(imported_names(path.read_text(), importer)) == []


def test_the_static_check_sees_every_spelling():
    source = ("import rpcsrv.executor\nfrom rpcsrv.board import server\nfrom rpcsrv.executor.kernels import KERNELS\n"
              "def f():\n    from rpcsrv.board.session import Session\n    importlib.import_module('rpcsrv.cli')\n"
              "from rpcsrv.loader.opset import OPS\nfrom rpcsrv.protocol import Connection\nfrom . import rpc\n")
    assert [n for _, n in forbidden(imported_names(source, "rpcsrv.client.m"))] == [
        "rpcsrv.executor", "rpcsrv.board", "rpcsrv.board.server", "rpcsrv.executor.kernels",
        "rpcsrv.executor.kernels.KERNELS",
        "rpcsrv.board.session", "rpcsrv.board.session.Session", "rpcsrv.cli"]
    assert ("rpcsrv.client.rpc" in {n for _, n in imported_names("from .. import rpc", "rpcsrv.client.compiler.model")})


def test_importing_every_client_module_loads_no_executor_or_server():
    names = [_module_name(p) for p in MODULES if p.name != "__main__.py"]
    code = (f"import importlib, json, sys\nfor m in {names!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rpcsrv.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(m.startswith("rpcsrv.loader.opset") for m in loaded)  # the catalogue is what the compiler reads
    assert forbidden([(0, m) for m in loaded]) == []
