"""ONNX element-type numbers (TensorProto.DataType) to numpy dtypes, for Cast and friends."""

from __future__ import annotations

import numpy as np

from ...protocol.dtypes import numpy_dtype
from .registry import bad

# TensorProto.DataType numbers numpy can represent (string, bfloat16 and float8/4 types cannot)
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8), 4: np.dtype(np.uint16),
    5: np.dtype(np.int16), 6: np.dtype(np.int32), 7: np.dtype(np.int64), 9: np.dtype(np.bool_),
    10: np.dtype(np.float16), 11: np.dtype(np.float64), 12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}


def onnx_dtype(value, op: str) -> np.dtype:
    """A numpy dtype from an ONNX type number or a TVM dtype string ('float16', 'bool', ...)."""
    if isinstance(value, str):
        try:
            return numpy_dtype(value)
        except (ValueError, KeyError, TypeError) as exc:
            raise bad(op, f"unknown dtype {value!r}") from exc
    try:
        return ONNX_DTYPES[int(value)]
    except (KeyError, TypeError, ValueError):
        raise bad(op, f"ONNX element type {value!r} is not supported (numpy has no such type)") from None
