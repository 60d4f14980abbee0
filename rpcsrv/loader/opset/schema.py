"""What an op declaration is: inputs, outputs, attributes (type, default, allowed values), dtype rules.

An :class:`OpSpec` says everything about an op of the ExampleJSON language that can be known
without data.  The compiler reads it to decide what it may offload and to refuse, when compiling,
what the board would refuse when running; the ExampleJSON parser reads it to check a library when
it is loaded; the kernel registry binds one numpy function to each spec and checks at import that
the function's signature agrees with it (same attribute names and defaults, same input counts).

Attribute values are JSON values (what an ExampleJSON ``attrs:`` object holds, and what the
compiler turns ONNX attributes into).  ``None`` stands for "not given" where the default is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: the default of a required attribute (one with no default)
REQUIRED = object()

#: attribute kinds: the JSON values each accepts
KINDS = ("int", "float", "str", "ints", "floats", "tensor", "dtype", "object", "op")


@dataclass(frozen=True)
class Attr:
    """One attribute: its kind, default (``REQUIRED`` if it has none) and the values the board takes.

    ``allowed`` lists the only values the board implements (None: any value of the kind); ``why``
    says in a few words why others are refused, for the error message.
    """

    kind: str
    default: Any = None
    allowed: tuple | None = None
    why: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _is_int(v) -> bool:
    return isinstance(v, int)  # JSON true/false are ints to Python, and kernels read them so


def _is_number(v) -> bool:
    return isinstance(v, (int, float))


def _is_numbers(v) -> bool:
    """A number, or a (nested) list of numbers; numpy arrays pass as they are."""
    if _is_number(v) or type(v).__name__ == "ndarray":
        return True
    return isinstance(v, (list, tuple)) and all(_is_numbers(x) for x in v)


_CHECKS = {
    "int": (_is_int, "an integer"),
    "float": (_is_number, "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "ints": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_int, v)), "a list of integers"),
    "floats": (lambda v: isinstance(v, (list, tuple)) and all(map(_is_number, v)), "a list of numbers"),
    "tensor": (_is_numbers, "a number or a (nested) list of numbers"),
    "dtype": (lambda v: isinstance(v, (int, str)), "an ONNX element type number or a dtype name"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "op": (lambda v: isinstance(v, str), "an op name"),
}


def attr_problem(name: str, attr: Attr, value) -> str:
    """Why ``value`` is not acceptable for attribute ``name``, or ``""``."""
    if value is None:
        return "" if attr.default is None else f"attribute {name} must not be null"
    ok, what = _CHECKS[attr.kind]
    if not ok(value):
        return f"attribute {name} must be {what}, got {value!r}"
    if attr.allowed is not None and value not in attr.allowed:
        shown = ", ".join(map(repr, attr.allowed))
        return (f"attribute {name}={value!r} is not supported"
                f"{f' ({attr.why})' if attr.why else ''}; the board takes {shown}")
    return ""


@dataclass(frozen=True)
class OpSpec:
    """One op of the ExampleJSON language (the snake_case of its ONNX op type).

    ``inputs``/``outputs``: names in ONNX order; a trailing ``?`` marks an optional one, a trailing
    ``+`` a variadic one (one or more; last only).  ``dtypes``: ``"float"`` (the first input must be
    a floating-point tensor), ``"same"`` (all tensor inputs share one dtype) or ``"same X Y"``
    (the named inputs do), ``""`` for no rule beyond the kernel's own checks.
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Attr] = field(default_factory=dict)
    dtypes: str = ""

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("+")

    @property
    def required_inputs(self) -> int:
        return sum(1 for i in self.inputs if not i.endswith("?"))

    @property
    def max_inputs(self) -> float:
        return float("inf") if self.variadic else len(self.inputs)

    @property
    def max_outputs(self) -> float:
        return float("inf") if self.outputs and self.outputs[-1].endswith("+") else len(self.outputs)

    @property
    def required_attrs(self) -> tuple[str, ...]:
        return tuple(k for k, a in self.attrs.items() if a.required)

    def input_name(self, k: int) -> str:
        names = self.inputs
        return (names[min(k, len(names) - 1)] if names else "?").rstrip("?+")

    def same_dtype_inputs(self) -> list[int] | None:
        """Input positions that must share a dtype (None: no such rule; [] : all of them)."""
        words = self.dtypes.split()
        if not words or words[0] != "same":
            return None
        names = [i.rstrip("?+") for i in self.inputs]
        return [names.index(w) for w in words[1:]]


def spec_problems(spec: OpSpec, attrs: Mapping[str, Any], ops: Mapping[str, OpSpec]) -> list[str]:
    """Everything wrong with ``attrs`` for ``spec``: unknown names, wrong kinds, refused values,
    missing required attributes, and a fused ``activation`` that is not a one-input op of ``ops``
    (its ``activation_attrs`` are checked against that op)."""
    problems = []
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        accepted = ", ".join(sorted(spec.attrs)) or "none"
        problems.append(f"does not implement attribute(s) {', '.join(unknown)} (it takes: {accepted})")
    for name, attr in spec.attrs.items():
        if name not in attrs:
            if attr.required:
                problems.append(f"attribute {name} is required")
            continue
        problem = attr_problem(name, attr, attrs[name])
        if problem:
            problems.append(problem)
    act = attrs.get("activation")
    if isinstance(act, str) and "activation" in spec.attrs:
        fused = ops.get(act)
        if fused is None or fused.required_inputs != 1 or fused.max_inputs < 1:
            problems.append(f"activation {act!r} is not a one-input op of the board")
        else:
            extra = attrs.get("activation_attrs") or {}
            if isinstance(extra, dict):
                problems += [f"activation {act}: {p}" for p in spec_problems(fused, extra, ops)]
    elif attrs.get("activation_attrs") is not None and act is None:
        problems.append("activation_attrs given without activation")
    return problems


def _float_dtype(dtype: str) -> bool:
    return dtype.startswith("float")


def dtype_problems(spec: OpSpec, dtypes: list[str | None]) -> list[str]:
    """What breaks the spec's dtype rule, for inputs of the given dtype names (None: absent)."""
    words = spec.dtypes.split()
    if not words:
        return []
    if words[0] == "float":
        if dtypes and dtypes[0] is not None and not _float_dtype(dtypes[0]):
            return [f"input {spec.input_name(0)} must be floating-point, got {dtypes[0]}"]
        return []
    which = spec.same_dtype_inputs()
    picked = [(k, d) for k, d in enumerate(dtypes) if d is not None and (not which or k in which)]
    if len({d for _, d in picked}) > 1:
        shown = ", ".join(f"{spec.input_name(k)} {d}" for k, d in picked)
        return [f"inputs must share one dtype, got {shown}"]
    return []
