"""Inference simplifications on the graph IR, before partitioning (TVM's ``SimplifyInference`` +
``FoldScaleAxis`` + ``FoldConstant`` for the one pattern that matters in CNNs).

**No-ops vanish** (``remove_noops``, always applied): Dropout (not in training mode), Identity, and a
Cast, Reshape, Flatten, Squeeze, Unsqueeze or Expand whose output has its input's shape and dtype do
nothing at inference, so no codegen nor the host must run them: their readers read the input
instead.  When the no-op's output is a model output, the node producing its input is renamed to
write that output (unless that input is a model input, a constant or another output: then it stays).

**Conv → BatchNormalization folding.**  In inference, BatchNormalization is a per-channel affine
map ``y = x * s + t`` with ``s = scale / sqrt(var + epsilon)`` and ``t = B - mean * s``.  Right after
a convolution it can be folded into the convolution's constants::

    W'[m] = W[m] * s[m]        b'[m] = (b[m] - mean[m]) * s[m] + B[m]

so the compiled library runs one conv (with bias, and the Conv+bias+Relu composite still applies)
instead of a conv and a normalization pass.  onnxruntime folds the same pattern.  The fold is done
in float64 and rounded once to the weights' dtype.

It is applied only when the folded conv computes what both nodes compute (up to float rounding):

* the Conv's output is read by the BatchNormalization alone (and is not a model output);
* the Conv's weights (and bias, if any) and all four BatchNormalization inputs are constants;
* the BatchNormalization is in inference mode (``training_mode`` 0, ``is_test``/``spatial`` at their
  inference values where old opsets have them) and only its ``Y`` output is used;
* the tensors are floating point of one dtype.

New constants get new names, so weights shared with another node stay as they were.

**Per-channel affine chains.**  Old exports (Caffe2's, the light model zoo's DenseNet) write a
normalization as ``BatchNormalization`` → ``Mul(per-channel constant)`` → ``Add(per-channel constant)``.
``fold_affine`` composes such a chain (any run of those three ops, each reading the last one's
output) into one ``BatchNormalization`` with ``scale = s``, ``B = t``, ``mean = 0``, ``var = 1`` and
``epsilon = 0``, which computes exactly ``x * s + t``; the partitioner then fuses a Relu after it, and
``fold_conv_batchnorm`` folds it into a Conv before it.  A constant is per-channel when it broadcasts
over the data as ``(1, C, 1, ...)`` (or is a scalar) without growing it.  The same conditions as above
hold (inner tensors read once and not model outputs, constants, one floating dtype); a lone Mul or Add
is rewritten only when a Conv before it then absorbs it.

**Scale through a Relu into the next Conv.**  A pre-activation ``BatchNormalization`` (``x * s + t``)
→ ``Relu`` → ``Conv`` with every ``s > 0`` computes ``relu(x * s + t) = s * relu(x + t / s)``, and the
factor ``s`` (per input channel of the Conv, whose zero padding it keeps zero) moves into the Conv's
weights: ``fold_scale_into_conv`` leaves ``Add(x, t / s)`` → ``Relu`` (one fused add_relu kernel, two
passes over the tensor instead of three).  Only for an ungrouped Conv that alone reads the Relu,
which alone reads the normalization; the weights get a new name.

**A bias through a 1x1 Conv.**  ``Conv_A(x) + b`` read by a 1x1 ``Conv_B`` alone (no padding, any
stride and groups) is ``Conv_B(Conv_A(x)) + W_B b``: ``fold_bias_forward`` moves ``W_B b`` into
``Conv_B``'s bias and drops ``Conv_A``'s, which saves a pass where the bias cost one (ShuffleNet's
depthwise convs, each followed by a grouped 1x1 conv, after their BatchNormalization was folded in).

**Activations as one op** (``fuse.py``): SiLU's ``Mul(x, Sigmoid(x))`` becomes ``Swish(x)``, and GELU's erf
pattern (PyTorch's export of ``F.gelu``) one ``Gelu(x)``.
"""

from __future__ import annotations

import numpy as np

from .fuse import fuse_gelu, fuse_swish
from .fuse import readers as _readers, sole_reader as _sole_reader, uses as _uses
from .onnx_import import ONNX_DOMAINS, Graph, Node, TensorInfo

_FLOATS = ("float16", "float32", "float64")


def _inference_bn(bn: Node, uses: dict) -> bool:
    a = bn.attrs
    if a.get("training_mode", 0) or not a.get("is_test", 1) or not a.get("spatial", 1):
        return False
    return bn.domain in ONNX_DOMAINS and all(not o or not uses.get(o) for o in bn.outputs[1:])


