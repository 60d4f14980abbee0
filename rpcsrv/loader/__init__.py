"""Read TVM-exported libraries without TVM: find the module blob, decode the module tree.

``load_library`` takes an ELF/Mach-O object or shared library, an ``export_library`` tar or a raw
blob file and returns the module tree with params as views over the mapped file.  ``build_blob``,
``symbol_content`` and the ``save_*`` functions write the same formats (the client exporter uses them).
"""

from .blob import build_blob, parse_blob
from .errors import LoaderError
from .library import LoadedLibrary, load_library
from .location import BLOB_SYMBOL, FFI_BLOB_SYMBOL, symbol_content
from .formats import load_ndarray, load_param_dict, save_ndarray, save_param_dict
from .examplejson import ExampleJSONModule
from .modules import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, ModuleNode, UnknownModule
from .vm_executable import VMExecutableModule  # also registers the relax.VMExecutable payload

__all__ = [
    "BLOB_SYMBOL", "FFI_BLOB_SYMBOL", "ConstLoaderModule", "ExampleJSONModule",
    "GraphExecutorFactoryModule", "HostLibraryModule", "LoadedLibrary", "LoaderError", "ModuleNode",
    "UnknownModule", "build_blob", "load_library", "load_ndarray", "load_param_dict", "parse_blob",
    "save_ndarray", "save_param_dict", "symbol_content", "VMExecutableModule",
]
