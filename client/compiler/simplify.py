"""Inference simplifications on the graph IR, before partitioning (TVM's ``SimplifyInference`` +
``FoldScaleAxis`` + ``FoldConstant`` for the one pattern that matters in CNNs).

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
"""

from __future__ import annotations

import numpy as np

from .onnx_import import ONNX_DOMAINS, Graph, Node, TensorInfo

_FLOATS = ("float16", "float32", "float64")


def _uses(graph: Graph) -> dict[str, int]:
    uses: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                uses[i] = uses.get(i, 0) + 1
    for o in graph.outputs:
        uses[o] = uses.get(o, 0) + 1
    return uses


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
