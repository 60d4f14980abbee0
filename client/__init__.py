"""The client side of rpcsrv: compile ONNX models into BYOC libraries, run them on a board.

``compile_onnx`` (``client.compiler``) turns a model into a :class:`CompiledModel` whose
``export_library(path)`` writes a library laid out as TVM's ``relay.build`` + ``export_library``
would; ``client.rpc`` is a pure-Python RPC client; ``client.cli`` is the ``byoc`` command.
"""

from .compiler import CompileError, CompiledModel, UnsupportedNodesError, compile_onnx

__all__ = ["CompileError", "CompiledModel", "UnsupportedNodesError", "compile_onnx"]
