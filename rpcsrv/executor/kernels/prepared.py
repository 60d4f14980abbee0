"""Weights prepared for a kernel (rearranged, repeated), cached per weight array.

Model weights are mostly constants bound at load that live as long as their executor, so a kernel can
keep a rearranged copy next to them instead of rebuilding it on every call.  Entries are keyed by the
weight array's identity and dropped with it (a weak reference), and by a tag the kernel chooses (the
geometry the preparation depends on); at most ``MAX_PER_ARRAY`` tags are kept per array, so the cache
cannot grow without bound.

Identity is not enough: a weight that is a subgraph *input* is a storage buffer that ``set_input``
overwrites in place between runs, and the bias is often a fresh view of the same constant on every
call.  So an entry keeps the bytes of the bias, and of weights that could change, it was built from,
and is used only while they are still the same.  Weights that cannot change (``immutable``: read-only
down to read-only memory, as the ExampleJSON runtime binds its constants) are trusted by identity, so
large ones (Winograd's, ``winograd.transformed_weights``) cost no comparison per call; a writeable
weight costs one copy and comparison of its bytes per call.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np

MAX_PER_ARRAY = 4

_cache: dict[int, tuple[weakref.ref, dict]] = {}
_lock = threading.Lock()


def prepared(w: np.ndarray, tag: Any, bias: Optional[np.ndarray], build: Callable[[], Any]) -> Any:
    """``build()``'s result for weights ``w``, ``tag`` and ``bias``: computed again only when ``w`` or
    ``bias`` changed values (or ``w`` is another array)."""
    hit = _cache.get(id(w))
    if hit is not None and hit[0]() is w:
        entry = hit[1].get(tag)
        if entry is not None and entry[0] == _weights_print(w) and entry[1] == _fingerprint(bias):
            return entry[2]
    value = build()
    try:
        ref = weakref.ref(w, lambda _r, key=id(w): _drop(key, _r))
    except TypeError:  # not weak-referenceable: not cached
        return value
    with _lock:
        hit = _cache.get(id(w))
        if hit is None or hit[0]() is not w:
            hit = (ref, {})
            _cache[id(w)] = hit
        if len(hit[1]) >= MAX_PER_ARRAY:
            hit[1].clear()
        hit[1][tag] = (_weights_print(w), _fingerprint(bias), value)
    return value


def _fingerprint(a: Optional[np.ndarray]):
    """What a preparation depends on: shape, dtype and the bytes themselves (equal bytes, equal values;
    comparing bytes objects is a memcmp, 5-10x cheaper than ``np.array_equal`` on these small arrays)."""
    return None if a is None else (a.shape, a.dtype.str, a.tobytes())


def _weights_print(w: np.ndarray):
    """The weights' fingerprint: nothing to compare for weights that cannot change (the entry is tied to
    the array itself), their bytes otherwise."""
    return "immutable" if immutable(w) else _fingerprint(w)


def immutable(a: Any) -> bool:
    """Whether no numpy array can change ``a``'s values: it and every array it is a view of are read-only,
    down to memory that is read-only itself (``bytes``, a read-only mapping) or an array owning its data."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        if a.base is None:
            return True
        a = a.base
    try:
        return memoryview(a).readonly
    except TypeError:
        return False


def _drop(key: int, ref: weakref.ref) -> None:
    """Forget a dead array's entry (unless its id already belongs to a newer array's entry).  No lock: a
    weakref callback may run inside ``prepared``'s locked block, when a garbage collection starts there."""
    hit = _cache.get(key)
    if hit is not None and hit[0] is ref:
        _cache.pop(key, None)


def entries(w: np.ndarray) -> int:
    """How many preparations are cached for ``w`` (for tests)."""
    hit = _cache.get(id(w))
    return len(hit[1]) if hit is not None and hit[0]() is w else 0


def forget(w: np.ndarray, tag: Any) -> None:
    """Drop ``w``'s preparation ``tag`` (a run plan that keeps its own form of it frees this one; built again
    if a kernel asks for it)."""
    with _lock:
        hit = _cache.get(id(w))
        if hit is not None and hit[0]() is w:
            hit[1].pop(tag, None)
