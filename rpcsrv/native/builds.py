"""A server's background build: the native runtime shim, then the executor's compiled kernels for this CPU,
built by the board's compiler from the server's start, off every request's path.

No build sits inside a request or a native worker's start window (on a slow board the kernels take
minutes).  From :meth:`BoardBuild.start`, called once by the server when it starts:

* what is found serves at once: the cache, the wheel's prebuilt libraries, else numpy for the kernels;
* the build runs in one thread at the lowest priority (its compiler inherits it), in a private folder of the
  cache (``toolchain.build_folder``: the compiler's temporary files too), each result moved into the cache
  atomically; what a killed build left is removed at the next start (``toolchain.sweep``);
* the shim first (a second or two on a slow board; a session that needs it meanwhile waits for it, as there is
  no other way to run native code), then the kernels, which this process installs when built
  (``compiled.install``) and which every native worker started after that is given (``process.worker_config``);
* :meth:`BoardBuild.stop` (at exit) ends the compiler and everything it started, and removes the folder.

Settings: ``rpcsrv.config.toolchain.BuildSettings`` (``--cache-dir``, ``--build``).  ``rpcsrv check`` builds
the same two ahead of time (inline), so a board can be prepared before it serves.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
import time
from typing import Optional

from ..config.toolchain import BuildSettings, Compiler, build_folder, c_compiler, sweep
from ..executor.compute import lower_priority
from ..executor.kernels.clib import compiled, kcache
from . import shim

log = logging.getLogger("rpcsrv.native.builds")

#: how much lower than the server the build runs (the most a nice value takes: it yields to every request)
BUILD_NICE = 19
#: seconds one compile may take in the background (a slow board's -O3 build of every kernel is minutes)
BUILD_TIMEOUT = 3600.0


class BoardBuild:
    """The background build of this process (one per server process: :data:`BUILD`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None
        self.compiler: Optional[Compiler] = None
        self.stopping = threading.Event()
        #: what happened (also logged): "shim" and "kernels" -> a line each
        self.outcome: dict[str, str] = {}

    def start(self, settings: BuildSettings) -> None:
        """From now on this process finds its shim and kernels without building them at first use, and builds
        what it lacks in the background (once per process: a second call changes nothing)."""
        with self._lock:
            if self.thread is not None:
                return
            shim.POLICY.configure("background", settings)
            compiled.POLICY.configure("background", settings)
            removed = sweep(settings.folder())
            if removed:
                log.info("removed what killed builds left in %s: %s", settings.folder(),
                         ", ".join(p.name for p in removed))
            if not settings.build:
                self.outcome.update(shim="not built (--build off)", kernels="not built (--build off)")
                return
            shim.POLICY.idle.clear()  # before any session can ask: a session waits for the shim's build
            compiled.POLICY.idle.clear()
            log.info("building what this board lacks of the native shim and compiled kernels in the background, "
                     "into %s", settings.folder())
            self.thread = threading.Thread(target=self._run, args=(settings,), name="rpcsrv-build", daemon=True)
            atexit.register(self.stop)
            self.thread.start()

    def _run(self, settings: BuildSettings) -> None:
        lower_priority([threading.get_native_id()], BUILD_NICE)  # the compiler inherits this thread's priority
        try:
            self._step("shim", shim.POLICY, lambda run: self._shim(run))
            self._step("kernels", compiled.POLICY, lambda run: self._kernels(settings, run))
        finally:
            shim.POLICY.idle.set()
            compiled.POLICY.idle.set()

    def _step(self, name: str, policy, build) -> None:
        start = time.monotonic()
        try:
            if self.stopping.is_set():
                return
            with build_folder(policy.settings.folder()) as folder:
                compiler = self.compiler = Compiler(folder)
                if self.stopping.is_set():  # (stopped while the folder was made: no compiler runs)
                    compiler.stop()
                what = build(compiler.run)
            if what:
                self.outcome[name] = f"{what} in {time.monotonic() - start:.1f} s"
                log.info("background build: %s %s", name, self.outcome[name])
        except Exception as exc:  # (OSError, a build error, a stopped compiler): what serves stays in use
            policy.failure = f"the background build failed: {exc}"
            self.outcome[name] = policy.failure
            if not self.stopping.is_set():
                log.warning("background build of the %s failed (what was found serves): %s", name, exc)
        finally:
            self.compiler = None
            policy.idle.set()

    @staticmethod
    def _shim(run) -> str:
        for _target, path, fits in shim.prebuilt():
            if fits:
                try:  # the wheel's serves, unless this board's C library refuses it (musl, an old glibc)
                    ctypes.CDLL(str(path))
                    return ""
                except OSError:
                    continue
        if shim.compiled(build=False) is not None:
            return ""
        path = shim.compiled(build=True, run=run)
        return f"built: {path}" if path is not None else ""

    @staticmethod
    def _kernels(settings: BuildSettings, run) -> str:
        if not compiled.enabled():
            return ""
        target = kcache.cache_path(settings.folder())
        if target.is_file():
            if compiled.in_use_path() != str(target):  # (cached meanwhile by another process)
                compiled.install(target, f"built for this CPU, cached in {target.parent}")
            return ""
        if c_compiler() is None:  # a board without one: what was found serves, and that is no failure
            compiled.POLICY.failure = "no C compiler to build them for this CPU (set RPCSRV_CC or CC)"
            return ""
        path, origin = kcache.build(settings, run=run, timeout=BUILD_TIMEOUT)
        compiled.install(path, origin)
        return f"built and in use: {path}"

    def stop(self) -> None:
        """End the build: its compiler (and what it started) killed, its folder removed, the thread joined."""
        self.stopping.set()
        compiler = self.compiler
        if compiler is not None:
            compiler.stop()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)


#: this process's background build (a server's, started by ``rpcsrv.board.server.serve``)
BUILD = BoardBuild()
