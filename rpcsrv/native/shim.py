"""The runtime shim: ``shim.c`` as a shared library, found (prebuilt) or built, loaded once per process.

Why a shim and not a TVM library: compiled code needs a handful of C entry points (workspace,
parallel tasks, errors, lookups; see ``shim.c``).  Libraries from TVM's "c" target and tvm-ffi
era libraries reference them as *undefined symbols*, which the dynamic linker only resolves from a
shared object loaded with ``RTLD_GLOBAL`` before them; ctypes callbacks cannot stand in for that
(so there is no pure-Python fallback).  Our own 250-line C file gives exactly those symbols, with
errors kept where Python can read them and lookups that call back into rpcsrv's module tree.
(apache-tvm-ffi's ``libtvm_ffi.so`` exports the tvm-ffi half too, but its lookups and errors are
tied to its own module and error objects, and it has no classic ``TVMBackend*`` functions.)

Where it comes from, first that loads wins (docs/native.md, "Packaging"):

1. ``RPCSRV_NATIVE_SHIM=/path/libshim.so``: this one and no other (an explicit choice);
2. prebuilt in the package, ``prebuilt/<target>/libshim.so`` (the wheel carries x86_64, aarch64 and
   armv7 hard-float ones, built by ``shimbuild.py`` at wheel-build time), if its ELF machine is this
   board's and ``dlopen`` takes it (a board with an older C library may refuse it: next step);
3. the cache (``--cache-dir``, ``$RPCSRV_CACHE_DIR``, default ``~/.cache/rpcsrv``), keyed by the source's hash
   and the compiler, else built with ``$RPCSRV_CC``, ``$CC``, cc, gcc or clang (about 0.2 s, once; a few
   seconds on a slow board): at first use in a script or ``rpcsrv check``; by a server in the background
   from its start, first of its builds (a session that needs the shim meanwhile waits for that build, as
   there is no other way to run native code); never by a native worker, which loads the file its server
   gave it (:data:`POLICY`).

Without any, :func:`load_shim` raises :class:`ShimUnavailable` whose message is one line saying
what to do; the caller names the symbols the library needed.  :func:`status` tells ``rpcsrv check``
what was found and tried.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path
from typing import Iterator

from ..config import environment
from ..config.toolchain import BuildPolicy, build_folder, c_compiler as host_compiler
from .abi import LookupFunc
from .machine import board, machine_of

SOURCE = Path(__file__).with_name("shim.c")
PREBUILT = Path(__file__).with_name("prebuilt")
_lock = threading.Lock()
#: the loaded shim: "lib" (the CDLL), "origin" (how it was found, for status), "path" (its file, shim_path)
_loaded: dict = {}
_tried: list[str] = []  # why earlier candidates were passed over (status, error messages)
#: how this process gets its shim: built at first use (a script, ``rpcsrv check``), by a server's background
#: build from its start (``rpcsrv.native.builds``), or (a native worker) the file its server gave
POLICY = BuildPolicy()


class ShimUnavailable(RuntimeError):
    """No shim could be found or built (no compiler, no prebuilt shim for this board)."""


def prebuilt(name: str = "libshim.so") -> list[tuple[str, Path, bool]]:
    """The package's prebuilt ``name`` per target: (target, path, whether its machine is this board's)."""
    here = board()
    found = []
    for path in sorted(PREBUILT.glob(f"*/{name}")):
        try:
            with open(path, "rb") as f:
                fits = here.runs(machine_of(f))
        except (OSError, ValueError):
            fits = False
        found.append((path.parent.name, path, fits))
    return found


def compiled(name: str = "libshim.so", build: bool = True, run=None) -> Path | None:
    """``name`` built by this board's compiler, in the cache of :data:`POLICY`'s settings (built now if need be
    and ``build``, in a private build folder of the cache; ``run``: how the compiler runs, one a server's
    background build can stop); None without a compiler or a cached one.  BuildError when the compiler fails."""
    cc = host_compiler()
    source = Path(__file__).with_name({"libshim.so": "shim.c", "libcheck.so": "check_kernel.c"}[name])
    key = hashlib.sha256(source.read_bytes() + str(cc).encode()).hexdigest()[:16]
    folder = POLICY.settings.folder()
    target = folder / f"{name[:-3]}-{key}.so"
    if target.is_file():
        return target
    if cc is None or not build or not POLICY.settings.build:
        return None
    # shimbuild is imported where used: `python -m rpcsrv.native.shimbuild` must find it not yet imported
    import subprocess

    from .shimbuild import BuildError, compile_library

    with build_folder(folder) as tmp:
        try:
            compile_library(cc, name, tmp / name, run=run or subprocess.run)
        except subprocess.SubprocessError as exc:  # a timeout, or a stopped build
            raise BuildError(f"building {name} with {cc}: {exc}") from None
        os.replace(tmp / name, target)
    return target


def advice() -> str:
    """What to do on a board where no shim fits (one sentence)."""
    return ("install a C compiler (e.g. `apt-get install gcc`), or build the shim on another machine with "
            "`python -m rpcsrv.native.shimbuild OUT --cc <cross gcc for this board>` and set "
            "RPCSRV_NATIVE_SHIM=OUT/<target>/libshim.so")


def _candidates(tried: list[str]) -> Iterator[tuple[Path, str]]:
    if POLICY.mode == "given":  # a native worker: the server's shim, or none
        if POLICY.given:
            yield Path(POLICY.given), "given by the server"
        raise ShimUnavailable(f"no native shim for this board (the server had none when it started this worker: "
                              f"{POLICY.failure or 'see rpcsrv check'}): {advice()}")
    explicit = environment.text("RPCSRV_NATIVE_SHIM")
    if explicit:
        if not os.path.isfile(explicit):
            raise ShimUnavailable(f"RPCSRV_NATIVE_SHIM={explicit} does not exist")
        yield Path(explicit), "RPCSRV_NATIVE_SHIM"
        return
    for target, path, fits in prebuilt():
        if fits:
            yield path, f"prebuilt for {target}"
    from .shimbuild import BuildError

    if POLICY.mode == "background":  # a server: its background build makes the shim first, in seconds
        POLICY.idle.wait()
    try:
        path = compiled(build=POLICY.builds_inline)
    except BuildError as exc:
        tried.append(str(exc))
        path = None
    except OSError as exc:  # e.g. a read-only home: no cache to build into
        tried.append(f"cannot build it in {POLICY.settings.folder()} ({exc.strerror or exc}; set --cache-dir)")
        path = None
    if path is not None:
        yield path, f"built with {host_compiler() or 'cc'} (cached in {path.parent})"
    elif host_compiler() is None:
        tried.append("no C compiler")
    elif POLICY.failure:
        tried.append(POLICY.failure)
    elif not POLICY.settings.build:
        tried.append("building is turned off")
    have = ", ".join(t for t, _, _ in prebuilt()) or "none"
    raise ShimUnavailable(f"no native shim for this board ({board()}; prebuilt in the package: {have}; "
                          f"{'; '.join(tried)}): {advice()}")


def load_shim() -> ctypes.CDLL:
    """The shim, loaded once per process with RTLD_GLOBAL (its symbols serve every library)."""
    with _lock:
        if "lib" not in _loaded:
            _tried.clear()
            for path, origin in _candidates(_tried):
                try:
                    lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
                except OSError as exc:
                    if origin == "RPCSRV_NATIVE_SHIM":
                        raise ShimUnavailable(f"RPCSRV_NATIVE_SHIM={path}: dlopen failed: {exc}") from None
                    _tried.append(f"{origin}: dlopen failed: {exc}")
                    continue
                lib.rpcsrv_last_error.restype = ctypes.c_char_p
                lib.rpcsrv_set_lookup.argtypes = [LookupFunc]
                lib.rpcsrv_workspace_outstanding.restype = ctypes.c_long
                lib.rpcsrv_cache_flush.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                lib.rpcsrv_cache_flush.restype = None
                _loaded.update(lib=lib, origin=f"{path} ({origin})", path=path)
                break
        return _loaded["lib"]


def shim_path() -> Path:
    """The file of the shim this process loaded (loading it if need be): what a confined worker is told
    to load, since it can neither compile nor read the server's cache."""
    load_shim()
    return _loaded["path"]


