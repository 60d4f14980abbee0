"""The kernel registry: op name -> numpy function, each bound to its entry in the op catalogue.

A kernel is ``kernel(*inputs, **attrs)``: tensor inputs positionally in ONNX order (``None`` for an
absent optional input), attributes by their ONNX names as JSON-decoded Python values.  It returns one
``np.ndarray`` or, for multi-output ops, a tuple of them.  Kernels are pure: they never write into
their inputs and keep no state between calls (they may return views).

``register`` binds a kernel to its declaration in ``rpcsrv.loader.opset`` (the op catalogue the
compiler reads too) and checks attribute names once per call against it, so a misspelled or
unsupported attribute is a ``ValueError`` naming the op and the attribute, instead of being
silently ignored or surfacing as a confusing ``TypeError`` deep inside numpy.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

import numpy as np

from ...loader.opset import OPS, REQUIRED, OpSpec
from .clib import compiled

Kernel = Callable[..., Any]

KERNELS: dict[str, Kernel] = {}


def _signature_problems(fn: Kernel, spec: OpSpec) -> list[str]:
    """Where ``fn``'s signature disagrees with its catalogue entry (inputs, attribute names, defaults)."""
    params = list(inspect.signature(fn).parameters.values())
    problems = []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        problems.append("takes **kwargs (attributes must be keyword-only parameters)")
    keyword = {p.name: p for p in params if p.kind is p.KEYWORD_ONLY}
    if set(keyword) != set(spec.attrs):
        problems.append(f"attributes {sorted(keyword)} but the catalogue declares {sorted(spec.attrs)}")
    for name, p in keyword.items():
        declared = spec.attrs.get(name)
        if declared is None:
            continue
        default = REQUIRED if p.default is p.empty else p.default
        if default is not declared.default and default != declared.default:
            problems.append(f"attribute {name} defaults to {default!r}, the catalogue says {declared.default!r}")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = sum(1 for p in positional if p.default is p.empty)
    named = len(spec.inputs) - spec.variadic
    if variadic != spec.variadic or len(positional) != named or \
            (not variadic and required != spec.required_inputs):
        problems.append(f"inputs {[p.name for p in positional]}{' + *args' if variadic else ''} do not "
                        f"match the catalogue's {list(spec.inputs)}")
    return problems


def register(name: str) -> Callable[[Kernel], Kernel]:
    """Decorator: bind ``fn`` to the catalogue entry ``name`` and put it into ``KERNELS``.

    The entry (``rpcsrv.loader.opset.OPS``) is the truth about the op: the kernel's keyword-only
    parameters must be exactly its attributes, with the same defaults, and its positional
    parameters its inputs; any disagreement, a name without an entry, or a name registered twice
    is an error at import.  Each call checks attribute names and input counts (cheap); attribute
    values are checked when an ExampleJSON text is parsed and when compiling, not per call.
    """

    def decorate(fn: Kernel) -> Kernel:
        if name in KERNELS:
            raise ValueError(f"kernel {name!r} registered twice")
        spec = OPS.get(name)
        if spec is None:
            raise ValueError(f"kernel {name!r} has no entry in the op catalogue (rpcsrv.loader.opset)")
        problems = _signature_problems(fn, spec)
        if problems:
            raise ValueError(f"kernel {name!r} disagrees with its catalogue entry: {'; '.join(problems)}")
        allowed = frozenset(spec.attrs)
        required, most = spec.required_inputs, spec.max_inputs

        @functools.wraps(fn)
        def kernel(*inputs, **attrs):
            if attrs and not allowed.issuperset(attrs):
                unknown = sorted(set(attrs) - allowed)
                raise ValueError(f"op {name!r}: unsupported attribute(s) {', '.join(unknown)} "
                                 f"(accepted: {', '.join(sorted(allowed)) or 'none'})")
            if not required <= len(inputs) <= most or _absent(inputs, required):
                absent = [i for i, x in enumerate(inputs[:required]) if x is None]
                raise ValueError(f"op {name!r}: takes {required} required input(s)"
                                 f"{'' if most == required else f' and up to {most} in all'}, got "
                                 + (f"required input(s) {absent} absent" if absent else f"{len(inputs)}"))
            result = fn(*inputs, **attrs)
            # numpy reductions hand back scalars for 0-d results; callers always get arrays
            return np.asarray(result) if isinstance(result, np.generic) else result

        kernel.spec = spec
        KERNELS[name] = kernel
        return kernel

    return decorate


