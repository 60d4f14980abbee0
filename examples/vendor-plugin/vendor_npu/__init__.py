"""vendor_npu: an example accelerator for rpcsrv (see docs/plugins.md in the rpcsrv repository).

* ``program.py``: its binary program format, declared once with construct (header, tensor table,
  fixed-size op records, constant pool);
* ``codegen.py``: the compiler side (``byoc compile --codegen vendor_npu``): op set, composite
  patterns, one program per partitioned region;
* ``runtime.py``: the board side (``rpcsrv serve``): decode a program, run it with numpy.
"""

TYPE_KEY = "vendor_npu"
