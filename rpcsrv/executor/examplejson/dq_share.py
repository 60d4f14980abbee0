"""One DynamicQuantizeLinear for the dynamic MatMuls that read the same tensor (a transformer's Q, K and V).

``quantize_dynamic`` quantizes an activation once for every MatMul that reads it (one DynamicQuantizeLinear),
and onnxruntime runs it once; the fold (``qdq_fold.fold_dynamic``) makes each MatMul one
``dynamic_quantize_matmul`` that quantizes its own input.  After planning, the planned steps of that op that read
the same node (or Reshapes of it) share what the first of them made: each step's plan (the ``sharing`` of
``plans_qops.dynamic_matmul_plan``) reads the quantized rows and their scale and zero point from a holder when they
were made from the very array it was given (or one over the same memory), else makes them; the first step of the
group starts from an empty holder and the last one empties it, so nothing outlives the call or is read from
another.  Quantization is a function of the values alone, so the results are the ones each step would make.  A
holder is one tuple per group, replaced whole: steps of one subgraph called from two threads at once each find the
other's array there and quantize their own.
"""

from __future__ import annotations


def share_quantization(steps: list) -> list:
    """``steps`` with the planned ``dynamic_quantize_matmul`` steps that read one node (or Reshapes of one node to
    one shape) sharing its quantization."""
    from .qdq_fold import RESHAPES

    source = {node.id: node.inputs[0] for node, *_ in steps if node.op in RESHAPES and node.inputs}
    groups: dict[tuple, list[int]] = {}
    for k, (node, kernel, *_rest) in enumerate(steps):
        if node.op == "dynamic_quantize_matmul" and hasattr(kernel, "sharing") and node.inputs:
            root = node.inputs[0]
            while root in source:
                root = source[root]
            groups.setdefault((root, node.shape[:-1]), []).append(k)
    out = list(steps)
    for members in groups.values():
        if len(members) < 2:
            continue
        holder: list = [None]
        for k in members:
            node, kernel, *rest = steps[k]
            out[k] = (node, kernel.sharing(holder, k == members[0], k == members[-1]), *rest)
    return out
