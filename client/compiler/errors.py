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


#: ONNX ops whose output size depends on the input *values*, not only their shapes: what decides it
DATA_DEPENDENT = {
    "NonZero": "how many elements are non-zero",
    "NonMaxSuppression": "how many boxes survive",
    "Unique": "how many distinct values there are",
    "Compress": "how many condition values are true",
    "Loop": "how many iterations run",
    "StringSplit": "how many pieces each string splits into",
}


def no_static_shape(unknown: list[tuple[str, str, str]]) -> CompileError:
    """The error for tensors left without a static shape, as ``(node name, op type, tensor)``.

    When a data-dependent op (``DATA_DEPENDENT``) is among the producers, that is the cause, and
    no ``--input-shape`` can help: the message says so instead of asking for shapes.
    """
    shown = "; ".join(f"{t!r} of node {n!r} ({op})" for n, op, t in unknown[:8])
    head = f"shape inference left {len(unknown)} tensor(s) without a static shape: {shown}."
    causes: dict[str, str] = {}
    for n, op, _ in unknown:
        if op in DATA_DEPENDENT:
            causes.setdefault(n, op)
    if not causes:
        return CompileError(f"{head} Give concrete --input-shape values, or make shape inputs constants")
    listed = ", ".join(f"node {n!r} ({op}: {DATA_DEPENDENT[op]})" for n, op in causes.items())
    return CompileError(
        f"{head} The cause is {listed}: its output size depends on the input values, not only on "
        f"their shapes, so no --input-shape can make it static, and the board's graph executor fixes "
        f"every tensor's size before it runs. Remove such ops from the model or compute that part "
        f"outside it (they compile only where their input is a constant, which is folded away).")
