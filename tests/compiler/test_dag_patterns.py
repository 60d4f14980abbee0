"""DAG patterns in a codegen's table (``rpcsrv.client.compiler.patterns``, TVM's pattern language): diamonds,
a tensor shared by two nodes of the pattern, Add matched either way round, the rules that keep a match out
(an inner tensor read outside, a node fused already), table order at a common first node, and the partition
of a composite that reads a tensor made between its nodes.  Chains keep their results: a property test
against the chain matcher as it was, and against the same chains written as dataflow patterns."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from compiler_helpers import make_model
from rpcsrv.client.compiler import CompileError
from rpcsrv.client.compiler.codegens import Codegen, External, Pattern, is_constant, is_op, match_patterns, wildcard
from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.ops import consumers, single_op
from rpcsrv.client.compiler.partition import dependency_order, partition

n = helper.make_node
OPS = frozenset({"conv", "relu", "add", "mul", "neg", "tanh", "sigmoid"})


def _conv_graph(nodes, out="y", extra_inits=None):
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 4, 3, 3)).astype("float32"), "b": np.ones(4, "float32"),
             **(extra_inits or {})}
    return import_onnx(make_model(nodes, [("x", [1, 4, 6, 6])], [(out, [1, 4, 6, 6])], inits))


def _fused(ops):
    return [(op.name, op.pattern) for op in ops if op.pattern]


def _conv():
    return is_op("Conv")(wildcard(), is_constant(), is_constant())


def test_a_diamond_is_one_composite():
    graph = _conv_graph([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                         n("Relu", ["c"], ["r"], name="relu"),
                         n("Add", ["c", "r"], ["y"], name="add")])
    conv = _conv()
    ops = match_patterns(graph, [Pattern("npu.diamond", is_op("Add")(conv, is_op("Relu")(conv)))], OPS)
    assert len(ops) == 1
    op = ops[0]
    assert (op.name, op.kernel, op.pattern) == ("conv+relu+add", "conv", "npu.diamond")
    assert [m.name for m in op.nodes] == ["conv", "relu", "add"]
    assert (op.inputs, op.outputs, op.requires) == (["x", "w", "b"], ["y"], {"conv", "relu", "add"})
    assert op.attrs["pads"] == [1, 1, 1, 1]
    # both ways round: Add(relu, conv) is the same diamond
    graph = _conv_graph([n("Conv", ["x", "w", "b"], ["c"], name="conv"), n("Relu", ["c"], ["r"], name="relu"),
                         n("Add", ["r", "c"], ["y"], name="add")])
    assert _fused(match_patterns(graph, [Pattern("npu.diamond", is_op("Add")(conv, is_op("Relu")(conv)))], OPS)) \
        == [("conv+relu+add", "npu.diamond")]


def test_one_pattern_object_is_one_tensor():
    x = wildcard()
    residual = Pattern("npu.residual", is_op("Add")(is_op("Conv")(x, is_constant(), is_constant()), x))
    same = _conv_graph([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                        n("Add", ["x", "c"], ["y"], name="add")])
    ops = match_patterns(same, [residual], OPS)
    assert _fused(ops) == [("conv+add", "npu.residual")] and ops[0].inputs == ["x", "w", "b", "x"]
    other = _conv_graph([n("Relu", ["x"], ["rx"], name="pre"), n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1],
                                                                   name="conv"),
                         n("Add", ["rx", "c"], ["y"], name="add")])
    assert _fused(match_patterns(other, [residual], OPS)) == []  # the Add reads another tensor than the Conv
    loose = Pattern("npu.any_add", is_op("Add")(is_op("Conv")(wildcard(), is_constant(), is_constant()), wildcard()))
    assert _fused(match_patterns(other, [loose], OPS)) == [("conv+add", "npu.any_add")]


def test_what_keeps_a_match_out():
    conv = _conv()
    diamond = Pattern("npu.diamond", is_op("Add")(conv, is_op("Relu")(conv)))
    nodes = [n("Conv", ["x", "w", "b"], ["c"], name="conv"), n("Relu", ["c"], ["r"], name="relu"),
             n("Add", ["c", "r"], ["a"], name="add"), n("Mul", ["a", "r"], ["y"], name="mul")]
    assert _fused(match_patterns(_conv_graph(nodes), [diamond], OPS)) == []  # relu's output read outside
    nodes = [n("Conv", ["x", "w", "b"], ["c"], name="conv"), n("Relu", ["c"], ["r"], name="relu"),
             n("Add", ["c", "r"], ["y"], name="add")]
    assert _fused(match_patterns(_conv_graph(nodes), [diamond], OPS - {"relu"})) == []  # not in the op set
    weights_as_input = Pattern("npu.d2", is_op("Add")(is_op("Conv")(wildcard(), wildcard()), wildcard()))
    assert _fused(match_patterns(_conv_graph(nodes), [weights_as_input], OPS)) == []  # three inputs, not two
    refused = Pattern("npu.d3", diamond.chain, inputs=lambda nodes, graph: None)
    assert _fused(match_patterns(_conv_graph(nodes), [refused, diamond], OPS)) == [("conv+relu+add", "npu.diamond")]


def test_table_order_decides_at_a_common_first_node():
    nodes = [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"), n("Relu", ["c"], ["r"], name="relu"),
             n("Add", ["r", "x"], ["a"], name="add"), n("Relu", ["a"], ["y"], name="relu2")]
    block = Pattern("npu.block", is_op("Relu")(is_op("Add")(is_op("Relu")(is_op("Conv")), wildcard())))
    chain = Pattern("npu.conv_relu", ("Conv", "Relu"))
    assert _fused(match_patterns(_conv_graph(nodes), [block, chain], OPS)) == [("conv+relu+add+relu2", "npu.block")]
    assert _fused(match_patterns(_conv_graph(nodes), [chain, block], OPS)) == [("conv+relu", "npu.conv_relu")]


def test_a_node_fused_once():
    """Two chains ending in one Add: the first takes it, the second does not (the chain matcher once put
    the Add in both)."""
    graph = import_onnx(make_model([n("Neg", ["x"], ["a"], name="neg"), n("Relu", ["x"], ["b"], name="relu"),
                                    n("Add", ["a", "b"], ["y"], name="add")], [("x", [3])], [("y", [3])]))
    ops = match_patterns(graph, [Pattern("t.neg_add", ("Neg", "Add")), Pattern("t.relu_add", ("Relu", "Add"))], OPS)
    assert [(op.name, op.pattern) for op in ops] == [("neg+add", "t.neg_add"), ("relu", "")]


def test_every_way_a_pattern_matches_counts():
    """Add(Neg(.), .) matches this Add two ways round; the match starting at the first Neg is the one fused
    there (as the chain Neg → Add fuses it), not the one the written order finds first."""
    graph = import_onnx(make_model([n("Neg", ["x"], ["a"], name="neg1"), n("Neg", ["x"], ["b"], name="neg2"),
                                    n("Add", ["b", "a"], ["y"], name="add")], [("x", [3])], [("y", [3])]))
    ops = match_patterns(graph, [Pattern("t.neg_add", is_op("Add")(is_op("Neg"), wildcard()))], OPS)
    assert [(op.name, op.inputs) for op in ops] == [("neg1+add", ["x", "b"]), ("neg2", ["x"])]


def test_a_wildcard_stands_for_a_tensor_from_outside():
    """Add(Neg(Neg(.)), .) where the Add's other input is the first Neg's output: that tensor is made inside
    the match, so the wildcard does not match it."""
    graph = import_onnx(make_model([n("Neg", ["x"], ["a"], name="neg1"), n("Neg", ["a"], ["b"], name="neg2"),
                                    n("Add", ["a", "b"], ["y"], name="add")], [("x", [3])], [("y", [3])]))
    pattern = Pattern("t.p", is_op("Add")(is_op("Neg")(is_op("Neg")), wildcard()))
    assert _fused(match_patterns(graph, [pattern], OPS)) == []
    inner = Pattern("t.q", is_op("Add")(is_op("Neg")(wildcard()), is_op("Neg")))  # a is read twice, inside: fine
    assert _fused(match_patterns(graph, [inner], OPS)) == [("neg1+neg2+add", "t.q")]
    first = is_op("Neg")
    diamond = Pattern("t.d", is_op("Add")(first, is_op("Neg")(first)))
    assert _fused(match_patterns(graph, [diamond], OPS)) == [("neg1+neg2+add", "t.d")]


def test_declaration_errors():
    with pytest.raises(TypeError, match="root of a dataflow pattern"):
        Pattern("t.bad", wildcard())
    with pytest.raises(TypeError, match="chain must be ONNX op types"):
        Pattern("t.bad", "Conv")
    with pytest.raises(TypeError, match="takes patterns"):
        is_op("Add")("x", wildcard())
    graph = _conv_graph([n("Conv", ["x", "w", "b"], ["c"], name="conv"), n("Add", ["c", "x"], ["y"], name="add")])
    lossy = Pattern("t.lossy", ("Conv", "Add"), inputs=lambda nodes, graph: ["x", "w", "b"])
    assert _fused(match_patterns(graph, [lossy], OPS))  # x is still there: fine
    lossy = Pattern("t.lossy", ("Conv", "Add"), inputs=lambda nodes, graph: ["w", "b"])
    with pytest.raises(CompileError, match="left out x"):
        match_patterns(graph, [lossy], OPS)


class _Npu(Codegen):
    """A codegen for partition tests: conv, relu, add; refuses nothing; generates nothing."""

    name = "npu"
    ops = frozenset({"conv", "relu", "add"})

    def __init__(self, patterns=(), merge=None):
        self.patterns = tuple(patterns)
        self._merge = merge

    def merge_composites(self, graph, ops):
        return self._merge(graph, ops) if self._merge else super().merge_composites(graph, ops)

    def generate(self, fn, graph):
        return External(None)


def test_a_composite_after_the_tensors_it_reads():
    """The block reads ``s``, made by a Conv listed between its nodes: its function runs after that one."""
    nodes = [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"), n("Relu", ["c"], ["r"], name="relu"),
             n("Conv", ["x", "w", "b"], ["s"], pads=[1, 1, 1, 1], name="shortcut"),
             n("Add", ["s", "r"], ["a"], name="add"), n("Relu", ["a"], ["y"], name="relu2")]
    graph = _conv_graph(nodes)
    block = Pattern("npu.block", is_op("Relu")(is_op("Add")(is_op("Relu")(is_op("Conv")), wildcard())))
    ops = match_patterns(graph, [block], OPS)
    assert [op.name for op in ops] == ["conv+relu+add+relu2", "shortcut"]  # in the place of its first node
    assert [op.name for op in dependency_order(ops, graph)] == ["shortcut", "conv+relu+add+relu2"]
    part = partition(graph, _Npu.ops, codegen=_Npu([block]))
    assert [[op.name for op in fn.ops] for fn in part.functions] == [["shortcut", "conv+relu+add+relu2"]]
    fn = part.functions[0]
    assert (fn.inputs, fn.constants, fn.outputs) == (["x"], ["w", "b"], ["y"])
    host = partition(graph, frozenset({"relu", "add"}), host=True, codegen=_Npu([block]))
    assert not [fn for fn in host.functions if fn.kind == "npu" and "conv" in [op.kernel for op in fn.ops]]


def test_merge_composites_must_cover_every_node_once():
    graph = _conv_graph([n("Conv", ["x", "w", "b"], ["c"], name="conv"), n("Relu", ["c"], ["y"], name="relu")])
    twice = _Npu(merge=lambda g, ops: [single_op(g.nodes[0]), single_op(g.nodes[0]), single_op(g.nodes[1])])
    with pytest.raises(CompileError, match="node 'conv' is in two ops"):
        partition(graph, _Npu.ops, codegen=twice)
    dropped = _Npu(merge=lambda g, ops: [single_op(g.nodes[1])])
    with pytest.raises(CompileError, match="left out node"):
        partition(graph, _Npu.ops, codegen=dropped)


# ------------------------------------------------------------------ chains: the same results as before

UNARY, BINARY = ("Relu", "Neg", "Tanh"), ("Add", "Mul")


def _chain_matcher(graph, patterns, ops):
    """The chain matcher as it was before dataflow patterns (with a fused node never taken twice)."""
    from rpcsrv.loader.opset import onnx_op_to_kernel
    from rpcsrv.client.compiler.ops import Op

    uses = consumers(graph)
    readers = {}
    for m in graph.nodes:
        for i in m.inputs:
            readers.setdefault(i, []).append(m)
    done, result = set(), []
    for node in graph.nodes:
        if id(node) in done:
            continue
        op = None
        for pat in patterns:
            chain = [node] if node.op_type == pat.chain[0] else None
            for op_type in pat.chain[1:]:
                if chain is None:
                    break
                last = chain[-1]
                nxt = readers.get(last.outputs[0], [])
                if len(last.outputs) != 1 or uses.get(last.outputs[0]) != 1 or len(nxt) != 1 \
                        or nxt[0].op_type != op_type or id(nxt[0]) in done:
                    chain = None
                else:
                    chain.append(nxt[0])
            if chain is None:
                continue
            kernel = onnx_op_to_kernel(node.op_type)
            needs = {onnx_op_to_kernel(m.op_type) for m in chain}
            if not needs <= ops:
                continue
            inputs = list(chain[0].inputs)
            for prev, m in zip(chain, chain[1:]):
                inputs += [i for i in m.inputs if i not in prev.outputs]
            op = Op("+".join(m.name for m in chain), kernel, inputs, list(chain[-1].outputs), dict(node.attrs),
                    chain, pat.name, requires=needs)
            done.update(id(m) for m in chain)
            break
        result.append(op or single_op(node))
    return result


def _as_dataflow(chain):
    root = is_op(chain[0])
    for op_type in chain[1:]:
        root = is_op(op_type)(root) if op_type in UNARY else is_op(op_type)(root, wildcard())
    return root


@st.composite
def graphs_and_tables(draw):
    count = draw(st.integers(1, 9))
    nodes = []
    for k in range(count):
        op = draw(st.sampled_from(UNARY + BINARY if k else UNARY))
        pool = list(range(k + 1))  # tensor 0 is the input x, node j makes tensor j + 1
        ins = draw(st.lists(st.sampled_from(pool), min_size=1 if op in UNARY else 2,
                            max_size=1 if op in UNARY else 2, unique=True))
        nodes.append((op, ins))
    chains = draw(st.lists(st.lists(st.sampled_from(UNARY + BINARY), min_size=1, max_size=3).map(tuple),
                           min_size=1, max_size=4))
    return nodes, chains


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs_and_tables())
def test_chains_match_as_before(case):
    nodes, chains = case
    names = ["x"] + [f"t{k}" for k in range(len(nodes))]
    read = {i for _, ins in nodes for i in ins}
    outs = [names[k + 1] for k in range(len(nodes)) if k + 1 not in read]
    model = make_model([n(op, [names[i] for i in ins], [names[k + 1]], name=f"n{k}") for k, (op, ins) in
                        enumerate(nodes)], [("x", [3])], [(o, [3]) for o in outs])
    graph = import_onnx(model)
    table = [Pattern(f"t.p{k}", chain) for k, chain in enumerate(chains)]
    dataflow = [Pattern(f"t.p{k}", _as_dataflow(chain)) for k, chain in enumerate(chains)]

    def summary(ops):
        return [(op.name, op.kernel, op.inputs, op.outputs, op.pattern) for op in ops]

    before = summary(_chain_matcher(graph, table, OPS))
    assert summary(match_patterns(graph, table, OPS)) == before
    assert summary(match_patterns(graph, dataflow, OPS)) == before
