"""Errors the compiler reports to its user.

A ``CompileError`` is a problem with the *input* (the model, the shapes, the options), never a bug
in the compiler: the CLI prints its message as ``byoc: error: ...`` and exits with status 2, without
a traceback.  Messages name the thing that is wrong and say what to do about it.
"""

from __future__ import annotations


class CompileError(Exception):
    """The model cannot be compiled as given; the message says why and what to do."""


class UnsupportedNodesError(CompileError):
    """Some nodes have no kernel in the chosen op set (and there is no host fallback yet).

    ``nodes`` lists ``(name, op_type, input shapes, output shapes)`` of each such node;
    ``partial`` is the partitioned model of the supported part (its subgraphs can be looked at,
    it cannot be exported because the unsupported nodes have nowhere to run).
    """

    def __init__(self, message: str, nodes: list[tuple], partial=None):
        super().__init__(message)
        self.nodes = nodes
        self.partial = partial
