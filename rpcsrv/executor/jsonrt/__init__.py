"""TVM's JSON-runtime BYOC modules (``JSONRuntimeBase``) run on the board's numpy kernels.

The loader node (``rpcsrv.loader.jsonrt``) holds the symbol, the checked graph and the constant names;
``symbols.py`` makes it a runtime module whose function is the graph; ``table.py`` is the op table
(relay op names and the backends' composite names -> factories in ``nn.py`` and ``tensor_ops.py``);
``attrs.py`` reads the string-list attributes and layouts.  See ``docs/jsonrt.md``.
"""

from .symbols import JSONRuntime, jsonrt_runtime
from .table import COMPOSITES, OPS, lookup, supported_names

__all__ = ["COMPOSITES", "JSONRuntime", "OPS", "jsonrt_runtime", "lookup", "supported_names"]
