"""The session's handles on what its worker process hosts: proxies of the worker's modules and functions, and
how values cross to and from the worker on the session's side.

:class:`WorkerModule` and :class:`WorkerFunction` are ``RuntimeModule``/callables like any other, so the server
hands them out unchanged; each names its :class:`~rpcsrv.native.proxy.Worker` (``.worker``, the backend they
belong to) and its object there (``.oid``).  Dropping a proxy frees the worker's object with the next request.
:class:`SessionValues` is the session's end of ``wire.Values``: the worker's objects come back as proxies, and the
server's own objects cannot cross.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from ..executor.module import RuntimeModule
from .library import NativeError
from .wire import Ref, Values


class SessionValues(Values):
    """The session's end of the link: the worker's objects as proxies; the server's own cannot cross."""

    def __init__(self, worker: Any):
        super().__init__({"session": worker.arena, "worker": worker.worker_arena})
        self.worker = worker

    def reference(self, obj: Any) -> Optional[Ref]:
        if isinstance(obj, (WorkerModule, WorkerFunction)):
            if obj.worker is not self.worker:
                raise NativeError("a module or function of another native worker cannot be passed here")
            return Ref(obj.kind, obj.oid, "")
        if isinstance(obj, RuntimeModule) or callable(obj):
            raise NativeError(f"{type(obj).__name__} objects of the server cannot be passed to native modules")
        return None

    def dereference(self, ref: Ref) -> Any:
        return (WorkerModule if ref.kind == "mod" else WorkerFunction)(self.worker, ref.id, ref.name)


class _Proxy:
    kind = ""

    def __init__(self, worker: Any, oid: int, name: str):
        self.worker, self.oid, self.name = worker, oid, name
        weakref.finalize(self, worker.forget, oid)


class WorkerFunction(_Proxy):
    """A function that lives in the worker; calling it is one request."""

    kind = "fn"

    @property
    def __name__(self) -> str:  # noqa: A003 - the server names handles after their function
        return self.name

    def __call__(self, *args: Any) -> Any:
        return self.worker.call_request(("call", Ref("fn", self.oid, "")), args, self.name)

    async def acall(self, *args: Any) -> tuple[bool, Any]:
        """The call from the event loop (``Worker.call_async``): ``(done, value)``."""
        return await self.worker.call_async(self.oid, self.name, *args)

    def time_evaluator(self, params: tuple, f_preproc: str) -> "WorkerFunction":
        """TVM's time evaluator for this function, run inside the worker (no IPC in the timings)."""
        return self.worker.time_evaluator(self, params, f_preproc)


class WorkerModule(_Proxy, RuntimeModule):
    """A module that lives in the worker (its imports stay there: lookups ask the worker)."""

    kind = "mod"

    def __init__(self, worker: Any, oid: int, type_key: str):
        RuntimeModule.__init__(self)
        _Proxy.__init__(self, worker, oid, type_key)
        self.type_key = type_key
        #: functions found, by (name, query_imports): a client that looks a function up before every
        #: call (``lib["f"](...)``) asks the worker once
        self._found: dict[tuple[str, bool], WorkerFunction] = {}

    def get_function(self, name: str) -> Optional[WorkerFunction]:
        return self.find_function(name, False)

    def find_function(self, name: str, query_imports: bool = True) -> Optional[WorkerFunction]:
        key = (name, bool(query_imports))
        fn = self._found.get(key)
        if fn is None or not self.worker.alive:
            result, _ = self.worker.request(("get", Ref("mod", self.oid, ""), name, key[1]), f"get_function {name}")
            fn = self.worker.values.decode(result, [])
            if fn is not None:
                self._found[key] = fn
        return fn

    def __repr__(self) -> str:
        return f"<WorkerModule {self.type_key!r} #{self.oid} in worker {self.worker.pid}>"
