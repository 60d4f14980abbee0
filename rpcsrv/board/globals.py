"""Global functions a client can fetch with kGetGlobalFunc, bound to its session.

The names are TVM's (``python/tvm/rpc/server.py``, ``src/runtime/rpc/rpc_server_env.cc``,
``src/runtime/rpc/rpc_module.cc``).  Each entry builds the session's own function object, so file
functions are confined to that session's workspace and modules land in that session's handle table.
Unknown names answer a null handle, as TVM does (the client then raises its own "not found").

What works on modules goes to the backend the module belongs to (``rpcsrv.native.backend``: this process or
the session's worker, ``Session.native.backend_of``): looking a function up, timing it, and the global
functions over modules (the graph executor's ``create``), which are registered once, in the backends'
table (``backend.GLOBALS``), and handed out here by name.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Optional

from ..executor.module import RuntimeModule
from ..native.backend import GLOBALS
from ..protocol import Device, FunctionHandle
from .session import PackedFunction, RPCUserError, Session

GlobalFactory = Callable[[Session], PackedFunction]


class Registry:
    """name → factory(session) → PackedFunction."""

    def __init__(self):
        self._entries: dict[str, GlobalFactory] = {}

    def register(self, name: str, blocking: bool = False, stream: Optional[Callable[..., Any]] = None):
        """Register ``fn(session, *args)`` as global ``name``; ``stream(session, *args, nbytes)``
        optionally takes its trailing bytes argument piece by piece (see ``PackedFunction``)."""
        def deco(fn: Callable[..., Any]):
            def make(sess: Session) -> PackedFunction:
                sink = (lambda *a: stream(sess, *a)) if stream else None
                return PackedFunction(partial(fn, sess), name, blocking, sink)
            self._entries[name] = make
            return fn
        return deco

    def get(self, name: str, session: Session) -> Optional[PackedFunction]:
        factory = self._entries.get(name)
        return factory(session) if factory else None

    def names(self) -> list[str]:
        return sorted(self._entries)


REGISTRY = Registry()
reg = REGISTRY.register


@reg("tvm.rpc.server.workpath")
def _workpath(sess: Session, path: str) -> str:
    return str(sess.workspace.path(path))


def _upload_stream(sess: Session, path: str, nbytes: int):
    """A large upload goes straight to its file, piece by piece (the workspace checks the path)."""
    return sess.workspace.open_write(path, nbytes)


@reg("tvm.rpc.server.upload", blocking=True, stream=_upload_stream)
def _upload(sess: Session, path: str, data) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RPCUserError(f"upload expects bytes, got {type(data).__name__}")
    sess.workspace.write(path, data)


@reg("tvm.rpc.server.download", blocking=True)
def _download(sess: Session, path: str) -> bytes:
    return sess.workspace.read(path)


@reg("tvm.rpc.server.remove", blocking=True)
def _remove(sess: Session, path: str) -> None:
    sess.workspace.remove(path)


@reg("tvm.rpc.server.listdir", blocking=True)
def _listdir(sess: Session, path: str = ".") -> str:
    return ",".join(sess.workspace.listdir(path))


@reg("tvm.rpc.server.load_module", blocking=True)
def _load_module(sess: Session, path: str) -> RuntimeModule:
    target = sess.workspace.path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r} in the session workspace (upload it first)")
    return sess.native.load(str(target))  # the board's native-code policy (rpcsrv.native.host)


@reg("tvm.rpc.server.ModuleGetFunction")
def _module_get_function(sess: Session, mod, name: str, query_imports=False):
    if not isinstance(mod, RuntimeModule):
        raise RPCUserError(f"ModuleGetFunction expects a module, got {type(mod).__name__}")
    backend = sess.native.backend_of(mod)
    fn = backend.get_function(mod, name, bool(query_imports))
    if fn is None:
        return None
    known = sess.module_functions.get(id(fn))
    func = known[1]() if known is not None else None
    if func is not None and func.fn is fn:  # the same function again: the same handle, counted
        sess.handles.reissue(known[0], func, f"get_function {name}")
        return FunctionHandle(known[0])
    func = PackedFunction(fn, name, blocking=True, run=backend.runner(fn, sess.limiter), backend=backend)
    handle = sess.put_object(func)
    if len(sess.module_functions) >= MODULE_FUNCTIONS:
        sess.module_functions.clear()
    sess.module_functions[id(fn)] = (handle, weakref.ref(func))  # while something holds it (its handle,
    return FunctionHandle(handle)  # a baton's record): the module goes when the client frees it


#: module functions a session remembers the handles of (``_module_get_function``)
MODULE_FUNCTIONS = 1024


@reg("tvm.rpc.server.ImportModule")
def _import_module(sess: Session, parent, child) -> None:
    if not isinstance(parent, RuntimeModule) or not isinstance(child, RuntimeModule):
        raise RPCUserError("ImportModule expects two modules")
    parent.imports.append(child)


def _module_global(name: str):
    """The backends' global function ``name``, run by the backend of its module argument."""
    def run(sess: Session, *args) -> Any:
        module = next((a for a in args if isinstance(a, RuntimeModule)), None)
        return sess.native.backend_of(module).call_global(name, list(args))
    return run


for _name in GLOBALS:
    reg(_name, blocking=True)(_module_global(_name))


@reg("runtime.RPCTimeEvaluator")
def _time_evaluator(sess: Session, mod, name: str, device_type: int, device_id: int, number: int,
                    repeat: int, min_repeat_ms: int, limit_zero_time_iterations: int = 100,
                    cooldown_interval_ms: int = 0, repeats_to_cooldown: int = 1,
                    cache_flush_bytes: int = 0, f_preproc: str = "") -> PackedFunction:
    """TVM's time evaluator: returns a function whose result is ``repeat`` float64 seconds-per-call.

    The loop is ``rpcsrv.native.measure.time_evaluator``, run by the backend of the function (in a native
    worker for its functions, so the timings hold no IPC); ``f_preproc`` names one of ``measure.PREPROC``."""
    if mod is None:
        target = sess.registry.get(name, sess)
        fn = target.fn if target else None
    elif isinstance(mod, RuntimeModule):
        fn = mod.find_function(name, False)
    else:
        raise RPCUserError("time_evaluator expects a module")
    if fn is None:
        raise RPCUserError(f"Cannot find function {name!r} to time")
    Device(device_type, device_id)  # validated by the caller's device use
    params = (number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
              repeats_to_cooldown, cache_flush_bytes)
    try:
        evaluate = sess.native.backend_of(fn).time_evaluator(fn, params, f_preproc)
    except ValueError as exc:
        raise RPCUserError(str(exc)) from None
    return PackedFunction(evaluate, f"time_evaluator({name})", blocking=True)


@reg("cache_flush_cpu_non_first_arg", blocking=True)
def _cache_flush(sess: Session, *args) -> None:
    from ..native.measure import cache_flush_cpu_non_first_arg

    cache_flush_cpu_non_first_arg(*args)


@reg("tvm.contrib.random.random_fill_for_measure", blocking=True)
def _random_fill_for_measure(sess: Session, arr) -> None:
    """What MetaSchedule's runner fills its arguments with (TVM's random engine: uniform [1, 10))."""
    from ..native.measure import random_fill_for_measure

    random_fill_for_measure(arr)


@reg("rpcsrv.session_stats")
def _session_stats(sess: Session) -> str:
    """What this session holds: ``objects=N,buffers=N,bytes=N`` (for leak checks)."""
    return f"objects={len(sess.objects)},buffers={len(sess.buffers)},bytes={sess.memory_used}"
