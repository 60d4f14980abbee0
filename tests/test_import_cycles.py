"""No import circles among the project's own modules: ``rpcsrv/``, ``client/`` (``rpcsrv.client``)
and ``bench/`` (its scripts import each other by their bare names, with ``bench/`` on ``sys.path``).

Every import counts, also one inside a function: an import moved into a function to break a circle
only hides it.  The graph is read with ``ast`` (nothing is imported); a circle is a strongly connected
component of more than one module (or a module importing itself), found with Tarjan's algorithm.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rpcsrv", "client", "bench")
#: circles known and being removed elsewhere, each to go (none left)
KNOWN: list[frozenset] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "client":
        parts.insert(0, "rpcsrv")
    elif parts[0] == "bench":
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    base = importer.split(".")
    base = base[:len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([module] if module else []))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The first-party modules ``name`` imports (anywhere in it), by their names."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, is_package, node.level, node.module)
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            targets = subs if subs and len(subs) == len(node.names) else [target, *subs]
        else:
            continue
        for t in targets:
            while t and t not in known:  # ``import a.b.c`` of a non-module attribute: its module
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # a package's own parents run first anyway
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(frozenset(comp))
    return found


def test_the_finder_finds_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_imports_count(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def x():\n    from .a import y\n")
    known = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    g = {n: imports(n, p, known) for n, p in known.items()}
    assert cycles(g) == [frozenset({"p.a", "p.b"})]


def test_the_graph_is_read():  # the real tree: the edges the layers are made of are there
    g = graph()
    assert "rpcsrv.protocol.codec" in g["rpcsrv.protocol.connection"]
    assert "rpcsrv.client.compiler.opsets" in g["rpcsrv.client.compiler.onnx_import"]
    assert "zoo_bench" in g["concurrency_bench"]  # a function-level import between bench scripts
    assert len(g) > 100


def test_no_import_circles():
    found = [c for c in cycles(graph()) if c not in KNOWN]
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


if __name__ == "__main__":
    for c in cycles(graph()):
        print(" <-> ".join(sorted(c)))
    sys.exit(0)
