"""BYOC partitioning, the way TVM's Relay passes do it, on the ONNX graph IR, for one codegen
(``codegens.py``: its op set, its composite patterns, its own refusals).

1. **Merge composites** (TVM's ``MergeComposite``): the codegen's pattern table.  ExampleJSON's
   (``examplejson.merge_composites``), tried in order, fuses chains
   such as Conv(+Add bias) → Relu (``examplejson.conv2d_bias_relu``), BatchNormalization → Relu
   (``batch_norm_relu``, pre-activation networks), Add or Sum → Relu (``add_relu``, ``sum_relu``:
   residual connections) or MatMul → Add(bias) (``dense_bias``: a Gemm for 2-D operands, else a
   MatMul with a bias input) into one op whose kernel applies the activation (``"activation": "relu"``).
   A channel shuffle (Reshape → Transpose → Reshape, ShuffleNet) read by a Conv becomes the Conv's
   ``input_shuffle`` (``shuffle_conv2d``, ``merge_shuffles``).
   A chain only fuses when the inner tensors are used by nothing else.  Another codegen's table is
   ``patterns.py``'s: chains and DAGs (diamonds), as TVM's pattern language writes them.  Whatever the
   codegen returns must hold every node once (``dependency_order`` checks it and puts each op after
   the ops making its inputs).
2. **Annotate** (``AnnotateTarget``): each op is supported when its kernel is in the chosen op set
   (the board's kernel table, optionally restricted with ``--ops``) and its attributes are ones the
   kernel knows; otherwise the reason is kept for the error message.
3. **Merge regions** (``MergeCompilerRegions``): walking in execution order, a supported op joins
   the regions of its supported producers, unless that would make a cycle (a path leaving the
   region and coming back into it through an op outside it).
4. **Partition** (``PartitionGraph``): each region becomes a function with an external symbol
   ``tvmgen_<module>_<codegen>_main_<k>``, numbered in execution order; its parameters are the
   tensors it reads from outside (constants stay inside, for the const loader), its results the
   tensors used after it or returned by the model.  With ``host=True`` every op left out becomes a
   host function of its own (``tvmgen_<module>_fused_<kernel>_<k>``, kind ``"host"``), ordered with
   the regions, as TVM leaves what the accelerator lacks to the host codegen.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from rpcsrv.loader.opset import OPS, node_problems, onnx_op_to_kernel

from .errors import CompileError
from .contrib_shapes import MS_DOMAIN, SURROGATES  # onnxruntime's quantized contrib ops
from .onnx_import import ONNX_DOMAINS, Graph
from .ops import Op, consumers  # noqa: F401  (codegens build on them)
from .quantize import op_quant

@dataclass
class Function:
    """One partitioned region: an external function of the codegen ``kind``, or (``kind ==
    "host"``) one op left on the host CPU, compiled to C by ``hostgen``."""

    symbol: str
    ops: list[Op]
    inputs: list[str]  # tensors read from outside, in first-use order (constants too for host functions)
    outputs: list[str]
    constants: list[str] = field(default_factory=list)  # constant tensors used inside
    kind: str = ""  # the codegen's name, or "host"


@dataclass
class Partition:
    """The model cut into external functions; ``unsupported`` ops have no place to run yet."""

    functions: list[Function]
    unsupported: list[Op]


def annotate(op: Op, ops: frozenset, graph: Graph | None = None) -> str:
    """Why ``op`` cannot go to the accelerator, or ``""`` when it can.

    Besides the op set, the op catalogue (``rpcsrv.loader.opset``) decides: input counts,
    attribute names, kinds and the values the board implements, and (with ``graph``, for the
    tensors' dtypes) the op's dtype rule; so what the board would refuse at run time is refused now.
    A composite is checked as its kernel with its attributes and inputs, or (``op.by_nodes``: a
    codegen's ``Pattern``) each of its nodes as its own op.
    """
    node = op.nodes[0]
    if node.domain not in ONNX_DOMAINS and not (node.domain == MS_DOMAIN and node.op_type in SURROGATES):
        return f"operator domain {node.domain!r} is not supported (only the default ONNX domain)"
    if op.kernel not in OPS:
        return f"no kernel {op.kernel!r} on the board"
    missing = sorted(op.requires - ops)
    if missing:
        return f"{', '.join(map(repr, missing))} not in the chosen op set (--ops)"
    if not op.by_nodes:
        return _problems(op.kernel, op.attrs, op.inputs, graph)
    for n in op.nodes:
        why = _problems(onnx_op_to_kernel(n.op_type), n.attrs, n.inputs, graph)
        if why:
            return f"{n.name} ({n.op_type}): {why}" if len(op.nodes) > 1 else why
    return ""


def _problems(kernel: str, attrs: dict, inputs: list[str], graph: Graph | None) -> str:
    if kernel not in OPS:
        return f"no kernel {kernel!r} on the board"
    bad = sorted(k for k, v in attrs.items() if v is None)
    if bad:
        return f"attribute(s) {', '.join(bad)} cannot be expressed (graphs or sparse tensors)"
    dtypes = None
    if graph is not None:
        dtypes = [graph.tensors[t].dtype if t in graph.tensors else None for t in inputs]
    problems = node_problems(kernel, attrs, [bool(t) for t in inputs], dtypes)
    return f"kernel {kernel!r}: {'; '.join(problems)}" if problems else ""


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def merge_regions(ops: list[Op]) -> list[list[int]]:
    """Group supported ops (by index, execution order) into regions without creating cycles.

    Ancestry is kept as bitsets: ``anc[i]`` has bit ``j`` set when op ``j`` feeds op ``i``
    (directly or not).  A set of ops ``S`` is a valid region when no op outside ``S`` that feeds a
    member has an ancestor in ``S`` (that op would have to run both after and before the region).
    Each region remembers its outside producers, so joining costs only a look at those.
    """
    producer: dict[str, int] = {o: i for i, op in enumerate(ops) for o in op.outputs if o}
    preds = [sorted({producer[t] for t in op.inputs if t in producer}) for op in ops]
    anc = [0] * len(ops)
    for i, ps in enumerate(preds):
        for p in ps:
            anc[i] |= anc[p] | (1 << p)
    parent: dict[int, int] = {}  # union-find over supported ops; roots are region ids
    members: dict[int, int] = {}  # root -> bitset of ops
    feeders: dict[int, int] = {}  # root -> bitset of outside ops feeding the region

    def find(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    for i, op in enumerate(ops):
        if op.reason:
            continue
        chosen, outside = 1 << i, sum(1 << p for p in preds[i])
        joined = []
        for p in preds[i]:
            if p not in parent:
                continue
            r = find(p)
            if r in joined:
                continue
            mask, feed = chosen | members[r], outside | feeders[r]
            if not any(anc[u] & mask for u in _bits(feed & ~mask)):
                chosen, outside = mask, feed
                joined.append(r)
        parent[i] = i
        for r in joined:
            parent[r] = i
            del members[r], feeders[r]
        members[i], feeders[i] = chosen, outside & ~chosen
    return [list(_bits(mask)) for mask in members.values()]


def partition(graph: Graph, ops: frozenset, module_name: str = "default", host: bool = False, *,
              codegen) -> Partition:
    """Run the four passes for ``codegen`` (a ``codegens.Codegen``: its composites, its ``check``, its name
    in the symbols); functions are numbered in execution order (see the module doc for ``host``)."""
    from .hostgen import data_inputs

    name = codegen.name
    all_ops = dependency_order(codegen.merge_composites(graph, ops), graph, name)
    for op in all_ops:
        op.quant = op.quant or op_quant(op, graph)
        op.reason = annotate(op, ops, graph) or codegen.check(op, graph)
    regions = merge_regions(all_ops)
    host_ops = {j for j, op in enumerate(all_ops) if op.reason} if host else set()
    regions = _execution_order(regions + [[j] for j in sorted(host_ops)], all_ops)
    outputs = set(graph.outputs)
    readers: dict[str, set[int]] = {}
    for j, op in enumerate(all_ops):
        for t in op.inputs:
            readers.setdefault(t, set()).add(j)
    functions: list[Function] = []
    counts = {name: 0, "host": 0}
    for region in regions:
        inside = set(region)
        if region[0] in host_ops:
            op = all_ops[region[0]]
            outs = [o for o in op.outputs if o and (o in outputs or readers.get(o))]
            if outs:
                functions.append(Function(f"tvmgen_{module_name}_fused_{op.kernel}_{counts['host']}", [op],
                                          data_inputs(op, graph), list(op.outputs), [], "host"))
                counts["host"] += 1
            continue
        produced = {o for j in region for o in all_ops[j].outputs if o}
        inputs, consts = [], []
        for j in region:
            for t in all_ops[j].inputs:
                if not t or t in produced:
                    continue
                target = consts if t in graph.constants else inputs
                if t not in target:
                    target.append(t)
        outs = [o for j in region for o in all_ops[j].outputs
                if o and (o in outputs or readers.get(o, set()) - inside)]
        if not outs:
            continue  # dead code: TVM's dead-code pass drops it too
        symbol = f"tvmgen_{module_name}_{name}_main_{counts[name]}"
        counts[name] += 1
        functions.append(Function(symbol, [all_ops[j] for j in region], inputs, outs, consts, name))
    return Partition(functions, [op for op in all_ops if op.reason])


def dependency_order(ops: list[Op], graph: Graph, codegen: str = "") -> list[Op]:
    """``ops`` (what a codegen's ``merge_composites`` returns) checked to hold every node of ``graph``
    once, and ordered so that each op comes after the ops making its inputs: the order kept where it
    is one already, else each op moved no earlier than it must (a composite placed at its first node
    may read a tensor made between its nodes)."""
    seen: dict[int, str] = {}
    for op in ops:
        for n in op.nodes:
            if id(n) in seen:
                raise CompileError(f"codegen {codegen!r}: node {n.name!r} is in two ops ({seen[id(n)]!r} and "
                                   f"{op.name!r}) after merge_composites")
            seen[id(n)] = op.name
    left = [n.name for n in graph.nodes if id(n) not in seen]
    if left or len(seen) != len(graph.nodes):
        raise CompileError(f"codegen {codegen!r}: merge_composites left out node(s) {', '.join(left[:5]) or '?'} "
                           f"(every node must be in one op)")
    producer = {o: j for j, op in enumerate(ops) for o in op.outputs if o}
    users: list[list[int]] = [[] for _ in ops]
    waiting = [0] * len(ops)
    for j, op in enumerate(ops):
        for p in {producer[t] for t in op.inputs if t in producer} - {j}:
            users[p].append(j)
            waiting[j] += 1
    ready = [j for j in range(len(ops)) if not waiting[j]]
    heapq.heapify(ready)
    order = []
    while ready:
        j = heapq.heappop(ready)
        order.append(ops[j])
        for u in users[j]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(ops):
        raise CompileError(f"codegen {codegen!r}: the ops of merge_composites depend on each other in a circle")
    return order


def _execution_order(regions: list[list[int]], ops: list[Op]) -> list[list[int]]:
    """Regions topologically sorted (Kahn's algorithm; ties: the region whose first op is first)."""
    where = {j: r for r, region in enumerate(regions) for j in region}
    producer = {o: i for i, op in enumerate(ops) for o in op.outputs if o}
    users: list[set[int]] = [set() for _ in regions]
    waiting = [0] * len(regions)
    for r, region in enumerate(regions):
        deps = {where[producer[t]] for j in region for t in ops[j].inputs
                if t in producer and producer[t] in where} - {r}
        waiting[r] = len(deps)
        for d in deps:
            users[d].add(r)
    ready = [(region[0], r) for r, region in enumerate(regions) if not waiting[r]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, r = heapq.heappop(ready)
        order.append(regions[r])
        for u in users[r]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (regions[u][0], u))
    return order
