"""The numpy kernel table: one small function per op of the catalogue, registered by name.

``KERNELS`` maps an op name (the snake_case of the ONNX op type, see ``onnx_op_to_kernel``) to
``kernel(*inputs, **attrs)``.  What each op takes is declared once, in the op catalogue
``rpcsrv.loader.opset`` (which the client's compiler reads too); importing this package fails if
a kernel and its declaration disagree, or if a declared op has no kernel.  The runtimes
(``examplejson``, the graph executor) look kernels up here; docs/examplejson.md ("Ops") lists
what each op accepts.
"""

from __future__ import annotations

from ...loader.opset import onnx_op_to_kernel

# each module registers its kernels on import
from . import binary, conv, linalg, misc, norm, pool, qlinear, quant, reduce, resize, shape, unary  # noqa: F401
from .registry import KERNELS, Kernel, check_complete, register

check_complete()

SUPPORTED_OPS: frozenset[str] = frozenset(KERNELS)

__all__ = ["KERNELS", "Kernel", "SUPPORTED_OPS", "onnx_op_to_kernel", "register"]
