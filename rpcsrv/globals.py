"""Global functions a client can fetch with kGetGlobalFunc, bound to its session.

The names are TVM's (``python/tvm/rpc/server.py``, ``src/runtime/rpc/rpc_server_env.cc``,
``src/runtime/rpc/rpc_module.cc``).  Each entry builds the session's own function object, so file
functions are confined to that session's workspace and modules land in that session's handle table.
Unknown names answer a null handle, as TVM does (the client then raises its own "not found").
"""

from __future__ import annotations

import struct
import time
from typing import Any, Callable, Optional

from .executor.runtime import RuntimeModule
from .protocol import Device
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
                return PackedFunction(lambda *a: fn(sess, *a), name, blocking, sink)
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
    from .executor import load_module  # imported lazily: the executor pulls in numpy kernels

    target = sess.workspace.path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r} in the session workspace (upload it first)")
    return load_module(str(target))


@reg("tvm.rpc.server.ModuleGetFunction")
def _module_get_function(sess: Session, mod, name: str, query_imports=False):
    if not isinstance(mod, RuntimeModule):
        raise RPCUserError(f"ModuleGetFunction expects a module, got {type(mod).__name__}")
    fn = mod.find_function(name, bool(query_imports))
    return None if fn is None else PackedFunction(fn, name, blocking=True)


@reg("tvm.rpc.server.ImportModule")
def _import_module(sess: Session, parent, child) -> None:
    if not isinstance(parent, RuntimeModule) or not isinstance(child, RuntimeModule):
        raise RPCUserError("ImportModule expects two modules")
    parent.imports.append(child)


def _create_executor(debug: bool):
    def create(sess: Session, *args) -> RuntimeModule:
        from .executor import debug as debug_executor, graph  # lazily: numpy kernels

        return (debug_executor.create_graph_executor_debug if debug else graph.create_graph_executor)(*args)
    return create


for _name, _debug in (("tvm.graph_executor.create", False), ("tvm.graph_runtime.create", False),
                      ("tvm.graph_executor_debug.create", True), ("tvm.graph_runtime_debug.create", True)):
    reg(_name, blocking=True)(_create_executor(_debug))


@reg("runtime.RPCTimeEvaluator")
def _time_evaluator(sess: Session, mod, name: str, device_type: int, device_id: int, number: int,
                    repeat: int, min_repeat_ms: int, limit_zero_time_iterations: int = 100,
                    cooldown_interval_ms: int = 0, repeats_to_cooldown: int = 1,
                    cache_flush_bytes: int = 0, f_preproc: str = "") -> PackedFunction:
    """TVM's time evaluator: returns a function whose result is ``repeat`` float64 seconds-per-call."""
    if mod is None:
        target = sess.registry.get(name, sess)
        fn = target.fn if target else None
    elif isinstance(mod, RuntimeModule):
        fn = mod.find_function(name, False)
    else:
        raise RPCUserError("time_evaluator expects a module")
    if fn is None:
        raise RPCUserError(f"Cannot find function {name!r} to time")
    if f_preproc:
        raise RPCUserError(f"preprocessing function {f_preproc!r} is not available on this board")
    if number < 1 or repeat < 1:
        raise RPCUserError("time_evaluator needs number >= 1 and repeat >= 1")
    Device(device_type, device_id)  # validated by the caller's device use

    def evaluate(*args) -> bytes:
        fn(*args)  # warm-up, as TVM does
        out = []
        n = number
        for i in range(repeat):
            zero_times = 0
            while True:
                start = time.perf_counter()
                for _ in range(n):
                    fn(*args)
                elapsed = time.perf_counter() - start
                zero_times += elapsed == 0
                if elapsed * 1e3 >= min_repeat_ms or zero_times >= limit_zero_time_iterations:
                    break
                n = int(max(min_repeat_ms / (elapsed * 1e3 / n + 1e-12) + 1, n * 1.618))
            out.append(elapsed / n)
            if cooldown_interval_ms > 0 and i % max(repeats_to_cooldown, 1) == 0:
                time.sleep(cooldown_interval_ms / 1e3)
        return struct.pack(f"<{len(out)}d", *out)

    return PackedFunction(evaluate, f"time_evaluator({name})", blocking=True)


@reg("rpcsrv.session_stats")
def _session_stats(sess: Session) -> str:
    """What this session holds: ``objects=N,buffers=N,bytes=N`` (for leak checks)."""
    return f"objects={len(sess.objects)},buffers={len(sess.buffers)},bytes={sess.memory_used}"
