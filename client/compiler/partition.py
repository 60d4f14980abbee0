"""BYOC partitioning, the way TVM's Relay passes do it, on the ONNX graph IR.

1. **Merge composites** (TVM's ``MergeComposite``): a pattern table, tried in order, fuses chains
   such as Conv(+Add bias) → Relu (``examplejson.conv2d_bias_relu``), BatchNormalization → Relu
   (``batch_norm_relu``, pre-activation networks), Add or Sum → Relu (``add_relu``, ``sum_relu``:
   residual connections) or MatMul → Add(bias) (``dense_bias``: a Gemm for 2-D operands, else a
   MatMul with a bias input) into one op whose kernel applies the activation (``"activation": "relu"``;
   also Clip with constant bounds, ReLU6, as ``"clip"`` with ``activation_attrs``, HardSwish and Swish).
   A channel shuffle (Reshape → Transpose → Reshape, ShuffleNet) read by a Conv becomes the Conv's
   ``input_shuffle`` (``shuffle_conv2d``, ``merge_shuffles``).
   A chain only fuses when the inner tensors are used by nothing else.
2. **Annotate** (``AnnotateTarget``): each op is supported when its kernel is in the chosen op set
   (the board's kernel table, optionally restricted with ``--ops``) and its attributes are ones the
   kernel knows; otherwise the reason is kept for the error message.
3. **Merge regions** (``MergeCompilerRegions``): walking in execution order, a supported op joins
   the regions of its supported producers, unless that would make a cycle (a path leaving the
   region and coming back into it through an op outside it).
4. **Partition** (``PartitionGraph``): each region becomes a function with an external symbol
   ``tvmgen_<module>_examplejson_main_<k>``, numbered in execution order; its parameters are the
   tensors it reads from outside (constants stay inside, for the const loader), its results the
   tensors used after it or returned by the model.  With ``host=True`` every op left out becomes a
   host function of its own (``tvmgen_<module>_fused_<kernel>_<k>``, kind ``"host"``), ordered with
   the regions, as TVM leaves what the accelerator lacks to the host codegen.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from rpcsrv.loader.opset import OPS, node_problems, onnx_op_to_kernel

from .onnx_import import ONNX_DOMAINS, Graph, Node, TensorInfo

COMPILER = "examplejson"


@dataclass
class Op:
    """A unit of partitioning: one ONNX node, or a composite of several fused ones."""

    name: str
    kernel: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    nodes: list[Node]
    pattern: str = ""  # composite name, "" for a single op
    reason: str = ""  # why it is not supported ("" when it is)
    requires: set = field(default_factory=set)  # op names the accelerator must have for this op

    def __post_init__(self):
        self.requires = set(self.requires) or {self.kernel}


@dataclass
class Function:
    """One partitioned region: an external function of the ExampleJSON codegen, or (``kind ==
    "host"``) one op left on the host CPU, compiled to C by ``hostgen``."""

    symbol: str
    ops: list[Op]
    inputs: list[str]  # tensors read from outside, in first-use order (constants too for host functions)
    outputs: list[str]
    constants: list[str] = field(default_factory=list)  # constant tensors used inside
    kind: str = COMPILER


@dataclass
class Partition:
    """The model cut into external functions; ``unsupported`` ops have no place to run yet."""

    functions: list[Function]
    unsupported: list[Op]


def _consumers(graph: Graph) -> dict[str, int]:
    uses: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    for o in graph.outputs:
        uses[o] = uses.get(o, 0) + 1
    return uses


def _single(node: Node) -> Op:
    return Op(node.name, onnx_op_to_kernel(node.op_type), list(node.inputs), list(node.outputs),
              dict(node.attrs), [node])


def _fusable(first: Node, second: Node, uses: dict) -> bool:
    """``second`` reads ``first``'s only output, which nothing else uses."""
    return (len(first.outputs) == 1 and uses.get(first.outputs[0]) == 1
            and first.outputs[0] in second.inputs and first.domain in ONNX_DOMAINS
            and second.domain in ONNX_DOMAINS)


