"""The runtime half of the built-in module kinds, attached through the one registry of kinds.

The loader declares the built-in kinds (their payloads, what ``inspect`` says of them) and installs them;
it sits below the executor and names none of its classes.  Here the executor gives each its runtime factory
(``rpcsrv.loader.plugins.attach_runtime``), once, when the executor is imported: after that ``build_runtime``
asks the registry alone, for the built-in kinds as for an installed plugin's.
"""

from __future__ import annotations

from typing import Any

from ..loader.examplejson import KIND as EXAMPLEJSON
from ..loader.jsonrt_inspect import KIND as JSON_RUNTIME
from ..loader.modules import CONST_LOADER, FACTORY, HOST_LIBRARY
from ..loader.plugins import attach_runtime
from ..loader.vm_executable import KIND as VM_EXECUTABLE
from .const_loader import const_loader_runtime
from .examplejson.subgraphs import examplejson_runtime
from .graph.factory import factory_runtime
from .jsonrt import jsonrt_runtime
from .module import RuntimeModule
from .vm.loading import vm_executable_runtime


def host_library_runtime(node: Any, imports: list[RuntimeModule], options: Any) -> RuntimeModule:
    """The host library as the build's options say: native functions, or the placeholder that lists them."""
    return options.host_library(node, imports)


#: each built-in kind and its runtime factory
RUNTIMES = ((FACTORY, factory_runtime), (CONST_LOADER, const_loader_runtime), (HOST_LIBRARY, host_library_runtime),
            (EXAMPLEJSON, examplejson_runtime), (VM_EXECUTABLE, vm_executable_runtime),
            (JSON_RUNTIME, jsonrt_runtime))

for _kind, _factory in RUNTIMES:
    attach_runtime(_kind, _factory)
