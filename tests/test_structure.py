"""The house's rules that are not layers (those are tests/test_layers.py's), checked on the source with ``ast``:

* a package uses another's public names only (no ``from rpcsrv.native.worker import _send``);
* rpcsrv's environment variables (``RPCSRV_*``) are read in one module, ``rpcsrv/config/environment.py``,
  and each name read through it is one it declares;
* no module global is reassigned at run time (no ``global`` statement, no ``module.NAME = value`` on an
  imported module) outside tests: configuration is passed as objects;
* the board's concepts are declared once: DLPack's structures (ctypes derived from the protocol's construct
  declarations), graph JSON and ExampleJSON text parsed by one module each, the compiler and cache lookup in one
  place, the global functions over modules registered once, one registry of module kinds.

Nothing is imported to read the rules; the last group imports what it checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "rpcsrv" / "config" / "environment.py"


def _sources():
    for top in ("rpcsrv", "client"):
        yield from sorted((ROOT / top).rglob("*.py"))


SOURCES = list(_sources())


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "client":
        parts.insert(0, "rpcsrv")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """The package a module belongs to for these rules: ``rpcsrv.<package>``, or ``rpcsrv`` for the tools
    (``rpcsrv/*.py``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in _PACKAGES) else "rpcsrv"


_PACKAGES = {p.name for p in (ROOT / "rpcsrv").iterdir() if (p / "__init__.py").is_file()} | {"client"}


def _from_target(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    me = _module(path)
    base = (me if path.name == "__init__.py" else me.rpartition(".")[0]).split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_of_another_package_is_imported(path):
    mine = _package(_module(path))
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(path, node)
            if not target.startswith("rpcsrv") or _package(target) == mine:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            assert not private, f"{path.relative_to(ROOT)}:{node.lineno} imports {private} of {target}"


def _reads_environment(node: ast.AST) -> bool:
    """Whether ``node`` reads one environment variable: ``os.environ[...]`` read, ``os.environ.get(...)``,
    ``os.getenv(...)``, ``... in os.environ``."""
    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr in ("environ", "environb")
    if isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "getenv":
            return True
        if node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value):
            return True
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return any(is_environ(c) for c in node.comparators)
    return False


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_environment_variables_are_read_in_one_module(path):
    if path == CONFIG:
        return
    reads = [node.lineno for node in ast.walk(_tree(path)) if _reads_environment(node)]
    assert not reads, (f"{path.relative_to(ROOT)} reads the environment at lines {reads}: settings come from "
                       f"rpcsrv.config.environment, options from the objects passed down")


def test_every_setting_read_is_declared():
    """Each ``environment.<accessor>("NAME")`` names a declared variable, and every declared one is named by
    the code that reads it through the module."""
    from rpcsrv.config.environment import VARIABLES

    accessors = {"text", "flag", "count", "seconds", "is_set"}
    named: set[str] = set()
    for path in SOURCES:
        if path == CONFIG:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and node.value in VARIABLES:
                named.add(node.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in accessors \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "environment" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant):
                    assert arg.value in VARIABLES, f"{path.relative_to(ROOT)}:{node.lineno}: {arg.value} undeclared"
    assert named == set(VARIABLES), set(VARIABLES) ^ named


def _modules_bound(path: Path, tree: ast.Module) -> set[str]:
    """The names ``path`` binds to rpcsrv's modules (``import rpcsrv.x``, ``from . import compute``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("rpcsrv"))
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(path, node)
            if not target.startswith("rpcsrv"):
                continue
            folder = ROOT.joinpath(*(["client"] + target.split(".")[2:] if target.startswith("rpcsrv.client")
                                     else target.split(".")))
            out.update(a.asname or a.name for a in node.names
                       if (folder / f"{a.name}.py").is_file() or (folder / a.name / "__init__.py").is_file())
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_global_is_reassigned(path):
    tree = _tree(path)
    modules = _modules_bound(path, tree)
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{where}:{node.lineno}: global {', '.join(node.names)}"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                assert target.value.id not in modules, (f"{where}:{node.lineno}: assigns {target.value.id}."
                                                        f"{target.attr}, a global of another module")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            first = node.args[0]
            assert not (isinstance(first, ast.Name) and first.id in modules), f"{where}:{node.lineno}: setattr"


# ------------------------------------------------------------------------------------------ declared once

def test_dlpack_ctypes_are_derived_from_the_protocol_declarations():
    import ctypes

    from rpcsrv.executor.vm import ffi
    from rpcsrv.native import abi
    from rpcsrv.protocol import structs

    assert abi.DLTensorC is structs.DLTensorC and ffi.DLTensor is structs.DLTensorC
    assert abi.TVMValue.v_device.size == ctypes.sizeof(structs.DLDeviceC)
    fields = [name for name, _ in structs.DLTensorC._fields_]
    assert fields == [sub.name for sub in structs.DLTensorInMemory.subcons]
    assert ctypes.sizeof(structs.DLDataTypeC) == structs.DLDataType.sizeof()
    assert ctypes.sizeof(structs.DLDeviceC) == structs.DLDevice.sizeof()
    declared = [p for p in SOURCES if "class DLTensor(" in p.read_text() or "class DLDevice(" in p.read_text()]
    assert not declared, declared


def test_each_format_has_one_reader():
    """Graph JSON and ExampleJSON text are parsed by the loader alone, for the board's three readers of each;
    the C compiler and the cache folder are found in one place."""
    for rel in ("rpcsrv/executor/graph/executor.py", "rpcsrv/executor/graph/factory.py", "rpcsrv/loader/inspect.py",
                "rpcsrv/native/host.py"):
        text = (ROOT / rel).read_text()
        assert "graph_json import" in text and "json.loads" not in text, rel
    board = [p for p in SOURCES if p.parts[len(ROOT.parts)] == "rpcsrv"]
    lookups = [p.relative_to(ROOT) for p in board if '"gcc", "clang"' in p.read_text() or "RPCSRV_CACHE_DIR\")"
               in p.read_text()]
    assert lookups == [Path("rpcsrv/config/toolchain.py")], lookups
    from rpcsrv.executor.examplejson import text
    from rpcsrv.loader import examplejson, examplejson_text

    assert text.parse_examplejson is examplejson_text.parse_examplejson
    assert examplejson.lex is examplejson_text.lex  # inspect and extract read the same lines


def test_global_functions_over_modules_are_registered_once():
    from rpcsrv.board.globals import REGISTRY
    from rpcsrv.native.backend import GLOBALS

    assert set(GLOBALS) <= set(REGISTRY.names())
    worker = (ROOT / "rpcsrv" / "native" / "worker.py").read_text()
    assert "graph_executor" not in worker  # the worker serves the backend's table, it keeps none of its own


def test_module_kinds_have_one_registry():
    import rpcsrv.executor  # noqa: F401  (attaches the built-in kinds' runtimes)
    from rpcsrv.loader.node import PAYLOADS, REGISTRY
    from rpcsrv.loader.plugins import KINDS

    assert all(kind.runtime is not None for kind in REGISTRY.kinds.values()), "a built-in kind without a runtime"
    assert dict(KINDS) == REGISTRY.kinds and all(PAYLOADS[k] is REGISTRY.kinds[k].codec for k in PAYLOADS)
    for path in SOURCES:
        text = path.read_text()
        assert "__name__ == \"UnknownModule\"" not in text and "RUNTIME_KINDS" not in text, path