def _fused_activation(kernel: str, act: Node, ops: frozenset, graph: Graph) -> tuple | None:
    """(kernel name, attrs or None) of ``act`` fused into ``kernel``: Relu; Clip with constant scalar bounds
    (ReLU6 of mobile networks, as ``clip`` with ``min``/``max``); HardSwish; Swish (SiLU, from
    ``simplify.fuse_swish``).  None: not fusable."""
    if kernel not in OPS or "activation" not in OPS[kernel].attrs:
        return None
    name = {"Relu": "relu", "Clip": "clip", "HardSwish": "hard_swish", "Swish": "swish"}.get(act.op_type)
    if name is None or name not in ops or (name != "clip" and act.attrs):
        return None
    if name != "clip":
        return name, None
    bounds = {k: act.attrs[k] for k in ("min", "max") if k in act.attrs}  # opset 6: attributes
    for key, tensor in zip(("min", "max"), act.inputs[1:3]):
        if tensor:
            value = graph.constants.get(tensor)
            if value is None or value.size != 1:
                return None
            bounds[key] = float(value.reshape(-1)[0])
    return name, bounds


def _dense_bias(mm: Node, add: Node, graph: Graph) -> list[str] | None:
    """Gemm inputs for MatMul(A, B) → Add(bias): 2-D A and B, a constant bias that broadcasts."""
    bias = [i for i in add.inputs if i != mm.outputs[0]]
    if len(add.inputs) != 2 or len(bias) != 1 or bias[0] not in graph.constants:
        return None
    a, b = (graph.tensors.get(x) for x in mm.inputs)
    c = graph.tensors.get(bias[0])
    if a is None or b is None or c is None or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if not a.dtype == b.dtype == c.dtype or c.dtype not in ("float32", "float64", "float16"):
        return None
    m, n = a.shape[0], b.shape[1]
    padded = (1,) * (2 - len(c.shape)) + c.shape
    if len(c.shape) > 2 or any(d not in (1, want) for d, want in zip(padded, (m, n))):
        return None
    return [mm.inputs[0], mm.inputs[1], bias[0]]


def _matmul_bias(mm: Node, add: Node, graph: Graph) -> list[str] | None:
    """MatMul inputs + bias for MatMul(A, B) → Add(constant) when the operands are not both 2-D
    (a transformer's (1, seq, width) @ (width, n) projections): the ``matmul`` kernel adds its
    optional third input in place.  The constant must broadcast onto the product without growing it.
    """
    bias = [i for i in add.inputs if i != mm.outputs[0]]
    if len(add.inputs) != 2 or len(bias) != 1 or bias[0] not in graph.constants:
        return None
    y, c = graph.tensors.get(mm.outputs[0]), graph.tensors.get(bias[0])
    out = graph.tensors.get(add.outputs[0])
    if y is None or c is None or out is None or out.shape != y.shape or not y.shape:
        return None
    if not y.dtype == c.dtype == out.dtype or c.dtype not in ("float32", "float64", "float16"):
        return None
    if len(c.shape) > len(y.shape) or any(d not in (1, want) for d, want in
                                          zip(reversed(c.shape), reversed(y.shape))):
        return None
    return [mm.inputs[0], mm.inputs[1], bias[0]]


def _conv_bias(conv: Node, add: Node, graph: Graph) -> list[str] | None:
    """Conv inputs for Conv(X, W) → Add(per-channel constant), as PyTorch exports often write it.

    The constant must broadcast as ``(1, C, 1, ...)`` over the output; it is added to the graph's
    constants reshaped to ``(C,)``, the layout of Conv's bias input.
    """
    if len(conv.inputs) > 2 and conv.inputs[2] or len(add.inputs) != 2:
        return None
    other = [i for i in add.inputs if i != conv.outputs[0]]
    out, w = graph.tensors.get(conv.outputs[0]), graph.tensors.get(conv.inputs[1])
    if len(other) != 1 or other[0] not in graph.constants or out is None or w is None:
        return None
    bias = graph.constants[other[0]]
    channels = w.shape[0]
    padded = (1,) * (len(out.shape) - bias.ndim) + tuple(bias.shape)
    if bias.ndim > len(out.shape) or bias.dtype.name != out.dtype or \
            padded != (1, channels) + (1,) * (len(out.shape) - 2):
        return None
    name = f"{other[0]}__conv_bias"
    graph.constants[name] = bias.reshape(channels)
    graph.tensors[name] = TensorInfo((channels,), out.dtype)
    return [conv.inputs[0], conv.inputs[1], name]


