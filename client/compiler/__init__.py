"""The client-side compiler: ONNX → partitioned ExampleJSON BYOC library, without TVM.

``compile_onnx(model_or_path, input_shapes=None, ops=None)`` imports the model (``onnx_import``),
partitions it like TVM's BYOC passes (``partition``), generates graph JSON and ExampleJSON text
(``codegen``) and returns a :class:`CompiledModel` whose ``export_library(path)`` writes the library.
"""

from .errors import CompileError, UnsupportedNodesError
from .model import CompiledModel, Subgraph, compile_onnx, resolve_ops
from .onnx_import import parse_shape

__all__ = ["CompileError", "CompiledModel", "Subgraph", "UnsupportedNodesError", "compile_onnx",
           "parse_shape", "resolve_ops"]
