"""The layers of docs/architecture.md, checked on the source: which package may import which.

cli -> farm -> board -> native -> executor -> loader -> protocol, and ``rpcsrv.client`` (the
folder ``client/``) only protocol and loader; the leaves ``config`` (the process's settings) and ``clikit``
import nothing.  Every import counts, also one inside a function.  Read with ``ast``, nothing is imported.
The rest of the house's rules (private names, settings, module globals) are tests/test_structure.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: package -> the rpcsrv packages it may import (besides itself); the top-level modules
#: (``rpcsrv/*.py``: the ``rpcsrv`` command, ``rpcsrv extract``) may import every package but the client
ALLOWED = {
    "rpcsrv.farm": {"rpcsrv.board", "rpcsrv.protocol", "rpcsrv.config"},  # tracker, proxy, graceful stop
    "rpcsrv.board": {"rpcsrv.native", "rpcsrv.executor", "rpcsrv.loader", "rpcsrv.protocol", "rpcsrv.config"},
    "rpcsrv.clikit": set(),  # command-line plumbing shared by both commands
    "rpcsrv.config": set(),  # the process's settings: the one reader of rpcsrv's environment variables
    "rpcsrv.protocol": set(),
    "rpcsrv.loader": {"rpcsrv.protocol", "rpcsrv.config"},
    "rpcsrv.executor": {"rpcsrv.loader", "rpcsrv.protocol", "rpcsrv.config"},
    "rpcsrv.native": {"rpcsrv.executor", "rpcsrv.loader", "rpcsrv.protocol", "rpcsrv.config"},
    "rpcsrv.client": {"rpcsrv.loader", "rpcsrv.protocol", "rpcsrv.clikit"},
}
#: known breaches, each to be removed (none at the time of writing): (importer, layer it may not import)
KNOWN: set[tuple[str, str]] = set()
PACKAGES = ("rpcsrv.client", "rpcsrv.farm", "rpcsrv.board", "rpcsrv.clikit", "rpcsrv.config", "rpcsrv.protocol",
            "rpcsrv.loader", "rpcsrv.executor", "rpcsrv.native")


def _module_name(path: Path) -> str:
    """The module's installed name (``client/`` installs as ``rpcsrv.client``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "client":
        parts.insert(0, "rpcsrv")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the first-party modules ``path`` imports."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # ``from . import x``
    return {m for m in found if m.split(".")[0] == "rpcsrv"}


def _layer(module: str) -> str:
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return "rpcsrv" if module.startswith("rpcsrv") else module


def _sources():
    for top in ("rpcsrv", "client"):
        yield from sorted((ROOT / top).rglob("*.py"))


EXECUTOR = ROOT / "rpcsrv" / "executor"


def _executor_files() -> list[Path]:
    """The executor's source files (Python, C, headers; not built libraries or caches)."""
    return sorted(p for p in EXECUTOR.rglob("*") if p.suffix in (".py", ".c", ".h") and "__pycache__" not in p.parts)


def test_executor_file_names_are_unique():
    """No two files under rpcsrv/executor/ share a name (``__init__.py`` aside): a name finds one file, in a
    traceback, a grep or a doc (and kbuild orders the C sources by name)."""
    files = _executor_files()
    assert len(files) > 50  # the walk found the tree
    seen: dict[str, list[str]] = {}
    for path in files:
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}


def test_executor_file_names_are_not_those_of_other_layers():
    """An executor module's name names no other file of ``rpcsrv/`` (``runtime.py``, ``machine.py`` and
    ``examplejson.py`` are the native layer's and the loader's)."""
    others = {p.name for p in (ROOT / "rpcsrv").rglob("*.py") if EXECUTOR not in p.parents}
    mine = {p.name for p in _executor_files()} - {"__init__.py"}
    assert {"runtime.py", "machine.py", "examplejson.py"} <= others
    assert not mine & others


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    me = _module_name(path)
    mine = _layer(me)
    for target in _imports(path):
        theirs = _layer(target)
        if target == "rpcsrv" or theirs == mine or (me, theirs) in KNOWN:
            continue
        if mine == "rpcsrv":
            assert theirs != "rpcsrv.client", f"{me} imports {target}: the board never imports the client"
            continue
        assert theirs in ALLOWED[mine], f"{me} imports {target}: {mine} may import only {sorted(ALLOWED[mine])}"
