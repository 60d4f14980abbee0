"""The base of the module tree: ``ModuleNode``, the one walk, and ``PayloadCodec``.

A leaf: ``modules.py`` (the payload kinds TVM's graph executor libraries carry) and each module
kind in its own file (``vm_executable.py``) build on it, and ``modules.py`` collects their codecs
into ``PAYLOADS`` without an import circle.  ``PAYLOADS`` itself lives here, the one table every
layout reads; ``plugins.py`` fills it (built-in kinds and installed plugins alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


def walk_imports(root: Any) -> Iterator[Any]:
    """``root``, then its ``imports`` depth-first, each module once: TVM's lookup order.

    The one walk of the project: loader nodes and runtime modules (``rpcsrv.executor.module``)
    both have an ``imports`` list and both use this.
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        yield mod
        stack.extend(reversed(mod.imports))


@dataclass(eq=False, repr=False)
class ModuleNode:
    """One module of the tree: its type key and the modules it imports (in order)."""

    type_key: str = field(default="module", kw_only=True)
    imports: list["ModuleNode"] = field(default_factory=list, kw_only=True)

    def walk(self) -> Iterator["ModuleNode"]:
        """This module, then its imports depth-first, each module once."""
        return walk_imports(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.type_key!r} imports={len(self.imports)}>"


@dataclass(frozen=True)
class PayloadCodec:
    """How one type key's payload is declared, decoded into a node and encoded back.

    ``fmt`` (construct) must know where it ends: the classic layout puts the next module's entry right
    after it (a length prefix such as ``Prefixed(Int64ul, ...)``, or counts and fixed sizes); the tvm-ffi
    layout hands it exactly its bytes.  ``decode(value, type_key)`` turns ``fmt.parse``'s value into a
    node (``ValueError``: a bad payload), ``encode(node)`` gives back what ``fmt.build`` takes."""

    fmt: Any
    decode: Callable[[Any, str], ModuleNode]
    encode: Callable[[ModuleNode], Any]


#: type key -> how its payload is declared and decoded; filled through ``plugins.install`` (and, for
#: code written before the plugin interface, by direct assignment)
PAYLOADS: dict[str, PayloadCodec] = {}
