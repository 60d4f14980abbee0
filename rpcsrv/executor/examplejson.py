"""ExampleJSON: parser and runtime module (type key ``examplejson``).

The text format is specified in ``docs/examplejson.md``: the seed format of TVM's BYOC guide (a
header line per subgraph, ``input`` lines, ``<op> ID inputs: ... shape: ...`` lines on float32)
plus rpcsrv's extension (``dtype:``, ``attrs:``, ``const`` and ``output`` lines, absent inputs as
``-1``).  Everything that can be checked without data is checked when the text is parsed (ops,
input counts, attribute names, kinds and values, dtype rules: the op catalogue
``rpcsrv.loader.opset``), so a bad file fails at ``load_module`` with the line number, not in the
middle of ``run``.

Each subgraph becomes a packed function named by its header.  It is called with the inputs (in
the order of their ``input`` lines) followed by the outputs, and writes the outputs in place, as
TVM's external functions do.  Intermediate tensors live only for one call, so one module can be
called from several threads at once (the server runs each session's calls in a worker thread).
"""

from __future__ import annotations

import json
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..loader.opset import node_problems
from ..protocol.dtypes import numpy_dtype
from .runtime import ExecutorError, RuntimeModule

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
_RUNTIME_ATTRS = ("output_index",)
#: optional per-step observer ``hook(subgraph, node, value, seconds)`` for the debug executor's
#: per-kernel timings and intermediate outputs; set only in the thread doing the debug call
STEP_HOOK: ContextVar[Optional[Callable[..., None]]] = ContextVar("examplejson_step_hook", default=None)


