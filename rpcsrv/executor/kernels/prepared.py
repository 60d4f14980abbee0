"""Weights prepared once for a kernel (rearranged, repeated, joined with their bias), cached per weight array.

Model weights are constants bound at load and live as long as their executor, so a kernel can keep a
rearranged copy next to them instead of rebuilding it on every call.  Entries are keyed by the weight
array's identity and dropped with it (a weak reference), and by a tag the kernel chooses (the geometry
the preparation depends on); at most ``MAX_PER_ARRAY`` tags are kept per array, so the cache cannot
grow without bound.  The bias, often a fresh view of the same constant on every call, is recognised
by value (a copy is kept).  Winograd keeps its own cache (``winograd.transformed_weights``).
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
    """``build()``'s result for weights ``w``, ``tag`` and ``bias``, computed once while ``w`` lives."""
    hit = _cache.get(id(w))
    if hit is not None and hit[0]() is w:
        entry = hit[1].get(tag)
        if entry is not None and (entry[0] is None if bias is None
                                  else entry[0] is not None and np.array_equal(entry[0], bias)):
            return entry[1]
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
        hit[1][tag] = (None if bias is None else np.array(bias, copy=True), value)
    return value


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