def check_complete() -> None:
    """Every catalogue entry has a kernel (called once all kernel modules are imported)."""
    missing = sorted(set(OPS) - set(KERNELS))
    if missing:
        raise ImportError(f"op catalogue entries without a kernel: {', '.join(missing)}")


def _absent(inputs: tuple, required: int) -> bool:
    """Whether one of the first ``required`` inputs is None (a loop: cheaper than any() here)."""
    for k in range(required):
        if inputs[k] is None:
            return True
    return False


def bad(op: str, message: str) -> ValueError:
    """A ValueError whose message starts with the op name (``raise bad("conv", "...")``)."""
    return ValueError(f"op {op!r}: {message}")


def ints(value, op: str = "", what: str = "") -> list[int]:
    """A list of Python ints from an attribute list or a 1-D integer tensor input."""
    if value is None:
        return []
    arr = np.asarray(value)
    if arr.dtype.kind not in "iub" and arr.size:
        raise bad(op, f"{what} must be integers, got {arr.dtype}")
    return [int(v) for v in arr.reshape(-1).tolist()]  # tolist: no numpy scalar per element


def norm_axis(axis: int, rank: int, op: str) -> int:
    """An ONNX axis (negative counts from the end) as a non-negative int, range-checked."""
    if not -rank <= axis < max(rank, 1):
        raise bad(op, f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def apply_activation(y: np.ndarray, activation, activation_attrs, op: str) -> np.ndarray:
    """Apply a fused unary op (``"activation": "relu"`` etc.) from the table to a kernel's result.

    ``y`` must be a buffer the calling kernel just allocated (never an input or a view of one):
    relu, the common case, is applied in place.
    """
    if activation is None:
        if activation_attrs:
            raise bad(op, "activation_attrs given without activation")
        return y
    fn = KERNELS.get(activation) if isinstance(activation, str) else None
    if fn is None:
        raise bad(op, f"unknown fused activation {activation!r}")
    if activation_attrs is not None and not isinstance(activation_attrs, dict):
        raise bad(op, "activation_attrs must be a JSON object")
    if activation == "relu" and not activation_attrs:
        return relu(y, out=y)
    if y.dtype.kind == "f" and y.flags.writeable:  # ReLU6, HardSwish, SiLU (mobile networks) in place too
        if activation == "clip" and activation_attrs and set(activation_attrs) <= {"min", "max"}:
            return np.clip(y, activation_attrs.get("min"), activation_attrs.get("max"), out=y)
        if activation == "swish" and not activation_attrs:  # SiLU (EfficientNet), compiled, in place
            done = compiled.sigmoid(y, times_x=True, out=y)
            if done is not None:
                return done
        if activation == "hard_swish" and not activation_attrs:
            gate = y * y.dtype.type(1 / 6)
            gate += y.dtype.type(0.5)
            np.clip(gate, 0, 1, out=gate)
            return np.multiply(y, gate, out=y)
    return fn(y, **(activation_attrs or {}))


_ZEROS: dict[np.dtype, np.ndarray] = {}


def zeros(shape, dtype) -> np.ndarray:
    """A read-only all-zero array of ``shape``: a view of one shared block per dtype, grown as needed.

    numpy's ``maximum`` against a broadcast scalar runs a slow loop: ``np.maximum(y, 0)`` measured
    4-5x slower than ``np.maximum(y, zeros)`` with an array of y's shape (numpy 2.4, 100k float32:
    31 us against 6 us).  The block is never written, so sharing it between calls and threads
    keeps kernels pure.
    """
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    block = _ZEROS.get(dtype)
    if block is None or block.size < size:
        block = np.zeros(max(size, 1 << 14), dtype)
        block.flags.writeable = False
        _ZEROS[dtype] = block
    return block[:size].reshape(shape)


def relu(x: np.ndarray, out=None) -> np.ndarray:
    """max(x, 0) elementwise (NaN stays NaN), through :func:`zeros` for speed."""
    return np.maximum(x, zeros(x.shape, x.dtype), out=out)
