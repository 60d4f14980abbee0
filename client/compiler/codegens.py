"""Codegens as plugins: what ``byoc compile --codegen NAME`` picks, and the interface one implements.

A codegen is the compiler side of an accelerator (TVM's BYOC ``relay.ext.<name>``); docs/plugins.md,
"Reference: the contract", is the whole contract.  It declares

* ``name``: what ``--codegen`` picks, and the middle of its functions' symbols
  (``tvmgen_<module>_<name>_main_<k>``, TVM's spelling);
* ``title``: how ``byoc`` names it in messages (default: ``name``);
* ``ops``: its op set, in the board's op vocabulary (``rpcsrv.loader.opset``: ``conv``, ``relu``,
  ``max_pool``, ``gemm`` ...; ``--ops`` can narrow it).  Eligibility is op by op: an op named here goes
  to the codegen alone too, also when it was only meant inside a composite;
* ``patterns``: its composite patterns (TVM's ``MergeComposite`` table, tried in order; ``patterns.py``):
  chains of ONNX ops or DAGs written with :func:`is_op`, :func:`wildcard` and :func:`is_constant`;
* ``check(op, graph)``: why one (composite) op cannot go to it, beyond the op set ("" when it can); a
  composite it refuses has no host fallback;
* ``generate(function, graph)``: one partitioned region → an :class:`External`, the loader node of
  its module (its type key and payload) and the constants a const loader hands it (if any).  The
  board calls the module's function ``function.symbol`` with the arrays of ``function.inputs`` (never
  constants), then those of ``function.outputs``, which it writes in place;
* ``codec``: the payload codec of its type key (``rpcsrv.loader.node.PayloadCodec``, the same object
  as the board plugin's), so that the library can be written where the board plugin is not installed
  (None: the key's codec must already be known, as ExampleJSON's is).

The partitioner (``partition.py``) annotates, merges regions and partitions with these; whatever the
codegen refuses goes to the host C (``hostgen``).  ExampleJSON (``examplejson.py``) is the built-in one and
is found through the same table as the installed ones: the entry-point group ``byoc.codegens``
(:data:`GROUP`), each naming a :class:`Codegen` instance (or a function returning one).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rpcsrv.loader.node import ModuleNode, PayloadCodec

from .errors import CompileError
from .onnx_import import Graph
from .ops import Op
from .partition import Function
from .patterns import Pattern, is_constant, is_op, match_patterns, wildcard

__all__ = ["GROUP", "DEFAULT", "BUILTIN", "Codegen", "External", "Pattern", "available", "get_codegen",
           "is_constant", "is_op", "match_patterns", "wildcard"]

#: the entry-point group of compiler plugins
GROUP = "byoc.codegens"
#: the codegen ``byoc compile`` uses without ``--codegen``
DEFAULT = "examplejson"
#: the built-in codegens, loaded the way an installed one is
BUILTIN = (importlib.metadata.EntryPoint("examplejson", "rpcsrv.client.compiler.examplejson:EXAMPLEJSON", GROUP),)


@dataclass
class External:
    """What a codegen makes of one region: its module (a loader node of the codegen's type key, written
    with ``codec``, exporting the function's symbol), the constants a const loader binds into it by
    name (empty when the payload carries its own; names are one namespace for the whole library), and
    a text form for ``byoc compile -v``."""

    node: ModuleNode
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    text: str = ""


class Codegen:
    """Base of a codegen: set ``name``, ``ops``, ``patterns`` and ``codec``; implement ``generate`` (and
    ``check`` for what the accelerator refuses beyond the op set)."""

    name: str = ""
    title: str = ""  # how messages name it (default: ``name``)
    ops: frozenset = frozenset()
    patterns: tuple[Pattern, ...] = ()
    codec: PayloadCodec | None = None

    def merge_composites(self, graph: Graph, ops: frozenset) -> list[Op]:
        """``MergeComposite``: every node of ``graph`` in exactly one op, in execution order; a match of a
        pattern becomes one op (``patterns.match_patterns``)."""
        return match_patterns(graph, self.patterns, ops)

    def check(self, op: Op, graph: Graph) -> str:
        """Why ``op`` cannot go to this accelerator beyond the op set and the board's catalogue ("": it can).
        ``op.attrs`` are the model's ONNX attributes as written, without defaults."""
        return ""

    def generate(self, fn: Function, graph: Graph) -> External:
        """The module of one partitioned function (``fn.symbol``, ``fn.ops``, ``fn.inputs``, ``fn.outputs``,
        ``fn.constants``); ``graph.tensors`` gives every tensor's shape and dtype, ``graph.constants`` the
        constants' values."""
        raise NotImplementedError(f"codegen {self.name!r} does not implement generate()")


def _entry_points() -> dict[str, Any]:
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
    for ep in BUILTIN:
        found.setdefault(ep.name, ep)
    return found


def available() -> list[str]:
    """The names ``--codegen`` accepts: the built-in ones and every installed ``byoc.codegens`` entry."""
    return sorted(_entry_points())


_LOADED: dict[str, Codegen] = {}


def get_codegen(name: str | None = None) -> Codegen:
    """The codegen called ``name`` (default :data:`DEFAULT`), imported once; a clear CompileError for an
    unknown name or a plugin that fails to import."""
    name = name or DEFAULT
    if name in _LOADED:
        return _LOADED[name]
    entries = _entry_points()
    if name not in entries:
        raise CompileError(f"unknown codegen {name!r}; installed: {', '.join(sorted(entries))} "
                           f"(a package adds one through the entry-point group {GROUP})")
    try:
        obj = entries[name].load()
        codegen = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Codegen)) else obj
    except Exception as exc:
        raise CompileError(f"codegen {name!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
    if not isinstance(codegen, Codegen):
        raise CompileError(f"codegen {name!r}: entry point gives {type(codegen).__name__}, not a "
                           f"rpcsrv.client.compiler.codegens.Codegen")
    if codegen.name != name or not codegen.name.isidentifier():
        raise CompileError(f"codegen {name!r}: its name is {codegen.name!r} (must match the entry point and be "
                           f"an identifier: it goes into the function symbols)")
    _LOADED[name] = codegen
    return codegen
