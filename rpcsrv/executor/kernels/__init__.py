"""The numpy kernel table: one small function per op of the catalogue, registered by name.

``KERNELS`` maps an op name (the snake_case of the ONNX op type, see ``onnx_op_to_kernel``) to
``kernel(*inputs, **attrs)``.  What each op takes is declared once, in the op catalogue
``rpcsrv.loader.opset`` (which the client's compiler reads too); importing this package fails if
a kernel and its declaration disagree, or if a declared op has no kernel.  The runtimes
(``examplejson``, the graph executor) look kernels up here; docs/examplejson.md ("Ops") lists
what each op accepts.

Layout: the op families with their run plans and C kernels in a folder each (``conv/``, ``pool/``,
``norm/``, ``elementwise/``; ``quant/``: integer and quantized ops), the other ops' modules here
(``linalg.py``, ``reduce.py``, ``resize.py``, ``shape.py``, ``misc.py``), what they share here
(``registry.py``, ``windows.py``, ``onnx_dtypes.py``, ``prepared.py``, ``load_time.py``; the plans' ``plans.py``
and ``plan_support.py``), and the C library of every family's ``.c`` files in ``clib/`` (``kbuild.py`` builds
it, ``compiled.py`` loads it).
"""

from __future__ import annotations

from ...loader.opset import onnx_op_to_kernel

# each module registers its kernels on import (in this order: the table's); aliased, so that ``conv``, ``pool``,
# ``norm`` and ``quant`` here stay the family packages
from .elementwise import binary as _binary
from .conv import conv as _conv
from . import linalg as _linalg, misc as _misc
from .norm import norm as _norm
from .pool import pool as _pool
from .quant import integer as _integer, qlinear as _qlinear
from . import reduce as _reduce, resize as _resize, shape as _shape
from .elementwise import unary as _unary
from .registry import KERNELS, Kernel, check_complete, register

check_complete()

SUPPORTED_OPS: frozenset[str] = frozenset(KERNELS)

__all__ = ["KERNELS", "Kernel", "SUPPORTED_OPS", "onnx_op_to_kernel", "register"]
