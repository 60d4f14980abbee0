"""``pip install rpcsrv`` installs what the board imports and nothing else (issue 24): every
third-party module the board's code (``rpcsrv/``, the client ``rpcsrv.client`` aside) imports is one of
pyproject.toml's ``dependencies``, the client's onnx and rich are not among them, and importing every
board module works with the client-side packages made unimportable."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from conftest import REPO, need_module

tomllib = need_module("tomllib", "Python >= 3.11 reads pyproject.toml")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: distribution name -> the module it installs, where they differ
MODULE_OF = {"pyelftools": "elftools"}
#: imported only inside ``try``, with a fallback: (module, why it is not a dependency)
OPTIONAL = {"ml_dtypes": "bfloat16 arrays only; it comes with apache-tvm",
            "exceptiongroup": "Python 3.10 only, where trio already depends on it"}
CLIENT_SIDE = ("onnx", "onnxruntime", "rich", "tvm", "matplotlib")


def _dependencies() -> set[str]:
    names = {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0] for dep in PYPROJECT["project"]["dependencies"]}
    return {MODULE_OF.get(n, n) for n in names}


def _board_imports() -> dict[str, list[tuple[str, bool]]]:
    """module -> [(file, inside a try)] for every absolute third-party import under rpcsrv/."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted((REPO / "rpcsrv").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "rpcsrv":
                    found.setdefault(top, []).append((str(path.relative_to(REPO)), id(node) in guarded))
    return found


def test_the_board_imports_only_its_declared_dependencies():
    deps = _dependencies()
    for module, where in _board_imports().items():
        if module in OPTIONAL:
            assert all(inside for _, inside in where), f"{module} is optional ({OPTIONAL[module]}) but " \
                f"imported outside a try in {[f for f, inside in where if not inside]}"
            continue
        assert module in deps, f"{[f for f, _ in where]} import {module}, which is not in pyproject.toml's " \
                               f"dependencies (the board would not have it)"


def test_the_client_packages_are_an_extra_not_a_board_dependency():
    deps = _dependencies()
    assert not deps & set(CLIENT_SIDE), f"the board pulls in client packages: {sorted(deps & set(CLIENT_SIDE))}"
    extras = PYPROJECT["project"]["optional-dependencies"]
    client = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0] for d in extras["client"]}
    assert {"onnx", "rich"} <= client
    assert PYPROJECT["project"]["scripts"]["byoc"] == "rpcsrv.client.entry:main"


_WALK = """
import importlib.abc, importlib, pkgutil, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked for this test: {name}", name=name)
sys.meta_path.insert(0, Block())
import rpcsrv
count = 0
for info in pkgutil.walk_packages(rpcsrv.__path__, "rpcsrv."):
    if info.name.startswith("rpcsrv.client") or info.name.endswith("__main__"):
        continue
    importlib.import_module(info.name)
    count += 1
from rpcsrv.cli import build_parser
build_parser()
print(count, sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_every_board_module_imports_without_the_client_packages():
    done = subprocess.run([sys.executable, "-c", _WALK, ",".join(CLIENT_SIDE)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    count, loaded = done.stdout.split(" ", 1)
    assert int(count) > 50 and loaded.strip() == "[]"


def test_byoc_without_the_client_packages_says_what_to_install():
    code = ("import sys, importlib.abc\n"
            "class B(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'onnx':\n"
            "            raise ModuleNotFoundError('blocked', name=name)\n"
            "sys.meta_path.insert(0, B())\n"
            "from rpcsrv.client.entry import main\nsys.exit(main(['--help']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("byoc: error: the client tools need onnx, which this install lacks: "
                                   "pip install \"rpcsrv[client]\"")
