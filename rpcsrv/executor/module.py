"""The runtime object model the server hands out as module and function handles.

This is the contract between the executor and the server (see docs/architecture.md):

* A *packed function* is any Python callable.  It takes positional arguments of these kinds
  and returns one of them (or None):

  - ``int``, ``float``, ``bool``, ``str``, ``bytes``, ``None``
  - ``rpcsrv.protocol.dtypes.Device`` and ``rpcsrv.protocol.dtypes.DataType``
  - ``numpy.ndarray`` — a tensor.  Arrays the server passes in are *views of session-owned
    device buffers*: writing into them writes the remote tensor (that is how ``get_output(i, out)``
    and the ExampleJSON output arguments work).  A returned array becomes a new remote NDArray
    handle; the server keeps it alive until the client frees it.
  - ``RuntimeModule`` — a module (returned modules become module handles).
  - another packed function.

* A ``RuntimeModule`` has a ``type_key``, a list of ``imports`` and ``get_function(name)`` which
  returns a packed function or ``None`` when the module has no such function (TVM's
  ``GetFunction`` returning a null PackedFunc).  Errors a user can act on are raised as
  ``RuntimeError`` subclasses with a message; the server sends the message to the client as an
  RPC exception.

* Constants reach external modules through three hooks ``build_runtime`` calls on every module
  (defaults: not mine / nothing to do): ``bind_constants(symbol, arrays, source)`` from a const
  loader, ``bind_params(params, source)`` from a graph executor factory above, then
  ``check_constants()``, which refuses a module left without its constants at ``load_module``.

* A module kind whose functions run a graph of kernel steps (ExampleJSON, TVM's JSON-runtime modules)
  reports each step to :data:`STEP_HOOK` when one is set: the debug executor's per-kernel timings and
  intermediate outputs (``debug.py``) then see inside any such kind, not one in particular.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

from ..loader.modules import walk_imports

#: optional per-step observer ``hook(function, step, value, seconds)``: ``step`` has the step's ``id``
#: and ``op``; set only in the thread doing the debug call (the debug executor, profilers, benches)
STEP_HOOK: ContextVar[Optional[Callable[..., None]]] = ContextVar("step_hook", default=None)


class StepInfo(NamedTuple):
    """What a step hook learns of a kernel step: its id in its graph and its op's name."""

    id: int
    op: str

PackedFunc = Callable[..., Any]


class ExecutorError(RuntimeError):
    """A user-facing error from the executor (bad input, missing function, bad graph)."""


class RuntimeModule:
    """Base class of every module the server can hand out."""

    type_key: str = "module"

    def __init__(self, imports: Optional[list["RuntimeModule"]] = None):
        self.imports: list[RuntimeModule] = list(imports or [])

    def get_function(self, name: str) -> Optional[PackedFunc]:
        """This module's own function ``name``, or None."""
        return None

    def bind_constants(self, symbol: str, arrays: Mapping[str, Any], source: str) -> bool:
        """Take the constants of external function ``symbol`` (name -> array) from a const loader;
        False when this module does not have ``symbol`` (the const loader then tries ``__init_<symbol>``)."""
        return False

    def bind_params(self, params: Mapping[str, Any], source: str) -> None:
        """Take the constants still missing from a graph executor factory's params (by name)."""

    def check_constants(self) -> None:
        """Raise ``ExecutorError`` when a constant this module needs is still unbound."""

    def walk(self) -> Iterator["RuntimeModule"]:
        """This module, then its imports depth-first (each module once): the loader's walk."""
        return walk_imports(self)

    def find_function(self, name: str, query_imports: bool = True) -> Optional[PackedFunc]:
        """TVM's lookup: this module first, then (if asked) the import tree depth-first."""
        if not query_imports:
            return self.get_function(name)
        for mod in self.walk():
            fn = mod.get_function(name)
            if fn is not None:
                return fn
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} type_key={self.type_key!r} imports={len(self.imports)}>"