def _foldable(conv: Node, bn: Node, graph: Graph, uses: dict) -> bool:
    """Every condition of the module docstring for ``conv`` → ``bn``."""
    if bn.op_type != "BatchNormalization" or len(bn.inputs) != 5 or not _inference_bn(bn, uses):
        return False
    if conv.op_type != "Conv" or conv.domain not in ONNX_DOMAINS or len(conv.outputs) != 1:
        return False
    out = conv.outputs[0]
    if bn.inputs[0] != out or uses.get(out) != 1 or out in bn.inputs[1:]:
        return False
    consts = [conv.inputs[1]] + [t for t in conv.inputs[2:3] if t] + list(bn.inputs[1:])
    if not all(t in graph.constants for t in consts):
        return False
    info = graph.tensors.get(out)
    dtypes = {graph.constants[t].dtype.name for t in consts} | {info.dtype if info else "?"}
    channels = graph.constants[conv.inputs[1]].shape[0]
    return len(dtypes) == 1 and dtypes <= set(_FLOATS) and \
        all(graph.constants[t].shape == (channels,) for t in consts[1:])


def _new_constant(graph: Graph, base: str, value: np.ndarray) -> str:
    name, k = f"{base}__bn_folded", 1
    while name in graph.tensors or name in graph.constants:
        k += 1
        name = f"{base}__bn_folded_{k}"
    graph.constants[name] = value
    graph.tensors[name] = TensorInfo(tuple(value.shape), value.dtype.name)
    return name


def fold_conv_batchnorm(graph: Graph) -> int:
    """Fold inference BatchNormalizations into the Conv before them (``graph`` changed in place).

    Returns how many were folded.
    """
    uses = _uses(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    folded: set[int] = set()
    for bn in graph.nodes:
        conv = producer.get(bn.inputs[0]) if bn.inputs else None
        if conv is None or not _foldable(conv, bn, graph, uses):
            continue
        w = graph.constants[conv.inputs[1]]
        dtype = w.dtype
        scale, shift, mean, var = (graph.constants[t].astype(np.float64) for t in bn.inputs[1:])
        s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        bias = graph.constants[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] \
            else np.zeros(w.shape[0])
        new_w = (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dtype)
        new_b = ((bias - mean) * s + shift).astype(dtype)
        conv.inputs = [conv.inputs[0], _new_constant(graph, conv.inputs[1], new_w),
                       _new_constant(graph, conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2]
                                     else f"{conv.name}_bias", new_b)]
        graph.tensors.pop(conv.outputs[0], None)
        conv.outputs = [bn.outputs[0]]
        conv.name = f"{conv.name}+{bn.name}"
        folded.add(id(bn))
    if folded:
        graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    return len(folded)


def _channel_vector(graph: Graph, name: str, shape: tuple, dtype: str) -> np.ndarray | None:
    """Constant ``name`` as a float64 vector of ``shape[1]`` entries when it broadcasts per channel
    over a tensor of ``shape`` (rank >= 2) without growing it; None otherwise."""
    c = graph.constants.get(name)
    if c is None or len(shape) < 2 or c.ndim > len(shape) or c.dtype.name != dtype:
        return None
    padded = (1,) * (len(shape) - c.ndim) + tuple(c.shape)
    if any(d != 1 for k, d in enumerate(padded) if k != 1) or padded[1] not in (1, shape[1]):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (shape[1],))


def _affine_step(node: Node, graph: Graph, uses: dict) -> tuple[str, np.ndarray, np.ndarray] | None:
    """``(x, s, t)`` when ``node`` computes ``x * s + t`` with per-channel constants ``s``, ``t``."""
    if node.domain not in ONNX_DOMAINS or len(node.outputs) < 1 or not node.outputs[0]:
        return None
    out = graph.tensors.get(node.outputs[0])
    if out is None or out.dtype not in _FLOATS:
        return None
    if node.op_type in ("Mul", "Add") and len(node.inputs) == 2 and len(node.outputs) == 1:
        data = [i for i in node.inputs if i not in graph.constants]
        if len(data) != 1 or node.inputs.count(data[0]) != 1:
            return None
        x = data[0]
        info = graph.tensors.get(x)
        if info is None or info.shape != out.shape or info.dtype != out.dtype:
            return None
        other = node.inputs[1] if node.inputs[0] == x else node.inputs[0]
        c = _channel_vector(graph, other, out.shape, out.dtype)
        if c is None:
            return None
        return (x, c, np.zeros_like(c)) if node.op_type == "Mul" else (x, np.ones_like(c), c)
    if node.op_type == "BatchNormalization" and len(node.inputs) == 5 and _inference_bn(node, uses):
        x = node.inputs[0]
        info = graph.tensors.get(x)
        if info is None or info.shape != out.shape or info.dtype != out.dtype or len(out.shape) < 2 or \
                not all(t in graph.constants and graph.constants[t].shape == (out.shape[1],) and
                        graph.constants[t].dtype.name == out.dtype for t in node.inputs[1:]):
            return None
        scale, shift, mean, var = (graph.constants[t].astype(np.float64) for t in node.inputs[1:])
        s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        return x, s, shift - mean * s
    return None