def merge_composites(graph: Graph, ops: frozenset) -> list[Op]:
    """Apply the pattern table; returns the ops in execution order.

    (A fused Conv → Add(bias) adds the reshaped bias to ``graph.constants``.)
    """
    uses = _consumers(graph)
    consumer_of: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            consumer_of.setdefault(i, []).append(n)
    done: set[int] = set()
    result: list[Op] = []

    def next_node(node: Node) -> Node | None:
        users = consumer_of.get(node.outputs[0], []) if node.outputs else []
        return users[0] if len(users) == 1 and _fusable(node, users[0], uses) else None

    for node in graph.nodes:
        if id(node) in done:
            continue
        op = _single(node)
        nxt = next_node(node)
        if node.op_type == "MatMul" and nxt is not None and nxt.op_type == "Add" \
                and {"matmul", "add"} <= ops and "gemm" in OPS:
            gemm_inputs = _dense_bias(node, nxt, graph)
            mm_inputs = None if gemm_inputs is not None else _matmul_bias(node, nxt, graph)
            if gemm_inputs is not None or mm_inputs is not None:
                kernel = "gemm" if gemm_inputs is not None else "matmul"
                op = Op(f"{node.name}+{nxt.name}", kernel, gemm_inputs or mm_inputs, list(nxt.outputs), {},
                        [node, nxt], f"{COMPILER}.dense_bias", requires={"matmul", "add"})
                done.add(id(nxt))
                nxt = next_node(nxt)
        if node.op_type == "Conv" and nxt is not None and nxt.op_type == "Add" and {"conv", "add"} <= ops:
            conv_inputs = _conv_bias(node, nxt, graph)
            if conv_inputs is not None:
                op = Op(f"{node.name}+{nxt.name}", "conv", conv_inputs, list(nxt.outputs), dict(node.attrs),
                        [node, nxt], f"{COMPILER}.conv2d_bias", requires={"conv", "add"})
                done.add(id(nxt))
                nxt = next_node(nxt)
        fused = _fused_activation(op.kernel, nxt, ops, graph) if nxt is not None else None
        if node.op_type in ("Conv", "Gemm", "MatMul", "BatchNormalization", "Add", "Sum") and fused \
                and op.requires <= ops:
            base = {"Conv": "conv2d_bias" if op.pattern or len(node.inputs) > 2 and node.inputs[2] else "conv2d",
                    "Gemm": "dense_bias", "MatMul": "dense_bias" if op.pattern else "dense",
                    "BatchNormalization": "batch_norm", "Add": "add", "Sum": "sum"}
            act, act_attrs = fused
            attrs = {**op.attrs, "activation": act, **({"activation_attrs": act_attrs} if act_attrs else {})}
            op = Op(f"{op.name}+{nxt.name}", op.kernel, op.inputs, list(nxt.outputs), attrs, op.nodes + [nxt],
                    f"{COMPILER}.{base[node.op_type]}_{act}", requires=op.requires | {act})
            done.add(id(nxt))
        result.append(op)
    return merge_shuffles(result, graph, uses) if {"reshape", "transpose", "conv"} <= ops else result


def _shuffle_groups(r1: Op, t: Op, r2: Op, graph: Graph) -> int:
    """g when Reshape (N, C, S...) → (N, g, C/g, S...), Transpose swapping axes 1 and 2, Reshape back to
    (N, C, S...) shuffle the channels in g groups (ShuffleNet's channel shuffle); else 0."""
    if r1.kernel != "reshape" or t.kernel != "transpose" or r2.kernel != "reshape" or r1.pattern or \
            t.pattern or r2.pattern:
        return 0
    shapes = [graph.tensors.get(name) for name in (r1.inputs[0], r1.outputs[0], t.outputs[0], r2.outputs[0])]
    if any(info is None for info in shapes):
        return 0
    x, split, swapped, back = (info.shape for info in shapes)
    if len(x) < 3 or back != x or len(split) != len(x) + 1 or split[0] != x[0] or split[3:] != x[2:]:
        return 0
    g, cg = split[1], split[2]
    perm = [0, 2, 1] + list(range(3, len(split)))
    if g * cg != x[1] or g < 2 or swapped != (x[0], cg, g) + tuple(x[2:]) or list(t.attrs.get("perm") or []) != perm:
        return 0
    return int(g)


