"""The ExampleJSON op language as data: which ops exist, their inputs, outputs, attributes, dtype rules.

Part of the library format (an ExampleJSON subgraph names these ops), so it lives with the loader
where both sides may read it: the board's kernel registry binds one numpy kernel to each op
(``rpcsrv.executor.kernels.registry``), the ExampleJSON parser checks a library's ops when it is
loaded, and the client's compiler decides what it may offload and refuses, at compile time, the
attribute values the board would refuse at run time.

* ``OPS``: op name -> :class:`OpSpec` (declarations in ``ops.py``, the schema in ``schema.py``);
* :func:`onnx_op_to_kernel`: the ONNX op type's name in the language (``MatMul`` -> ``matmul``);
* :func:`node_problems`: everything wrong with one use of an op that is known before data arrives.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from .ops import OPS
from .schema import REQUIRED, Attr, OpSpec, attr_problem, dtype_problems, spec_problems

__all__ = ["OPS", "REQUIRED", "Attr", "OpSpec", "attr_problem", "dtype_problems", "node_problems",
           "onnx_op_to_kernel"]

# ONNX types whose plain snake_case reads badly; everything else follows the regex rule.
_NAME_EXCEPTIONS = {"PRelu": "prelu", "IsNaN": "is_nan", "IsInf": "is_inf"}
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def onnx_op_to_kernel(op_type: str) -> str:
    """The op name for an ONNX op type: snake_case, with ``MatMul`` read as one word.

    ``BatchNormalization`` -> ``batch_normalization``, ``MatMul`` -> ``matmul``,
    ``ReduceLogSumExp`` -> ``reduce_log_sum_exp``, ``LRN`` -> ``lrn``, ``PRelu`` -> ``prelu``.
    """
    if op_type in _NAME_EXCEPTIONS:
        return _NAME_EXCEPTIONS[op_type]
    return _CAMEL_RE.sub("_", op_type.replace("MatMul", "Matmul")).lower()


def node_problems(name: str, attrs: Mapping[str, Any], inputs: Sequence[bool] | None = None,
                  dtypes: Sequence[str | None] | None = None) -> list[str]:
    """What is wrong with a use of op ``name`` (empty list: nothing known now).

    ``attrs``: the attributes given; ``inputs``: for each input position, whether the input is
    present (absent optional inputs are ``False``); ``dtypes``: the inputs' dtype names (``None``
    for absent ones), for the op's dtype rule.  Each problem is one phrase, without the op name.
    """
    spec = OPS.get(name)
    if spec is None:
        return [f"no op {name!r} in the ExampleJSON language"]
    problems = []
    if inputs is not None:
        problems += _arity_problems(spec, list(inputs))
    problems += spec_problems(spec, attrs, OPS)
    if dtypes is not None:
        problems += dtype_problems(spec, list(dtypes))
    return problems


def _arity_problems(spec: OpSpec, present: list[bool]) -> list[str]:
    while present and not present[-1]:
        present.pop()  # trailing absent inputs are the same as none
    required, most = spec.required_inputs, spec.max_inputs
    absent = [k for k in range(min(required, len(present))) if not present[k]]
    if len(present) < required or len(present) > most or absent:
        upto = "" if most == required else " and up to " + ("any number" if most == float("inf") else
                                                             f"{most}") + " in all"
        got = f"required input(s) {absent} absent" if absent else f"{len(present)}"
        return [f"takes {required} required input(s){upto}, got {got}"]
    return []
