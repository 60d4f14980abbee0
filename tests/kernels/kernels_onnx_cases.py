"""Run ONNX's backend node conformance cases (shipped in the ``onnx`` wheel) through the kernel table.

``collect_testcases`` executes ONNX's reference implementation for every case, which takes ~10 s, so
the cases are collected once per test session and cached here.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from rpcsrv.executor.kernels import KERNELS, onnx_op_to_kernel
from rpcsrv.executor.kernels.onnx_dtypes import ONNX_DTYPES

NUMPY_TYPES = set(ONNX_DTYPES.values())


@functools.lru_cache(maxsize=1)
def _all_cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(collect_testcases(None), key=lambda c: c.name)


def _ours(node) -> bool:
    return node.domain in ("", "ai.onnx") and onnx_op_to_kernel(node.op_type) in KERNELS


def single_node_cases() -> list:
    """All conformance cases whose graph is one node of an op in our table."""
    return [c for c in _all_cases() if len(c.model.graph.node) == 1 and _ours(c.model.graph.node[0])]


def graph_cases() -> list:
    """Multi-node cases (mostly ONNX functions "expanded" into primitive ops) made only of our ops."""
    return [c for c in _all_cases() if len(c.model.graph.node) > 1 and all(map(_ours, c.model.graph.node))]


def attribute_value(attr):
    """An ONNX attribute as the JSON-ish Python value the runtime would hand a kernel."""
    from onnx import helper, numpy_helper

    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    if hasattr(value, "data_type"):  # a TensorProto (ConstantOfShape's value)
        return numpy_helper.to_array(value)
    return value


def numpy_lacks_types(case) -> bool:
    """Whether any input or expected output of ``case`` has an element type numpy does not have."""
    for inputs, outputs in case.data_sets:
        for value in list(inputs) + list(outputs):
            if as_array(value).dtype not in NUMPY_TYPES:
                return True
    return False


def as_array(value) -> np.ndarray:
    """Data-set values are arrays, or TensorProtos for types numpy lacks (bfloat16, float8, int4)."""
    if hasattr(value, "data_type"):
        from onnx import numpy_helper

        return numpy_helper.to_array(value)
    return np.asarray(value)


def run_node(node, env: dict) -> None:
    """Run one ONNX node through the kernel table, reading and writing tensors in ``env`` by name."""
    kernel = KERNELS[onnx_op_to_kernel(node.op_type)]
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    args = [env[name] if name else None for name in node.input]
    while args and args[-1] is None:
        args.pop()
    if node.op_type == "Split" and "split" not in attrs and "num_outputs" not in attrs and len(args) < 2:
        attrs["num_outputs"] = len(node.output)  # ONNX infers it from the outputs; the compiler passes it
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        attrs["return_indices"] = 1  # as the compiler does when Indices is used
    before = [None if a is None else a.copy() for a in args]
    result = kernel(*args, **attrs)
    for a, b in zip(args, before):  # kernels are pure: inputs come back untouched
        if a is not None and not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            raise AssertionError(f"{node.op_type} wrote into one of its inputs")
    results = result if isinstance(result, tuple) else (result,)
    wanted = [name for name in node.output if name]
    if len(results) < len(wanted):
        raise AssertionError(f"{node.op_type} gave {len(results)} outputs, the node has {len(wanted)}")
    for name, value in zip(node.output, results):
        if name:
            env[name] = np.asarray(value)


def run_case(case) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run every data set of ``case``; returns (got, expected) pairs for each graph output of each set."""
    graph = case.model.graph
    pairs = []
    for inputs, expected in case.data_sets:
        env = {vi.name: as_array(v) for vi, v in zip(graph.input, inputs)}
        for node in graph.node:
            run_node(node, env)
        pairs.extend((env[vi.name], as_array(want)) for vi, want in zip(graph.output, expected))
    return pairs