def status() -> dict:
    """What ``rpcsrv check`` reports: the shim loaded (or why none), the prebuilt ones, the compiler."""
    out = {"board": str(board()), "compiler": host_compiler(),
           "prebuilt": {target: ("this machine" if fits else "other machine") for target, _, fits in prebuilt()}}
    try:
        load_shim()
        out["shim"], out["error"] = _loaded["origin"], None
    except (ShimUnavailable, OSError) as exc:  # (a compiler's failure is in ShimUnavailable's message)
        out["shim"], out["error"] = None, str(exc)
    out["passed_over"] = list(_tried)
    return out


#: the shim's functions TVM's library loaders write into ``__<name>`` pointer globals
CONTEXT_FUNCTIONS = (
    "TVMFuncCall", "TVMAPISetLastError", "TVMBackendGetFuncFromEnv", "TVMBackendAllocWorkspace",
    "TVMBackendFreeWorkspace", "TVMBackendParallelLaunch", "TVMBackendParallelBarrier",
    "TVMFFIFunctionCall", "TVMFFIEnvModLookupFromImports", "TVMFFIHandleInitOnce", "TVMFFIErrorSetRaisedFromCStr",
)

#: every symbol the shim defines for libraries (what it can resolve when a library leaves it undefined)
PROVIDED = frozenset(CONTEXT_FUNCTIONS) | {
    "TVMFFIErrorSetRaisedFromCStrParts", "TVMGetLastError", "TVMBackendRunOnce", "TVMFFIEnvGetStream",
    "TVMFFIEnvSetStream", "TVMFFIEnvCheckSignals", "TVMFFIEnvRegisterCAPI", "TVMFFIEnvModRegisterContextSymbol",
    "TVMFFIEnvModRegisterSystemLibSymbol", "TVMBackendRegisterSystemLibSymbol", "TVMBackendRegisterEnvCAPI",
    "TVMFFIEnvTensorAlloc",
}
