"""The compiled kernels: one C library of every family folder's ``.c`` files (``conv/``, ``pool/``, ``norm/``,
``elementwise/``, ...) with the headers they share here (``vec.h``, ``armfloat.h``).

* ``kbuild.py``: the sources and the compile command (standard library only: ``setup.py`` loads it by path
  to build the wheel's prebuilt libraries into ``prebuilt/``);
* ``compiled.py``: the library at run time (built for the board's CPU at first use and cached, or prebuilt),
  the C functions' signatures, and the calls the numpy kernels make into it.

The package holds no names of its own (and imports nothing): import the module that defines one.
"""
