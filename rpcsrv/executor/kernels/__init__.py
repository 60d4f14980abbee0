"""The numpy kernel table: one small function per ONNX-style op, registered by name.

``KERNELS`` maps an op name (the snake_case of the ONNX op type, see ``onnx_op_to_kernel``) to
``kernel(*inputs, **attrs)``.  The runtimes (``examplejson``, the graph executor) look kernels up
here; docs/examplejson.md ("Ops") lists what each op accepts.
"""

from __future__ import annotations

# each module registers its kernels on import
from . import binary, conv, linalg, misc, norm, pool, quant, reduce, resize, shape, unary  # noqa: F401
from .registry import KERNELS, Kernel, onnx_op_to_kernel, register

SUPPORTED_OPS: frozenset[str] = frozenset(KERNELS)

__all__ = ["KERNELS", "Kernel", "SUPPORTED_OPS", "onnx_op_to_kernel", "register"]
