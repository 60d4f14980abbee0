"""The loader's own structure: no import circle between its modules, no import hidden inside a
function to dodge one, and nothing imported from the layers above it (design: server -> executor ->
loader -> protocol).  Read from the source with ``ast``, so a new module is checked as soon as it exists."""

from __future__ import annotations

import ast
from pathlib import Path

import rpcsrv.loader

LOADER = Path(rpcsrv.loader.__file__).parent


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(LOADER.glob("*.py"))}


def _relative_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]


def _graph() -> dict[str, set[str]]:
    """Module -> loader modules it imports (``from .x import`` and ``from . import x``)."""
    mods = _modules()
    graph = {}
    for name, tree in mods.items():
        deps = set()
        for node in _relative_imports(tree):
            if node.level == 1 and node.module:
                deps.add(node.module.split(".")[0])
            elif node.level == 1:
                deps.update(a.name for a in node.names if a.name in mods)
        graph[name] = deps - {name}
    return graph


def test_no_import_circle_in_the_loader():
    graph = _graph()
    del graph["__init__"]  # the package front imports everything and nobody imports it back
    state: dict[str, int] = {}

    def visit(mod: str, path: list[str]) -> None:
        if state.get(mod) == 2 or mod not in graph:
            return
        assert state.get(mod) != 1, f"import circle: {' -> '.join(path + [mod])}"
        state[mod] = 1
        for dep in sorted(graph[mod]):
            visit(dep, path + [mod])
        state[mod] = 2

    for mod in graph:
        visit(mod, [])


def test_no_import_inside_a_function():
    for name, tree in _modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"loader/{name}.py: import inside {fn.name}() at line {inner[0].lineno}"


def test_loader_imports_only_the_protocol_from_rpcsrv():
    for name, tree in _modules().items():
        for node in _relative_imports(tree):
            if node.level >= 2:
                top = (node.module or "").split(".")[0]
                assert top == "protocol", f"loader/{name}.py imports rpcsrv.{node.module} (allowed: protocol)"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("rpcsrv"):
                assert node.module.startswith("rpcsrv.protocol"), f"loader/{name}.py imports {node.module}"
