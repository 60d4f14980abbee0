"""The loader's own structure: no import circle between its modules, no import hidden inside a
function to dodge one, and nothing imported from the layers above it (design: server -> executor ->
loader -> protocol).  Read from the source with ``ast``, so a new module is checked as soon as it exists."""

from __future__ import annotations

import ast
from pathlib import Path

import rpcsrv.loader

LOADER = Path(rpcsrv.loader.__file__).parent


def _name(path: Path) -> str:
    """Dotted name inside the loader ("" for the package itself, "opset.ops" for a subpackage's)."""
    parts = list(path.relative_to(LOADER).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    return {_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(LOADER.rglob("*.py"))}


def _targets(path: Path, tree: ast.Module) -> list[tuple[ast.ImportFrom, list[str] | None]]:
    """Each relative import and the loader-internal dotted path it names (None: outside the loader)."""
    name = _name(path)
    package = [p for p in (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".") if p]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            up = node.level - 1
            inside = up <= len(package)
            base = package[:len(package) - up] if inside else []
            found.append((node, base + (node.module.split(".") if node.module else []) if inside else None))
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> loader modules it imports (``from .x import``, ``from ..x import``, ``from . import x``)."""
    mods = _modules()
    graph = {}
    for name, (path, tree) in mods.items():
        deps = set()
        for node, target in _targets(path, tree):
            if target is None:
                continue
            candidates = [".".join(target + [a.name]) for a in node.names] + [".".join(target)]
            deps.update(c for c in candidates if c in mods)
        graph[name] = deps - {name}
    return graph


def test_no_import_circle_in_the_loader():
    graph = _graph()
    del graph[""]  # the package front imports everything and nobody imports it back
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
    for name, (path, tree) in _modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"{path.name}: import inside {fn.name}() at line {inner[0].lineno}"


def test_loader_imports_only_the_protocol_from_rpcsrv():
    for name, (path, tree) in _modules().items():
        for node, target in _targets(path, tree):
            if target is None:
                top = (node.module or "").split(".")[0]
                assert top == "protocol", f"{path.name} imports rpcsrv.{node.module} (allowed: protocol)"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("rpcsrv"):
                assert node.module.startswith("rpcsrv.protocol"), f"{path.name} imports {node.module}"
