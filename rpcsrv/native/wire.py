"""The messages between a session and its native worker (both sides of ``proxy.py``/``worker.py``).

One request at a time over a Unix socket pair, each a pickled tuple (the server loads the worker's
messages with a restricted unpickler, ``confine_wire.py``: native code in the worker can forge them),
sent as ``(budget, request)``: ``budget`` is the session's
room for what the worker allocates (``budget.Budget``, None for no limit).  Requests: ``("load",
path)``, ``("get", obj, name, query_imports)``, ``("call", obj, args)``, ``("global", name, args)``
(executor creation over a worker's module), ``("timer", obj, params, f_preproc)``, ``("free",
ids)``, ``("stats",)``, ``("attach", capacity)`` (with the session arena's descriptor).  Answers:
``("ok", value, outs, held)``, ``("err", message, None, held)`` or ``("budget", (what, nbytes,
name, used, limit), None, held)`` (an allocation refused before it was made); ``held`` is what the
worker holds for the session after the request, in bytes.  While a request runs, the worker may ask
for a compute slot, ``("slot",)`` (answered ``("slot", threads)``), and give it back, ``("slot-done",)``.

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