def _affine_node(graph: Graph, chain: list[Node], x: str, s: np.ndarray, t: np.ndarray) -> Node:
    """The one BatchNormalization computing ``x * s + t`` in place of ``chain``."""
    dtype = np.dtype(graph.tensors[x].dtype)
    base = chain[0].name
    names = [_new_constant(graph, f"{base}_{k}", v.astype(dtype))
             for k, v in (("scale", s), ("shift", t), ("mean", np.zeros_like(s)), ("var", np.ones_like(s)))]
    for node in chain[:-1]:
        graph.tensors.pop(node.outputs[0], None)
    return Node("+".join(n.name for n in chain), "BatchNormalization", "", [x] + names,
                [chain[-1].outputs[0]], {"epsilon": 0.0})


def fold_affine(graph: Graph) -> int:
    """Compose per-channel affine chains into one BatchNormalization each (see the module doc; ``graph``
    changed in place).  Returns how many nodes were removed or rewritten."""
    uses = _uses(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            readers.setdefault(i, []).append(n)
    replaced: dict[int, Node | None] = {}  # id(node) -> its replacement (None: removed)
    count = 0
    for node in graph.nodes:
        step = None if id(node) in replaced else _affine_step(node, graph, uses)
        if step is None:
            continue
        x, s, t = step
        chain = [node]
        while True:
            y = chain[-1].outputs[0]
            users = readers.get(y, [])
            if uses.get(y) != 1 or len(users) != 1:
                break
            nxt = _affine_step(users[0], graph, uses)
            if nxt is None or nxt[0] != y:
                break
            chain.append(users[0])
            s, t = s * nxt[1], t * nxt[1] + nxt[2]
        if len(chain) == 1:  # a lone Mul or Add pays only when it then folds into a Conv
            before = producer.get(x)
            if node.op_type == "BatchNormalization" or before is None or before.op_type != "Conv" \
                    or uses.get(x) != 1:
                continue
        replaced[id(chain[0])] = _affine_node(graph, chain, x, s, t)
        replaced.update({id(n): None for n in chain[1:]})
        count += len(chain)
    if replaced:
        graph.nodes = [replaced.get(id(n), n) for n in graph.nodes if replaced.get(id(n), n) is not None]
    return count


def fold_scale_into_conv(graph: Graph) -> int:
    """BatchNormalization → Relu → Conv with positive scales becomes Add → Relu → Conv with the scales in
    the Conv's weights (see the module doc; ``graph`` changed in place).  Returns how many."""
    uses, readers = _uses(graph), _readers(graph)
    count = 0
    for k, bn in enumerate(graph.nodes):
        step = _affine_step(bn, graph, uses) if bn.op_type == "BatchNormalization" else None
        relu = step and _sole_reader(bn.outputs[0], readers, uses)
        if not relu or relu.op_type != "Relu" or relu.domain not in ONNX_DOMAINS or len(relu.outputs) != 1:
            continue
        conv = _sole_reader(relu.outputs[0], readers, uses)
        x, s, t = step
        info = graph.tensors[x]
        if conv is None or conv.op_type != "Conv" or conv.domain not in ONNX_DOMAINS or \
                conv.attrs.get("group", 1) != 1 or conv.inputs[0] != relu.outputs[0] or \
                conv.inputs[1] not in graph.constants or relu.outputs[0] in conv.inputs[1:]:
            continue
        w = graph.constants[conv.inputs[1]]
        with np.errstate(all="ignore"):
            shift = t / s
        if w.dtype.name != info.dtype or w.ndim != len(info.shape) or w.shape[1] != s.shape[0] or \
                not (np.all(s > 0) and np.all(np.isfinite(s)) and np.all(np.isfinite(shift))):
            continue
        new_w = (w.astype(np.float64) * s.reshape((1, -1) + (1,) * (w.ndim - 2))).astype(w.dtype)
        conv.inputs[1] = _new_constant(graph, conv.inputs[1], new_w)
        shift = shift.reshape((-1,) + (1,) * (len(info.shape) - 2)).astype(w.dtype)
        graph.nodes[k] = Node(bn.name, "Add", "", [x, _new_constant(graph, f"{bn.name}_shift", shift)],
                              [bn.outputs[0]], {})
        count += 1
    return count


def _pointwise(conv: Node, graph: Graph) -> bool:
    """A 1x1 Conv with constant weights, no padding: a per-position linear map of the channels."""
    w = graph.constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    a = conv.attrs
    return (w is not None and w.ndim >= 3 and all(k == 1 for k in w.shape[2:])
            and not any(a.get("pads") or []) and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))