def merge_shuffles(ops: list[Op], graph: Graph, uses: dict) -> list[Op]:
    """A channel shuffle (``_shuffle_groups``) read by a Conv alone becomes that Conv's ``input_shuffle``
    attribute (``examplejson.shuffle_conv2d``): two reshapes and a transpose fewer per ShuffleNet unit,
    and a depthwise conv shuffles in the layout copy it makes anyway (no copy of its own)."""
    producer = {o: op for op in ops for o in op.outputs if o}
    merged: set[int] = set()
    for conv in ops:
        if conv.kernel != "conv" or "input_shuffle" in conv.attrs or conv.nodes[0].op_type != "Conv":
            continue
        chain = [conv]
        for _ in range(3):  # back through the second Reshape, the Transpose and the first Reshape
            before = producer.get(chain[0].inputs[0]) if chain[0].inputs else None
            if before is None or len(before.outputs) != 1 or uses.get(before.outputs[0]) != 1 or \
                    before.outputs[0] in chain[0].inputs[1:]:
                break
            chain.insert(0, before)
        if len(chain) != 4:
            continue
        g = _shuffle_groups(*chain[:3], graph)
        if not g:
            continue
        r1 = chain[0]
        base = conv.pattern.split(".")[-1] if conv.pattern else "conv2d"
        conv.name = "+".join(op.name for op in chain)
        conv.inputs = [r1.inputs[0]] + conv.inputs[1:]
        conv.attrs = {**conv.attrs, "input_shuffle": g}
        conv.nodes = [n for op in chain for n in op.nodes]
        conv.pattern = f"{COMPILER}.shuffle_{base}"
        conv.requires = conv.requires | {"reshape", "transpose"}
        merged.update(id(op) for op in chain[:3])
    return [op for op in ops if id(op) not in merged]


def annotate(op: Op, ops: frozenset, graph: Graph | None = None) -> str:
    """Why ``op`` cannot go to the accelerator, or ``""`` when it can.

    Besides the op set, the op catalogue (``rpcsrv.loader.opset``) decides: input counts,
    attribute names, kinds and the values the board implements, and (with ``graph``, for the
    tensors' dtypes) the op's dtype rule; so what the board would refuse at run time is refused now.
    """
    node = op.nodes[0]
    if node.domain not in ONNX_DOMAINS:
        return f"operator domain {node.domain!r} is not supported (only the default ONNX domain)"
    if op.kernel not in OPS:
        return f"no kernel {op.kernel!r} on the board"
    missing = sorted(op.requires - ops)
    if missing:
        return f"{', '.join(map(repr, missing))} not in the chosen op set (--ops)"
    bad = sorted(k for k, v in op.attrs.items() if v is None)
    if bad:
        return f"attribute(s) {', '.join(bad)} cannot be expressed (graphs or sparse tensors)"
    dtypes = None
    if graph is not None:
        dtypes = [graph.tensors[t].dtype if t in graph.tensors else None for t in op.inputs]
    problems = node_problems(op.kernel, op.attrs, [bool(t) for t in op.inputs], dtypes)
    return f"kernel {op.kernel!r}: {'; '.join(problems)}" if problems else ""


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


def partition(graph: Graph, ops: frozenset, module_name: str = "default", host: bool = False) -> Partition:
    """Run the four passes; functions are numbered in execution order (see the module doc for ``host``)."""
    from .hostgen import data_inputs

    all_ops = merge_composites(graph, ops)
    for op in all_ops:
        op.reason = annotate(op, ops, graph)
    regions = merge_regions(all_ops)
    host_ops = {j for j, op in enumerate(all_ops) if op.reason} if host else set()
    regions = _execution_order(regions + [[j] for j in sorted(host_ops)], all_ops)
    outputs = set(graph.outputs)
    readers: dict[str, set[int]] = {}
    for j, op in enumerate(all_ops):
        for t in op.inputs:
            readers.setdefault(t, set()).add(j)
    functions: list[Function] = []
    counts = {COMPILER: 0, "host": 0}
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
        symbol = f"tvmgen_{module_name}_{COMPILER}_main_{counts[COMPILER]}"
        counts[COMPILER] += 1
        functions.append(Function(symbol, [all_ops[j] for j in region], inputs, outs, consts))
    return Partition(functions, [op for op in all_ops if op.reason])


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
