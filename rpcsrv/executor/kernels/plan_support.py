"""What the run plans (``plans.py``, ``plans_ops.py``) share: the computed-input specs they are given, the
compiled kernels' parameter blocks and data addresses, and the "still in use" check of their library."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

import numpy as np

from .clib import compiled

F32 = np.dtype(np.float32)
_addressof, _char_view = ctypes.addressof, ctypes.c_char.from_buffer


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
    """Whether ``lib`` is still the compiled library in use: a dict lookup per call (``compiled.library()``
    re-reads the environment, 1 us; turning the kernels off by the environment takes effect for plans made
    after it, and at once with ``compiled.reset()``)."""
    state = compiled._state
    return lambda: state.get("lib") is lib


def computed(spec: Any) -> Optional[tuple[tuple, np.dtype]]:
    """(shape, dtype) of a computed input, or None (a constant or an omitted input)."""
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec, np.ndarray):
        return tuple(spec[0]), np.dtype(spec[1])
    return None
