"""The Relax VM (TVM >= 0.21): runs ``relax.VMExecutable`` modules without TVM.

* ``executable.py``: the executable's runtime module, checked at load (``checks.py``: the code's
  checks); ``interpreter.py``: the virtual machine (interpreter and the remote interface
  ``relax.VirtualMachine`` uses); ``profiler.py``: ``rpcsrv_profile``'s instrument;
* ``loading.py``: the module-kind table's entry (kernels from the tree's native library);
* ``builtins.py``: the ``vm.builtin.*`` functions compiled code calls;
* ``registers.py``: register values (tensors, pooled storage, closures) and how they cross the
  VM's boundary;
* ``ffi.py``: native kernels through the tvm-ffi safe-call ABI.
"""

from .builtins import BUILTINS, VMError
from .executable import VMExecutableRuntime
from .interpreter import VirtualMachine, export

__all__ = ["BUILTINS", "VMError", "VMExecutableRuntime", "VirtualMachine", "export"]
