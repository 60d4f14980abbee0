"""ExampleJSON text -> subgraphs: the one parser of the text, and every check that needs no data.

The text format is specified in ``docs/examplejson.md``: the seed format of TVM's BYOC guide (a
header line per subgraph, ``input`` lines, ``<op> ID inputs: ... shape: ...`` lines on float32)
plus rpcsrv's extension (``dtype:``, ``attrs:``, ``const`` and ``output`` lines, absent inputs as
``-1``).  Its lines are told apart once (:func:`lex`); :func:`parse_examplejson` checks everything that
can be checked without data (ops, input counts, attribute names, kinds and values, dtype rules: the op
catalogue ``rpcsrv.loader.opset``), so a bad file fails at ``load_module`` with the line number, not in
the middle of ``run``.  Its readers: the executor's runtime (``rpcsrv.executor.examplejson.subgraphs``,
which checks the ops against its kernels), ``rpcsrv inspect`` and ``extract`` (``examplejson.py``, from the
lexed lines alone: they describe a text the board may refuse), and the client's compiler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

from ..protocol.dtypes import numpy_dtype
from .errors import LoaderError
from .opset import OPS, node_problems

Kernel = Callable[..., Any]

_HEADER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_KEYWORDS = ("input", "const", "output")
#: the sections each line kind may carry, in the order they must appear
_SECTIONS = {
    "input": ("dtype:",),
    "const": ("dtype:", "name:"),
    "op": ("inputs:", "shape:", "dtype:", "attrs:"),
}
_ALL_SECTIONS = {"inputs:", "shape:", "dtype:", "name:", "attrs:"}
#: attributes the runtime itself consumes; they are not passed to kernels
RUNTIME_ATTRS = ("output_index",)

class ExampleJSONError(LoaderError):
    """A malformed ExampleJSON text; the message names the line."""


@dataclass(frozen=True)
class Node:
    """One tensor of a subgraph: an ``input``, a ``const`` or an op result."""

    kind: str  # "input" | "const" | "op"
    id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    line: int
    op: str = ""
    inputs: tuple[int, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""  # the constant's name (const nodes)

    def describe(self) -> str:
        what = self.op if self.kind == "op" else self.kind
        return f"line {self.line}: {what} node {self.id}"


@dataclass
class Subgraph:
    """A parsed subgraph: its nodes in line order and its outputs."""

    name: str
    line: int
    nodes: dict[int, Node] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    output_line: int = 0

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "input"]

    @property
    def consts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "const"]

    @property
    def ops(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "op"]


def _int(token: str, what: str, line: int, minimum: int = 0) -> int:
    try:
        value = int(token)
    except ValueError:
        raise ExampleJSONError(f"line {line}: {what} must be an integer, got {token!r}") from None
    if value < minimum:
        raise ExampleJSONError(f"line {line}: {what} must be >= {minimum}, got {value}")
    return value


def _dtype(text: str, line: int) -> np.dtype:
    try:
        return numpy_dtype(text)
    except ValueError as exc:
        raise ExampleJSONError(f"line {line}: bad dtype {text!r} ({exc})") from None


def _split_sections(tokens: list[str], kind: str, line: int) -> tuple[list[str], dict[str, list[str]]]:
    """Positional tokens, then ``{section keyword: its tokens}``, checking order and repeats."""
    allowed = _SECTIONS[kind]
    positional: list[str] = []
    sections: dict[str, list[str]] = {}
    current: Optional[list[str]] = positional
    last = -1
    for tok in tokens:
        if tok in _ALL_SECTIONS:
            if tok not in allowed:
                raise ExampleJSONError(f"line {line}: section {tok!r} is not allowed on {kind} lines")
            if tok in sections:
                raise ExampleJSONError(f"line {line}: section {tok!r} appears twice")
            if allowed.index(tok) < last:
                order = " ".join(allowed)
                raise ExampleJSONError(f"line {line}: section {tok!r} out of order (order: {order})")
            last = allowed.index(tok)
            current = sections[tok] = []
        else:
            current.append(tok)
    return positional, sections


def _one(sections: dict[str, list[str]], key: str, line: int) -> Optional[str]:
    values = sections.get(key)
    if values is None:
        return None
    if len(values) != 1:
        raise ExampleJSONError(f"line {line}: {key!r} takes exactly one value, got {values}")
    return values[0]


def _parse_node(text: str, line: int, graph: Subgraph, kernels: Mapping[str, Kernel]) -> Node:
    attrs: dict[str, Any] = {}
    head = text
    pos = text.find(" attrs:")
    if pos >= 0:
        head, attr_text = text[:pos], text[pos + len(" attrs:"):]
        try:
            attrs = json.loads(attr_text)
        except json.JSONDecodeError as exc:
            raise ExampleJSONError(f"line {line}: attrs is not valid JSON ({exc})") from None
        if not isinstance(attrs, dict):
            raise ExampleJSONError(f"line {line}: attrs must be a JSON object")
    tokens = head.split()
    word = tokens[0]
    kind = word if word in ("input", "const") else "op"
    if kind == "op" and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", word):
        raise ExampleJSONError(f"line {line}: malformed line {text.strip()!r}")
    if pos >= 0 and kind != "op":
        raise ExampleJSONError(f"line {line}: section 'attrs:' is not allowed on {kind} lines")
    if len(tokens) < 2:
        raise ExampleJSONError(f"line {line}: {word!r} needs a node ID")
    nid = _int(tokens[1], "node ID", line)
    if nid in graph.nodes:
        raise ExampleJSONError(f"line {line}: node ID {nid} already defined on line "
                               f"{graph.nodes[nid].line} in subgraph {graph.name!r}")
    positional, sections = _split_sections(tokens[2:], kind, line)
    dtext = _one(sections, "dtype:", line)
    dtype = _dtype(dtext, line) if dtext is not None else np.dtype(np.float32)
    if kind == "input":
        shape = tuple(_int(t, "dimension", line) for t in positional)
        return Node("input", nid, shape, dtype, line)
    if kind == "const":
        name = _one(sections, "name:", line)
        if name is None:
            raise ExampleJSONError(f"line {line}: const node {nid} needs 'name: NAME'")
        shape = tuple(_int(t, "dimension", line) for t in positional)
        return Node("const", nid, shape, dtype, line, name=name)
    # an op line
    if positional:
        raise ExampleJSONError(f"line {line}: unexpected {' '.join(positional)!r} before 'inputs:'")
    if "shape:" not in sections:
        raise ExampleJSONError(f"line {line}: op node {nid} needs 'shape: d0 d1 ...'")
    if word not in kernels:
        raise ExampleJSONError(f"line {line}: unknown op {word!r} ("
                               + ("not in rpcsrv's op catalogue)" if kernels is OPS
                                  else "this board has no kernel for it)"))
    inputs = tuple(_int(t, "input ID", line, minimum=-1) for t in sections.get("inputs:", []))
    for i in inputs:
        if i >= 0 and i not in graph.nodes:
            raise ExampleJSONError(f"line {line}: node {nid} uses node {i}, which is not defined "
                                   f"before it in subgraph {graph.name!r}")
    shape = tuple(_int(t, "dimension", line) for t in sections["shape:"])
    index = attrs.get("output_index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ExampleJSONError(f"line {line}: output_index must be a non-negative integer")
    spec = kernels[word] if kernels is OPS else getattr(kernels[word], "spec", None)
    if spec is not None:  # a kernel bound to the op catalogue: check this use of it now
        # (dtype names only for ops with a dtype rule: numpy's dtype.name is slow to ask for)
        dtypes = [graph.nodes[i].dtype.name if i >= 0 else None for i in inputs] if spec.dtypes else None
        problems = node_problems(word, {k: v for k, v in attrs.items() if k not in RUNTIME_ATTRS},
                                 [i >= 0 for i in inputs], dtypes)
        if index >= spec.max_outputs:
            problems.append(f"output_index {index}, but the op has {spec.max_outputs} output(s)")
        if problems:
            raise ExampleJSONError(f"line {line}: op {word!r} (node {nid}): {'; '.join(problems)}")
    return Node("op", nid, shape, dtype, line, op=word, inputs=inputs, attrs=attrs)


def _parse_output(tokens: list[str], line: int, graph: Subgraph) -> None:
    if graph.output_line:
        raise ExampleJSONError(f"line {line}: second 'output' line (first on line {graph.output_line})")
    if len(tokens) < 2:
        raise ExampleJSONError(f"line {line}: 'output' needs at least one node ID")
    for tok in tokens[1:]:
        oid = _int(tok, "output ID", line)
        if oid not in graph.nodes:
            raise ExampleJSONError(f"line {line}: output node {oid} is not defined before this line")
        graph.outputs.append(oid)
    graph.output_line = line


def is_header(tokens: list[str]) -> bool:
    """Whether a line's tokens open a subgraph (one word that is no keyword: the subgraph's symbol)."""
    return len(tokens) == 1 and tokens[0] not in _KEYWORDS and not tokens[0].startswith("#")


def lex(text: str) -> Iterator[tuple[int, str, str, list[str]]]:
    """``(line number, kind, the line stripped, its words)`` of each line that is not blank or a comment;
    ``kind`` is ``header``, ``input``, ``const``, ``output`` or ``op``."""
    for line, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        tokens = stripped.split()
        kind = "header" if is_header(tokens) else tokens[0] if tokens[0] in _KEYWORDS else "op"
        yield line, kind, stripped, tokens


def parse_examplejson(text: str, kernels: Optional[Mapping[str, Kernel]] = None) -> dict[str, Subgraph]:
    """Parse an ExampleJSON text into subgraphs by name; ops are checked against ``kernels`` (a board's
    kernel table; by default the op catalogue, ``rpcsrv.loader.opset``)."""
    kernels = OPS if kernels is None else kernels
    graphs: dict[str, Subgraph] = {}
    graph: Optional[Subgraph] = None
    for line, kind, stripped, tokens in lex(text):
        if kind == "header":
            if not _HEADER_RE.match(tokens[0]):
                raise ExampleJSONError(f"line {line}: malformed subgraph header {tokens[0]!r}")
            if tokens[0] in graphs:
                raise ExampleJSONError(f"line {line}: subgraph {tokens[0]!r} defined twice")
            graph = graphs[tokens[0]] = Subgraph(tokens[0], line)
            continue
        if graph is None:
            raise ExampleJSONError(f"line {line}: {stripped!r} comes before any subgraph header line")
        if graph.output_line:
            raise ExampleJSONError(f"line {line}: node after the 'output' line of subgraph {graph.name!r}")
        if kind == "output":
            _parse_output(tokens, line, graph)
            continue
        node = _parse_node(stripped, line, graph, kernels)
        graph.nodes[node.id] = node
    if not graphs:
        raise ExampleJSONError("no subgraph in the ExampleJSON text (expected a header line such as 'subgraph_0')")
    for g in graphs.values():
        if not g.nodes:
            raise ExampleJSONError(f"line {g.line}: subgraph {g.name!r} has no nodes")
        if not g.outputs:
            g.outputs.append(list(g.nodes)[-1])  # the seed's rule: the last node is the output
    return graphs
