"""Weights prepared for a kernel (rearranged, repeated), cached per weight array.

Model weights are mostly constants bound at load that live as long as their executor, so a kernel can
keep a rearranged copy next to them instead of rebuilding it on every call.  Entries are keyed by the
weight array's identity and dropped with it (a weak reference), and by a tag the kernel chooses (the
geometry the preparation depends on); at most ``MAX_PER_ARRAY`` tags are kept per array, so the cache
cannot grow without bound.

Identity is not enough: a weight that is a subgraph *input* is a storage buffer that ``set_input``
overwrites in place between runs, and the bias is often a fresh view of the same constant on every
call.  So an entry keeps copies of the weights and bias it was built from and is used only while they
still hold the same values: one comparison pass over the weights per call.  That pays for small weights
turned into large prepared arrays (the depthwise weight vectors: ~5 KB of weights, ~300 KB prepared),
not for a preparation that is itself one pass over the weights.
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
        if entry is not None and _same(entry[0], w) and _same(entry[1], bias):
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
        hit[1][tag] = (np.array(w, copy=True), None if bias is None else np.array(bias, copy=True), value)
    return value


def _same(kept: Optional[np.ndarray], now: Optional[np.ndarray]) -> bool:
    if kept is None or now is None:
        return kept is now
    return kept.shape == now.shape and kept.dtype == now.dtype and np.array_equal(kept, now)


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
