"""The client side of rpcsrv: compile ONNX models into BYOC libraries, run them on a board.

``compile_onnx`` (``rpcsrv.client.compiler``) turns a model into a :class:`CompiledModel` whose
``export_library(path)`` writes a library laid out as TVM's ``relay.build`` + ``export_library``
would; ``rpcsrv.client.rpc`` is a pure-Python RPC client; ``rpcsrv.client.cli`` is the ``byoc`` command.

The compiler names are imported on first use, so that ``rpcsrv.client.rpc`` alone stays light (no onnx).
"""

from __future__ import annotations

__all__ = ["CompileError", "CompiledModel", "UnsupportedNodesError", "compile_onnx"]


def __getattr__(name: str):
    if name in __all__:
        from . import compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")