class ExampleJSONError(ExecutorError):
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
        raise ExampleJSONError(f"line {line}: unknown op {word!r} (this board has no kernel for it)")
    inputs = tuple(_int(t, "input ID", line, minimum=-1) for t in sections.get("inputs:", []))
    for i in inputs:
        if i >= 0 and i not in graph.nodes:
            raise ExampleJSONError(f"line {line}: node {nid} uses node {i}, which is not defined "
                                   f"before it in subgraph {graph.name!r}")
    shape = tuple(_int(t, "dimension", line) for t in sections["shape:"])
    index = attrs.get("output_index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ExampleJSONError(f"line {line}: output_index must be a non-negative integer")
    spec = getattr(kernels[word], "spec", None)
    if spec is not None:  # a kernel bound to the op catalogue: check this use of it now
        problems = node_problems(word, {k: v for k, v in attrs.items() if k not in _RUNTIME_ATTRS},
                                 [i >= 0 for i in inputs],
                                 [graph.nodes[i].dtype.name if i >= 0 else None for i in inputs])
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


def parse_examplejson(text: str, kernels: Mapping[str, Kernel]) -> dict[str, Subgraph]:
    """Parse an ExampleJSON text into subgraphs by name; ops are checked against ``kernels``."""
    graphs: dict[str, Subgraph] = {}
    graph: Optional[Subgraph] = None
    for line, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        tokens = stripped.split()
        if len(tokens) == 1 and tokens[0] not in _KEYWORDS:
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
        if tokens[0] == "output":
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


#: how a wrong shape or dtype is reported, for the subgraph's arguments and for kernel results
_ARGUMENT_MISMATCH = "expected {want}, got {got}"
_RESULT_MISMATCH = "kernel produced {got} but the node declares {want}"


def _check_array(arr: Any, node: Node, what: str, mismatch: str = _ARGUMENT_MISMATCH) -> np.ndarray:
    """``arr`` if it is a tensor of ``node``'s declared shape and dtype, else an ExecutorError."""
    if not isinstance(arr, np.ndarray):
        raise ExecutorError(f"{what}: expected a tensor, got {type(arr).__name__}")
    if arr.shape != node.shape or arr.dtype != node.dtype:
        raise ExecutorError(f"{what}: " + mismatch.format(want=f"{node.dtype} {list(node.shape)}",
                                                          got=f"{arr.dtype} {list(arr.shape)}"))
    return arr


class SubgraphFunction:
    """The packed function of one subgraph: ``f(*inputs, *outputs)``, outputs written in place."""

    def __init__(self, graph: Subgraph, kernels: Mapping[str, Kernel], constants: dict[int, np.ndarray]):
        self.graph = graph
        self.constants = constants  # node ID -> bound array (filled by ExampleJSONRuntime.bind)
        self.inputs = graph.inputs
        self.outputs = [graph.nodes[i] for i in graph.outputs]
        # ops that share op, inputs and attrs (the outputs of one multi-output op) run once per call
        keys = []
        for node in graph.ops:
            kattrs = {k: v for k, v in node.attrs.items() if k not in _RUNTIME_ATTRS}
            keys.append((node.op, node.inputs, json.dumps(kattrs, sort_keys=True)))
        last_of_key = {key: k for k, key in enumerate(keys)}
        # an intermediate is dropped after its last use, so peak memory stays near the live set
        last_use: dict[int, int] = {}
        for k, node in enumerate(graph.ops):
            for i in node.inputs:
                if i >= 0:
                    last_use[i] = k
        keep = set(graph.outputs) | {n.id for n in graph.nodes.values() if n.kind != "op"}
        drops: dict[int, list[int]] = {}
        for nid, k in last_use.items():
            if nid not in keep:
                drops.setdefault(k, []).append(nid)
        self.steps = []
        for k, (node, key) in enumerate(zip(graph.ops, keys)):
            kattrs = {a: v for a, v in node.attrs.items() if a not in _RUNTIME_ATTRS}
            shared = keys.count(key) > 1
            self.steps.append((node, kernels[node.op], kattrs, key if shared else None,
                               last_of_key[key] == k, node.attrs.get("output_index", 0),
                               tuple(drops.get(k, ()))))

    def __call__(self, *args: Any) -> None:
        g, n_in, n_out = self.graph, len(self.inputs), len(self.outputs)
        if len(args) != n_in + n_out:
            raise ExecutorError(f"{g.name} takes {n_in} input(s) and {n_out} output(s) "
                                f"({n_in + n_out} arguments), got {len(args)}")
        values: dict[int, Optional[np.ndarray]] = {-1: None}
        for k, node in enumerate(self.inputs):
            values[node.id] = _check_array(args[k], node, f"{g.name} argument {k} (input {node.id})")
        outs = [_check_array(args[n_in + k], node, f"{g.name} argument {n_in + k} (output {node.id})")
                for k, node in enumerate(self.outputs)]
        for node in g.consts:
            if node.id not in self.constants:
                raise ExecutorError(f"{g.name}: constant {node.name!r} (node {node.id}) is not bound")
            values[node.id] = self.constants[node.id]
        shared: dict[tuple, Any] = {}  # results of multi-output ops until their last node
        node = None
        hook = STEP_HOOK.get()
        try:
            for node, kernel, kattrs, key, last_of_key, index, drops in self.steps:
                start = time.perf_counter() if hook is not None else 0.0
                if key is None:
                    result = kernel(*[values[i] for i in node.inputs], **kattrs)
                else:
                    if key not in shared:
                        shared[key] = kernel(*[values[i] for i in node.inputs], **kattrs)
                    result = shared.pop(key) if last_of_key else shared[key]
                if type(result) is np.ndarray and index == 0 and result.shape == node.shape \
                        and result.dtype == node.dtype:
                    values[node.id] = result  # the common case, checked inline
                else:
                    values[node.id] = self._pick(node, result, index)
                if hook is not None:
                    hook(g.name, node, values[node.id], time.perf_counter() - start)
                for nid in drops:
                    del values[nid]
        except ExecutorError:
            raise
        except Exception as exc:  # a kernel's own error: say which node of which subgraph
            raise ExecutorError(f"{g.name} {node.describe()} failed: {type(exc).__name__}: {exc}") from exc
        for out, onode in zip(outs, self.outputs):
            np.copyto(out, values[onode.id], casting="no")

    def _pick(self, node: Node, result: Any, index: int) -> np.ndarray:
        """The node's tensor from a kernel result that is not simply the declared array (the
        common case is checked inline in ``__call__``): one of several outputs, or a mismatch."""
        what = f"{self.graph.name} {node.describe()}"
        if isinstance(result, (tuple, list)):
            if index >= len(result):
                raise ExecutorError(f"{what}: output_index {index} but the op gave {len(result)} outputs")
            result = result[index]
        elif index != 0:
            raise ExecutorError(f"{what}: output_index {index} but the op gave one output")
        if isinstance(result, np.generic):
            result = np.asarray(result)
        return _check_array(result, node, what, _RESULT_MISMATCH)


class ExampleJSONRuntime(RuntimeModule):
    """The runtime of an ``examplejson`` module: one packed function per subgraph.

    ``__init_<symbol>`` (TVM's constant initialiser, called by a const loader) binds the
    subgraph's ``const`` nodes in line order; :meth:`bind` binds them by name.
    """

    type_key = "examplejson"

    def __init__(self, code: str, kernels: Optional[Mapping[str, Kernel]] = None, imports=None):
        super().__init__(imports)
        if kernels is None:
            from .kernels import KERNELS as kernels  # noqa: N811 - the shared kernel table
        self.code = code
        self.graphs = parse_examplejson(code, kernels)
        self.constants: dict[str, dict[int, np.ndarray]] = {name: {} for name in self.graphs}
        self.functions = {name: SubgraphFunction(g, kernels, self.constants[name])
                          for name, g in self.graphs.items()}

    def get_function(self, name: str):
        if name in self.functions:
            return self.functions[name]
        if name.startswith("__init_") and name[len("__init_"):] in self.graphs:
            symbol = name[len("__init_"):]
            return lambda arrays: self._init_in_order(symbol, arrays)
        return None

    def const_names(self, symbol: str) -> list[str]:
        """The constant names subgraph ``symbol`` needs, in line order."""
        return [n.name for n in self.graphs[symbol].consts]

    def unbound(self, symbol: str) -> list[str]:
        """Names of subgraph ``symbol``'s constants that are not bound yet."""
        return [n.name for n in self.graphs[symbol].consts if n.id not in self.constants[symbol]]

    def bind(self, symbol: str, arrays: Mapping[str, Any], source: str, only_missing: bool = False) -> None:
        """Bind the constants of ``symbol`` found in ``arrays`` (by name); ``source`` is for errors."""
        for node in self.graphs[symbol].consts:
            if node.name not in arrays or (only_missing and node.id in self.constants[symbol]):
                continue
            arr = np.asarray(arrays[node.name])
            if arr.shape != node.shape or arr.dtype != node.dtype:
                raise ExecutorError(f"{symbol} {node.describe()}: constant {node.name!r} from {source} is "
                                    f"{arr.dtype} {list(arr.shape)}, declared {node.dtype} {list(node.shape)}")
            self.constants[symbol][node.id] = arr

    def _init_in_order(self, symbol: str, arrays: Sequence[Any]) -> int:
        names = self.const_names(symbol)
        if len(arrays) != len(names):
            raise ExecutorError(f"__init_{symbol}: {len(names)} constant(s) declared, {len(arrays)} given")
        self.bind(symbol, dict(zip(names, arrays)), f"__init_{symbol}")
        return 0
