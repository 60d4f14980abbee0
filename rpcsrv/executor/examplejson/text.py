"""ExampleJSON subgraphs as the runtime and its rewrites see them.

The text is parsed and checked by the loader's one parser (``rpcsrv.loader.examplejson_text``, which
``rpcsrv inspect`` and the client's compiler read too): its :class:`Subgraph` and :class:`Node` are what
the runtime (``subgraphs.py``) runs and the rewrites before a run (``scale_fold.py``, ``residual_fold.py``,
``shuffle_fold.py``, ``concat_fold.py``) rewrite.  Here: what those rewrites share.
"""

from __future__ import annotations

from collections import Counter

from ...loader.examplejson_text import (RUNTIME_ATTRS, ExampleJSONError, Kernel, Node, Subgraph,  # noqa: F401
                                        parse_examplejson)

__all__ = ["RUNTIME_ATTRS", "ExampleJSONError", "Kernel", "Node", "Subgraph", "input_counts", "parse_examplejson",
           "rewritten"]


def input_counts(ops: list[Node]) -> Counter:
    """Node ID -> how many inputs of ``ops`` read it (once per input position)."""
    return Counter(i for node in ops for i in node.inputs)


def rewritten(ops: list[Node], replaced: dict[int, Node], dropped: set[int]) -> list[Node]:
    """``ops`` in order with the nodes of ``replaced`` swapped in by ID and those of ``dropped`` left out."""
    return [replaced.get(n.id, n) for n in ops if n.id not in dropped]
