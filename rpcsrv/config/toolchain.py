"""The board's C compiler and the folder its builds are cached in, found one way for everything built on it:
the native runtime shim (``rpcsrv.native.shim``) and the executor's compiled kernels
(``rpcsrv.executor.kernels.clib.compiled``).  The compile commands themselves stay with their sources
(``shimbuild.py``, ``kbuild.py``: standard-library scripts a wheel build loads by path).

Also what both builds share on a board:

* :class:`BuildSettings`: where a process caches what it builds, and whether it may run the compiler (a
  server's ``--cache-dir`` and ``--build``);
* :class:`BuildPolicy`: how a process gets one built library: ``inline`` (built at first use: a script,
  ``rpcsrv check``), ``background`` (a server: what is found serves, nothing is built on a request's path;
  its background build installs the result when done), ``given`` (a native worker: the file its server
  found, or none; it never compiles);
* :func:`build_folder`, :func:`sweep` and :class:`Compiler`: every build runs in a private folder of the
  cache (``.build-<pid>-*``, the compiler's own temporary files included), removed on every way out; one left
  by a process that was killed is recognised by its dead pid and removed by the next :func:`sweep`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from . import environment

#: compilers tried after ``$RPCSRV_CC`` and ``$CC``, in order
COMPILERS = ("cc", "gcc", "clang")
#: the name of a build's private folder in the cache: ``.build-<pid>-<random>``
BUILD_PREFIX = ".build-"
#: a temporary library older versions wrote into the cache itself (``tmp*.so``) is removed past this age
STALE_TEMP = 3600.0


def c_compiler() -> Optional[str]:
    """The board's C compiler: ``$RPCSRV_CC``, ``$CC``, then cc, gcc, clang on PATH, as a full path (None: none)."""
    for name in (environment.text("RPCSRV_CC"), environment.text("CC"), *COMPILERS):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def cache_dir() -> Path:
    """Where built libraries are cached: ``$RPCSRV_CACHE_DIR``, else ``~/.cache/rpcsrv``."""
    return Path(environment.text("RPCSRV_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rpcsrv"))


@dataclass(frozen=True)
class BuildSettings:
    """Where a process caches the shim and kernels it builds (``cache``; None: :func:`cache_dir`), and whether
    it runs the board's compiler at all (``build``; False: the cache, the prebuilt libraries or numpy only)."""

    cache: Optional[Path] = None
    build: bool = True

    def folder(self) -> Path:
        return Path(self.cache) if self.cache is not None else cache_dir()


MODES = ("inline", "background", "given")


class BuildPolicy:
    """How this process gets one library built on the board (the module docstring); set by the process's
    owner (:meth:`configure`: a server at start, a worker from its start message), read where it is loaded."""

    def __init__(self) -> None:
        self.configure()

    def configure(self, mode: str = "inline", settings: BuildSettings = BuildSettings(),
                  given: Optional[str] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"build mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.settings, self.given = mode, settings, given
        #: set when no build of this process is under way (a background build clears it while it runs)
        self.idle = threading.Event()
        self.idle.set()
        self.failure = ""  # why the last background build failed ("" when it did not)

    @property
    def builds_inline(self) -> bool:
        """Whether a first use may run the compiler now (``inline``, and the settings allow building)."""
        return self.mode == "inline" and self.settings.build


@contextlib.contextmanager
def build_folder(cache: Path) -> Iterator[Path]:
    """A private folder for one build in ``cache`` (created), removed with whatever is in it on every way out."""
    cache.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{os.getpid()}-", dir=cache))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: it exists)
        return True
    return True


def sweep(cache: Path, now: Optional[float] = None) -> list[Path]:
    """Remove what killed builds left in ``cache``: the build folders of processes no longer running, and the
    ``tmp*.so`` files older versions built into (past :data:`STALE_TEMP` seconds).  Returns what it removed."""
    removed: list[Path] = []
    now = time.time() if now is None else now
    try:
        entries = list(cache.iterdir())
    except OSError:
        return removed
    for path in entries:
        name = path.name
        try:
            if name.startswith(BUILD_PREFIX) and path.is_dir():
                pid = name[len(BUILD_PREFIX):].split("-", 1)[0]
                if pid.isdigit() and not _running(int(pid)):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            elif name.startswith("tmp") and name.endswith(".so") and now - path.stat().st_mtime > STALE_TEMP:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed


class Compiler:
    """Runs a build's commands (``subprocess.run``'s call, for ``kbuild``/``shimbuild``'s ``run=``) with their
    temporary files in the build's folder, each in a process group of its own, so that :meth:`stop` ends
    the compiler and everything it started."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self.stopped = False

    def run(self, cmd, capture_output=True, text=True, timeout=None, **_) -> subprocess.CompletedProcess:
        env = {**os.environ, "TMPDIR": str(self.folder)}
        with self._lock:
            if self.stopped:
                raise subprocess.SubprocessError("the build was stopped")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self._procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            proc.communicate()
            raise
        finally:
            with self._lock:
                self._procs.remove(proc)
        if self.stopped:
            raise subprocess.SubprocessError("the build was stopped")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End the running command's whole process group; later commands are refused."""
        with self._lock:
            self.stopped = True
            procs = list(self._procs)
        for proc in procs:
            self._kill(proc)
