"""The messages between a session and its native worker (both sides of ``proxy.py``/``worker.py``).

One request at a time over a Unix socket pair, each a pickled tuple (both ends are rpcsrv itself,
never a client, so pickle is safe here).  Requests: ``("load", path)``, ``("get", obj, name,
query_imports)``, ``("call", obj, args)``, ``("global", name, args)`` (executor creation over a
worker's module), ``("timer", obj, params, f_preproc)``, ``("free", ids)``,
``("stats",)``.  Answers: ``("ok", value, outs)`` or ``("err", message)``.

Values cross as themselves (ints, floats, str, bytes, Device, DataType, None), except:

* arrays: ``Shared(region, offset, dtype, shape, strides)`` when they live in a region both sides
  map (``shm.py``), so only the handle crosses; otherwise ``Copied(array)``, and the worker sends
  back every copied argument after the call (``outs``) so that writes reach the caller's memory;
* modules and functions of the worker: ``Ref(kind, id, name)``, turned into proxies on the session side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ref:
    kind: str  # "mod" or "fn"
    id: int
    name: str  # type key of a module, name of a function


@dataclass(frozen=True)
class Shared:
    region: str  # "session" (the session's arena) or "worker" (the worker's)
    offset: int
    dtype: str
    shape: tuple
    strides: tuple


@dataclass
class Copied:
    array: Any
