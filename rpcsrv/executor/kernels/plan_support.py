"""What the run plans of every family (``plans.py`` dispatches to them) share: the "not plannable" signal and
the reading of attribute values, the computed-input specs they are given, the compiled kernels' parameter
blocks and data addresses, the "still in use" check of their library, and the plan of a one-call C kernel.

The planners' contract (``plans.plan`` relies on it): a planner returns a planned function, or None, or raises
:class:`NotPlannable`, for a step it does not take; it reads the node's attribute values inside
:func:`attribute_values`, where a value the table kernel would refuse at the run is not plannable.  Anything
else a planner raises is a bug in it.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .clib import compiled

F32 = np.dtype(np.float32)
_addressof, _char_view = ctypes.addressof, ctypes.c_char.from_buffer
#: what reading a node's attribute values raises when the table kernel would refuse them at the run: its
#: ``registry.bad`` ValueError, ``int()`` of a string, a list where a number belongs (or the reverse, or one the
#: conv geometry's cache cannot hash), ``.get`` of activation attributes that are no mapping, a group of 0
ATTRIBUTE_ERRORS = (ValueError, TypeError, AttributeError, OverflowError, ZeroDivisionError)


class NotPlannable(Exception):
    """A step no plan takes (its attributes, shapes or dtypes): the table kernel runs it, and reports a bad
    attribute at the run."""


@contextlib.contextmanager
def attribute_values() -> Iterator[None]:
    """The block of a planner that reads a node's attribute values: :data:`ATTRIBUTE_ERRORS` raised in it are
    :class:`NotPlannable` (nothing but the reading belongs in it: an error of the plan's own making is a bug)."""
    try:
        yield
    except ATTRIBUTE_ERRORS as exc:
        raise NotPlannable(f"attribute values the table kernel reports: {exc}") from exc


def address(a: np.ndarray) -> int:
    """The address of a C-contiguous array's data: through ctypes' buffer view, 0.3 us against 1.1 us for
    ``a.ctypes.data`` (read-only or empty arrays, which the view refuses, take the slower way)."""
    try:
        return _addressof(_char_view(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def block(kind, values) -> tuple[Any, int]:
    """A parameter block of a compiled kernel (``*_block`` in the C files): the ctypes array (kept alive
    by the plan) and its address."""
    arr = (kind * len(values))(*values)
    return arr, ctypes.addressof(arr)


def in_use(lib) -> Callable[[], bool]:
    """Whether ``lib`` is still valid for the plan: a dict lookup per call (``compiled.library()`` re-reads the
    environment, 1 us; turning the kernels off by the environment takes effect for plans made after it, and
    at once with ``compiled.reset()``).  A library a background build installs later (``compiled.install``)
    leaves it valid: both stay loaded, and the plan's packed data are its own library's."""
    state = compiled._state
    epoch = state.get("epoch")
    return lambda: epoch is not None and state.get("epoch") is epoch


def computed(spec: Any) -> Optional[tuple[tuple, np.dtype]]:
    """(shape, dtype) of a computed input, or None (a constant or an omitted input)."""
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec, np.ndarray):
        return tuple(spec[0]), np.dtype(spec[1])
    return None


def one_pass(name, kernel, attrs, xshape, shape, lib, c_name, *args):
    """The planned function of a float32 op of one computed input of ``xshape`` whose compiled kernel
    ``lib.<c_name>`` writes a new array of ``shape`` in one call, ``(x, y, *args)`` (GlobalAveragePool,
    Softmax, Sigmoid, Gelu, HardSigmoid): any other input, or a library no longer in use, runs the table
    ``kernel``."""
    fn, ready = getattr(lib, c_name), in_use(lib)

    def planned(x):
        if type(x) is not np.ndarray or x.shape != xshape or x.dtype != F32 or not x.flags.c_contiguous \
                or not ready():
            return kernel(x, **attrs)
        y = np.empty(shape, F32)
        fn(address(x), address(y), *args)
        return y

    planned.__name__ = planned.__qualname__ = name
    return planned
