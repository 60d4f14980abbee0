"""The runtime shim: ``shim.c`` built with the board's C compiler at first use, cached, loaded once.

Why a shim and not a TVM library: compiled code needs a handful of C entry points (workspace,
parallel tasks, errors, lookups; see ``shim.c``).  Libraries from TVM's "c" target and tvm-ffi
era libraries reference them as *undefined symbols*, which the dynamic linker only resolves from a
shared object loaded with ``RTLD_GLOBAL`` before them; ctypes callbacks cannot stand in for that.
Our own 200-line C file gives exactly those symbols, with errors kept where Python can read them
and lookups that call back into rpcsrv's module tree.  (apache-tvm-ffi's ``libtvm_ffi.so`` exports
the tvm-ffi half too, but its lookups and errors are tied to its own module and error objects, and
it has no classic ``TVMBackend*`` functions.)

Where it comes from, first found wins:

1. ``RPCSRV_NATIVE_SHIM=/path/libshim.so``: a prebuilt shim (boards without a compiler; build it
   elsewhere with ``cc -O2 -shared -fPIC -o libshim.so rpcsrv/native/shim.c -lpthread``);
2. the cache ``$RPCSRV_CACHE_DIR`` (default ``~/.cache/rpcsrv``), keyed by the source's hash and the
   compiler;
3. built now with ``$RPCSRV_CC``, ``$CC`` or ``cc`` (about 0.2 s, once per board).

Without any, :func:`load_shim` raises :class:`ShimUnavailable`; the caller names the symbols the
library needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from .abi import LookupFunc

SOURCE = Path(__file__).with_name("shim.c")
_lock = threading.Lock()
_shim: ctypes.CDLL | None = None


class ShimUnavailable(RuntimeError):
    """No shim could be found or built (no compiler, no prebuilt shim)."""


def _compiler() -> str | None:
    for name in (os.environ.get("RPCSRV_CC"), os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    root = os.environ.get("RPCSRV_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rpcsrv")
    return Path(root)


def _build() -> Path:
    prebuilt = os.environ.get("RPCSRV_NATIVE_SHIM")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise ShimUnavailable(f"RPCSRV_NATIVE_SHIM={prebuilt} does not exist")
        return Path(prebuilt)
    cc = _compiler()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + str(cc).encode()).hexdigest()[:16]
    target = cache_dir() / f"libshim-{key}.so"
    if target.is_file():
        return target
    if cc is None:
        raise ShimUnavailable("no C compiler (set RPCSRV_CC or CC, or RPCSRV_NATIVE_SHIM to a prebuilt shim)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lpthread"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ShimUnavailable(f"building the native shim with {cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_shim() -> ctypes.CDLL:
    """The shim, loaded once per process with RTLD_GLOBAL (its symbols serve every library)."""
    global _shim
    with _lock:
        if _shim is None:
            lib = ctypes.CDLL(str(_build()), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            lib.rpcsrv_last_error.restype = ctypes.c_char_p
            lib.rpcsrv_set_lookup.argtypes = [LookupFunc]
            lib.rpcsrv_workspace_outstanding.restype = ctypes.c_long
            lib.rpcsrv_cache_flush.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            lib.rpcsrv_cache_flush.restype = None
            _shim = lib
        return _shim


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
