"""Native host code: run the functions TVM compiled into a library, without the TVM runtime.

Contract (stable; the graph executor and the Relax VM build on it)
------------------------------------------------------------------
::

    from rpcsrv.native import open_library, NativeError

    lib = open_library(path)          # NativeError: wrong machine, unresolvable runtime symbols, dlopen
    fn = lib.get_function("add_one")  # None when absent.  tvm-ffi ``__tvm_ffi_add_one`` first,
                                      # else the classic packed symbol ``add_one`` ("__tvm_main__": entry)
    out = fn(a, b, 3, 2.5, (4, 5))    # numpy arrays -> DLTensors over their memory (written in place),
                                      # int, float, bool, None, str, Device, DataType; a tuple/list of
                                      # ints -> an ffi.Shape (tvm-ffi only).  Returns None, int, float.
                                      # Non-zero return -> NativeError carrying the function's message.
    call = fn.bind(a, b)              # arguments converted once; call() runs it (hot loops)

``lib.root`` is the module tree whose functions compiled code may look up by name
(``TVMBackendGetFuncFromEnv``, ``TVMFFIEnvModLookupFromImports``); :func:`link_roots` sets it.

Module tree: ``native_options()`` is the ``BuildOptions`` that makes ``HostLibraryModule`` nodes
``NativeLibraryRuntime`` modules in this process; ``load_native_module(path)`` loads a file that way.

Isolation: the server does not call native code in its own process by default.  A session's board is one
of two backends (``rpcsrv.native.backend``: this process, ``LocalBackend``; the session's worker process,
``proxy.Worker``), and a session whose library has native code gets a worker process
(``rpcsrv.native.worker``) that loads the whole module tree with its own ``LocalBackend`` and runs every
call there (so executors call native functions in-process inside the worker); the session holds proxies
(``rpcsrv.native.remote``).  Code running inside the worker (e.g. a Relax VM) just uses the contract above.

Runtime symbols come from our C shim (``shim.c``, built by the board's cc at first use; see
``shim.py`` for why and for boards without a compiler).
"""

from .library import NativeError, NativeFunction, NativeLibrary, inspect_native, open_library
from .runtime import NativeLibraryRuntime, link_roots, load_native_module, native_options

__all__ = ["NativeError", "NativeFunction", "NativeLibrary", "NativeLibraryRuntime", "inspect_native",
           "link_roots", "load_native_module", "native_options", "open_library"]
