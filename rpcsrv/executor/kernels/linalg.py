"""Matrix products: MatMul (batched, broadcasting), Gemm, Einsum.

``matmul`` and ``gemm`` accept the fused-composite attrs ``activation`` / ``activation_attrs`` (the
compiler folds dense+bias(+relu) into one node: ``gemm`` for 2-D inputs, ``matmul`` with its bias
input ``c`` for higher ranks).  Float16 is multiplied in float32: numpy's float16
matmul has no BLAS path and accumulates in float16.
"""

from __future__ import annotations

import numpy as np

from .registry import apply_activation, bad, register


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


@register("matmul")
def matmul(a, b, c=None, *, activation=None, activation_attrs=None):
    """ONNX MatMul (numpy.matmul semantics: 1-D promotion, batch dims broadcast).

    ``c`` (an rpcsrv extension, the compiler's dense+bias composite for inputs of any rank) is
    added to the product in place; it must broadcast to the product's shape without growing it.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        raise bad("matmul", f"input dtypes differ: {a.dtype} and {b.dtype}")
    if a.ndim == 0 or b.ndim == 0:
        raise bad("matmul", "inputs must have at least one dimension")
    ct = _compute_dtype(a.dtype)
    y = np.asarray(np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False)))
    if c is not None:
        y = _add_bias(y, np.asarray(c), a.dtype, ct)
    y = y.astype(a.dtype, copy=False)
    return apply_activation(y, activation, activation_attrs, "matmul")


def _add_bias(y: np.ndarray, c: np.ndarray, dtype: np.dtype, ct: np.dtype) -> np.ndarray:
    """``y += c`` for matmul's bias; numpy's in-place add itself refuses a ``c`` that would grow y."""
    try:
        if c.dtype != dtype or (y.ndim == 0 and c.ndim):
            raise ValueError("bias dtype or rank")
        y += c.astype(ct, copy=False)
    except ValueError:
        raise bad("matmul", f"bias {c.dtype} {list(c.shape)} does not broadcast onto the "
                            f"{dtype} product {list(y.shape)}") from None
    return y


@register("gemm")
def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0,
         activation=None, activation_attrs=None):
    """ONNX Gemm: alpha * op(A) @ op(B) + beta * C, with C broadcast to (M, N)."""
    a, b = np.asarray(a), np.asarray(b)
    dtype = a.dtype
    if a.ndim != 2 or b.ndim != 2:
        raise bad("gemm", f"A and B must be 2-D, got shapes {a.shape} and {b.shape}")
    ct = _compute_dtype(a.dtype)
    a = a.astype(ct, copy=False).T if transA else a.astype(ct, copy=False)
    b = b.astype(ct, copy=False).T if transB else b.astype(ct, copy=False)
    if a.shape[1] != b.shape[0]:
        raise bad("gemm", f"inner dimensions differ: {a.shape} @ {b.shape}")
    y = a @ b
    if alpha != 1.0:
        y *= ct.type(alpha)
    if c is not None:
        c = np.asarray(c).astype(ct, copy=False)
        y += c if beta == 1.0 else c * ct.type(beta)
    y = y.astype(dtype, copy=False)
    return apply_activation(y, activation, activation_attrs, "gemm")


@register("einsum")
def einsum(*inputs, equation: str):
    """ONNX Einsum through numpy.einsum (same equation language, '...' for broadcast dims)."""
    if not inputs or any(x is None for x in inputs):
        raise bad("einsum", "needs at least one input and no absent ones")
    arrays = [np.asarray(x) for x in inputs]
    try:
        y = np.einsum(equation.replace(" ", ""), *arrays, optimize=len(arrays) > 2)
    except ValueError as exc:
        raise bad("einsum", f"equation {equation!r}: {exc}") from None
    return np.asarray(y).astype(arrays[0].dtype, copy=False)
