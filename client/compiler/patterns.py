"""Composite patterns: TVM's ``MergeComposite`` for a codegen's pattern table (``Codegen.patterns``).

A :class:`Pattern` fuses several ONNX nodes into one :class:`~.ops.Op` (its ``pattern`` is the
pattern's name).  What it matches is either

* a **chain**: a tuple of ONNX op types, each node reading the previous one's only output,
  ``("Conv", "Relu")``; or
* a **dataflow pattern**: a DAG written as TVM's pattern language writes one
  (``tvm.relay.dataflow_pattern``): :func:`is_op` names an ONNX op type and is called with one
  pattern per input of the node; :func:`wildcard` matches any tensor from outside the match,
  :func:`is_constant` a constant of the model (an initializer, or a tensor folded to one).  One pattern
  object used in two places stands for one node or tensor of the graph: that is how a diamond is
  written::

      conv = is_op("Conv")(wildcard(), is_constant(), is_constant())
      diamond = is_op("Add")(conv, is_op("Relu")(conv))            # conv + relu(conv)
      x = wildcard()
      residual = is_op("Relu")(is_op("Add")(is_op("Relu")(is_op("Conv")(x, is_constant(), is_constant())), x))

  ``is_op("Conv")`` not called matches a Conv whatever its inputs (each then an input of the
  composite).  Called, the node must have exactly that many inputs (absent optional inputs at the end,
  ``""`` in ONNX, do not count).  ``Add`` and ``Mul`` also match with their two inputs swapped (as TVM's
  matcher does for ``add`` and ``multiply``); every way a pattern matches at a node is considered.

Which nodes fuse (both kinds; a chain is the DAG of its ops):

* every node of the match but its output node (the *root*: the pattern passed to :class:`Pattern`)
  has one output, read only by nodes of the match and not a model output; the root's outputs are the
  composite's;
* nodes of the default ONNX domain only, each node in at most one composite;
* the graph's nodes are visited in execution order; at each node not yet fused, the patterns are tried
  in table order, each for a match whose first node (in execution order) is this node; the first match
  whose ops are all in the op set and whose ``inputs`` accepts it is fused.  A chain starts at its
  first op; a DAG pattern's match starts at its earliest node, so the residual block above listed
  before ``("Conv", "Relu")`` wins over it at their common Conv, and listed after it loses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

from rpcsrv.loader.opset import onnx_op_to_kernel

from .errors import CompileError
from .onnx_import import ONNX_DOMAINS, Graph, Node
from .ops import Op, consumers, single_op

#: ONNX ops whose two inputs a pattern also matches swapped (TVM's matcher: add, multiply)
COMMUTATIVE = frozenset({"Add", "Mul"})


class DFPattern:
    """A node of a dataflow pattern (compared by identity: one object is one node or tensor)."""


@dataclass(eq=False)
class Wildcard(DFPattern):
    """Any tensor (:func:`wildcard`)."""

    def __repr__(self) -> str:
        return "wildcard()"


@dataclass(eq=False)
class ConstantPattern(DFPattern):
    """A constant of the model (:func:`is_constant`)."""

    def __repr__(self) -> str:
        return "is_constant()"


@dataclass(eq=False)
class OpPattern(DFPattern):
    """A node of ONNX type ``op_type`` whose inputs match ``args`` (None: any inputs)."""

    op_type: str
    args: tuple[DFPattern, ...] | None = None

    def __call__(self, *args: DFPattern) -> "OpPattern":
        bad = [a for a in args if not isinstance(a, DFPattern)]
        if bad:
            raise TypeError(f"is_op({self.op_type!r}) takes patterns (is_op, wildcard, is_constant), got {bad[0]!r}")
        return OpPattern(self.op_type, tuple(args))

    def __repr__(self) -> str:
        if self.args is None:
            return f"is_op({self.op_type!r})"
        return f"is_op({self.op_type!r})({', '.join(map(repr, self.args))})"


def is_op(op_type: str) -> OpPattern:
    """A node of this ONNX op type; call it with a pattern per input: ``is_op("Relu")(wildcard())``."""
    if not isinstance(op_type, str) or not op_type:
        raise TypeError(f"is_op takes an ONNX op type such as 'Conv', got {op_type!r}")
    return OpPattern(op_type)


def wildcard() -> Wildcard:
    """Any tensor: a model input, a constant, or the output of a node outside the match."""
    return Wildcard()


def is_constant() -> ConstantPattern:
    """A constant of the model (the graph's ``constants``)."""
    return ConstantPattern()


@dataclass(frozen=True)
class Pattern:
    """A composite: what ``chain`` matches, fused into one op named ``name`` (``<codegen>.<pattern>``).

    ``chain`` is a tuple of ONNX op types (a chain) or a dataflow pattern, its root (see the module
    doc).  The composite :class:`~.ops.Op` has the matched nodes in execution order (``nodes``), the
    root's outputs, the kernel ``kernel`` (default: the first node's op name), the first node's
    attributes updated with ``attrs``, and as inputs each node's inputs in execution order, leaving
    out tensors made inside the match (a tensor read twice is listed twice), unless ``inputs(nodes,
    graph)`` says otherwise: it returns the input list, or None when this match does not fit (say, a
    bias that is not a constant); the list must hold every tensor the nodes read from outside that
    is not a constant."""

    name: str
    chain: Union[tuple[str, ...], OpPattern]
    kernel: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inputs: Callable[[list[Node], Graph], list[str] | None] | None = None

    def __post_init__(self):
        if isinstance(self.chain, OpPattern):
            return
        if isinstance(self.chain, DFPattern):
            raise TypeError(f"pattern {self.name!r}: the root of a dataflow pattern must be is_op(...), "
                            f"not {self.chain!r}")
        chain = tuple(self.chain) if isinstance(self.chain, (tuple, list)) else ()
        if not chain or not all(isinstance(t, str) and t for t in chain):
            raise TypeError(f"pattern {self.name!r}: chain must be ONNX op types such as ('Conv', 'Relu') "
                            f"or a dataflow pattern (is_op(...)), got {self.chain!r}")
        object.__setattr__(self, "chain", chain)


class _Matcher:
    """One graph's matching state: producers, read counts, the nodes already fused."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.order = {id(n): k for k, n in enumerate(graph.nodes)}
        self.producer = {o: n for n in graph.nodes for o in n.outputs if o}
        self.uses = consumers(graph)
        self.readers: dict[str, list[Node]] = {}
        for n in graph.nodes:
            for i in n.inputs:
                self.readers.setdefault(i, []).append(n)
        self.claimed: set[int] = set()

    def follow(self, node: Node, chain: tuple[str, ...]) -> list[Node] | None:
        """The chain starting at ``node``, or None."""
        if node.op_type != chain[0] or node.domain not in ONNX_DOMAINS:
            return None
        nodes = [node]
        for op_type in chain[1:]:
            last = nodes[-1]
            if len(last.outputs) != 1 or self.uses.get(last.outputs[0]) != 1:
                return None
            nxt = self.readers.get(last.outputs[0], [])
            if len(nxt) != 1 or nxt[0].op_type != op_type or nxt[0].domain not in ONNX_DOMAINS \
                    or id(nxt[0]) in self.claimed:
                return None
            nodes.append(nxt[0])
        return nodes

    def matches(self, root: OpPattern, node: Node) -> list[list[Node]]:
        """Every match of ``root`` at ``node`` (each its nodes in execution order, each node set once)."""
        found: dict[tuple, list[Node]] = {}
        bound: dict[DFPattern, Any] = {}
        for _ in _node(root, node, bound, self):
            nodes = sorted({id(n): n for p, n in bound.items() if isinstance(p, OpPattern)}.values(),
                           key=lambda n: self.order[id(n)])
            tensors = [t for p, t in bound.items() if not isinstance(p, OpPattern)]
            if self._closed(nodes, node, tensors):
                found.setdefault(tuple(id(n) for n in nodes), nodes)
        return list(found.values())

    def _closed(self, nodes: list[Node], root: Node, tensors: list[str]) -> bool:
        """No inner tensor of the match is read outside it (or is a model output), nor is one of the
        ``tensors`` the wildcards and constants stand for (those come from outside)."""
        made = {o for n in nodes for o in n.outputs if o}
        if any(t in made for t in tensors):
            return False
        reads: dict[str, int] = {}
        for n in nodes:
            for t in n.inputs:
                reads[t] = reads.get(t, 0) + 1
        for n in nodes:
            out = [o for o in n.outputs if o]
            if n is not root and self.uses.get(out[0]) != reads.get(out[0], 0):
                return False
        return True


# The matcher proper: generators that bind pattern objects to nodes (op patterns) or tensor names (the
# others) in ``bound``, yield once per way the pattern matches, and unbind what they bound when done.

def _node(pat: OpPattern, node: Node, bound: dict, m: _Matcher):
    if pat in bound:
        if bound[pat] is node:
            yield
        return
    if node.op_type != pat.op_type or node.domain not in ONNX_DOMAINS:
        return
    bound[pat] = node
    if pat.args is None:
        yield
    else:
        given = list(node.inputs)
        while given and not given[-1]:
            given.pop()
        if len(given) == len(pat.args):
            yield from _each(pat.args, given, bound, m)
            if pat.op_type in COMMUTATIVE and len(pat.args) == 2:
                yield from _each(pat.args[::-1], given, bound, m)
    del bound[pat]


def _each(pats, names, bound: dict, m: _Matcher):
    if not pats:
        yield
        return
    for _ in _tensor(pats[0], names[0], bound, m):
        yield from _each(pats[1:], names[1:], bound, m)


def _tensor(pat: DFPattern, name: str, bound: dict, m: _Matcher):
    if not name:
        return
    if isinstance(pat, OpPattern):
        producer = m.producer.get(name)
        if producer is not None and [o for o in producer.outputs if o] == [name]:
            yield from _node(pat, producer, bound, m)
        return
    if pat in bound:
        if bound[pat] == name:
            yield
        return
    if isinstance(pat, ConstantPattern) and name not in m.graph.constants:
        return
    bound[pat] = name
    yield
    del bound[pat]


def outside_inputs(nodes: list[Node]) -> list[str]:
    """The default composite inputs: each node's inputs in order, leaving out tensors made by ``nodes``."""
    made = {o for n in nodes for o in n.outputs if o}
    return [i for n in nodes for i in n.inputs if i not in made]


def _composite(pat: Pattern, nodes: list[Node], graph: Graph, ops: frozenset) -> Op | None:
    kernel = pat.kernel or onnx_op_to_kernel(nodes[0].op_type)
    needs = {onnx_op_to_kernel(n.op_type) for n in nodes} | {kernel}
    if not needs <= ops:
        return None
    inputs = pat.inputs(nodes, graph) if pat.inputs else outside_inputs(nodes)
    if inputs is None:
        return None
    lost = [t for t in dict.fromkeys(outside_inputs(nodes)) if t and t not in inputs and t not in graph.constants]
    if lost:
        raise CompileError(f"pattern {pat.name!r}: its inputs() left out {', '.join(lost)}, read by "
                           f"{'+'.join(n.name for n in nodes)} from outside (only constants may be left out)")
    return Op("+".join(n.name for n in nodes), kernel, list(inputs), list(nodes[-1].outputs),
              {**nodes[0].attrs, **pat.attrs}, list(nodes), pat.name, requires=needs, by_nodes=True)


def match_patterns(graph: Graph, patterns, ops: frozenset) -> list[Op]:
    """The generic ``MergeComposite`` of a :class:`Pattern` table (rules in the module doc): every node
    once, a composite in the place of its first node, the rest as single ops, in execution order."""
    m = _Matcher(graph)
    starts: list[dict[int, list[list[Node]]]] = []  # per DAG pattern: first node's index -> its matches
    for pat in patterns:
        starts.append({})
        if isinstance(pat.chain, OpPattern):
            for node in graph.nodes:
                for nodes in m.matches(pat.chain, node):
                    starts[-1].setdefault(m.order[id(nodes[0])], []).append(nodes)
    fused: dict[int, Op] = {}
    for k, node in enumerate(graph.nodes):
        if id(node) in m.claimed:
            continue
        for pat, start in zip(patterns, starts):
            for nodes in _candidates(pat, start.get(k, []), node, m):
                op = _composite(pat, nodes, graph, ops)
                if op is not None:
                    fused[k] = op
                    m.claimed.update(id(n) for n in nodes)
                    break
            if k in fused:
                break
    return [fused.get(k) or single_op(n) for k, n in enumerate(graph.nodes) if k in fused or id(n) not in m.claimed]


def _candidates(pat: Pattern, matches: list[list[Node]], node: Node, m: _Matcher):
    """The matches of ``pat`` whose first node is ``node`` and whose nodes are not fused yet."""
    if isinstance(pat.chain, OpPattern):
        yield from (nodes for nodes in matches if not any(id(n) in m.claimed for n in nodes))
        return
    nodes = m.follow(node, pat.chain)
    if nodes is not None:
        yield nodes