def fold_bias_forward(graph: Graph) -> int:
    """Move a Conv's constant bias into the 1x1 Conv that alone reads it (module doc); how many moved."""
    uses, readers = _uses(graph), _readers(graph)
    count = 0
    for a in graph.nodes:
        if a.op_type != "Conv" or a.domain not in ONNX_DOMAINS or len(a.inputs) < 3 or not a.inputs[2] or \
                a.inputs[2] not in graph.constants or len(a.outputs) != 1:
            continue
        b = _sole_reader(a.outputs[0], readers, uses)
        if b is None or b.op_type != "Conv" or b.domain not in ONNX_DOMAINS or b.inputs[0] != a.outputs[0] or \
                a.outputs[0] in b.inputs[1:] or not _pointwise(b, graph):
            continue
        wb, bias_a = graph.constants[b.inputs[1]], graph.constants[a.inputs[2]]
        groups, m, cg = int(b.attrs.get("group", 1)), wb.shape[0], wb.shape[1]
        if bias_a.dtype != wb.dtype or wb.dtype.name not in _FLOATS or bias_a.shape != (cg * groups,) or \
                m % groups:
            continue
        # W_B b per output channel: each group's weights times its slice of the bias
        moved = np.einsum("gmc,gc->gm", wb.astype(np.float64).reshape(groups, m // groups, cg),
                          bias_a.astype(np.float64).reshape(groups, cg)).reshape(m)
        old = graph.constants[b.inputs[2]].astype(np.float64) if len(b.inputs) > 2 and b.inputs[2] else 0.0
        new_b = _new_constant(graph, b.inputs[2] if len(b.inputs) > 2 and b.inputs[2] else f"{b.name}_bias",
                              (old + moved).astype(wb.dtype))
        b.inputs = [b.inputs[0], b.inputs[1], new_b]
        a.inputs = a.inputs[:2]
        count += 1
    return count


def simplify_inference(graph: Graph, ops=None) -> int:
    """The folds above, in the order that lets each feed the next; how many nodes they changed.

    ``ops``: the accelerator's op set (kernel names; None: all): a fold whose result needs an op the set
    lacks is skipped (a composed BatchNormalization has no host implementation to fall back on).
    """
    count = fold_affine(graph) if ops is None or "batch_normalization" in ops else 0
    count += fold_conv_batchnorm(graph)
    if ops is None or "add" in ops:
        count += fold_scale_into_conv(graph)
    count += fold_bias_forward(graph)
    if ops is None or "swish" in ops:
        count += fuse_swish(graph)
    if ops is None or "gelu" in ops:
        count += fuse_gelu(graph)
    return count


#: ops that copy their first input at inference whatever their attributes (Dropout: unless training)
_ALWAYS_NOOP = ("Dropout", "Identity")
#: ops that copy their first input when the output keeps its shape and dtype
_NOOP_IF_SAME = ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand")


def _is_noop(node: Node, graph: Graph, uses: dict) -> bool:
    if node.domain not in ONNX_DOMAINS or not node.inputs or not node.inputs[0] or not node.outputs:
        return False
    if any(o and uses.get(o) for o in node.outputs[1:]):  # Dropout's mask is read: keep it
        return False
    if node.op_type == "Dropout":
        training = node.inputs[2] if len(node.inputs) > 2 else ""
        return not (training and (training not in graph.constants or bool(np.any(graph.constants[training]))))
    if node.op_type in _ALWAYS_NOOP:
        return True
    x, y = graph.tensors.get(node.inputs[0]), graph.tensors.get(node.outputs[0])
    return node.op_type in _NOOP_IF_SAME and x is not None and y is not None and x == y


def remove_noops(graph: Graph) -> int:
    """Drop the no-ops of the module docstring; how many were dropped."""
    uses = _uses(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    dropped = 0
    for node in list(graph.nodes):
        if not _is_noop(node, graph, uses):
            continue
        x, y = node.inputs[0], node.outputs[0]
        if y in graph.outputs:  # the producer of x writes y instead
            src = producer.get(x)
            if src is None or x in graph.outputs or x in graph.inputs or x in graph.constants:
                continue
            src.outputs = [y if o == x else o for o in src.outputs]
            producer[y] = src
            old, new = x, y
        else:
            old, new = y, x
        graph.nodes.remove(node)
        for n in graph.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        uses = _uses(graph)
        dropped += 1
    return dropped
