"""The ``vm.builtin.*`` functions compiled Relax code calls (TVM's ``src/runtime/vm/builtin.cc``).

Each takes the register values as TVM passes them (``registers.py``).  Those that need the machine
(allocation, closures) get it as their ``%vm`` argument.  Errors a user can cause (a tensor of the
wrong rank, dtype or shape passed to ``main``) are ``VMError`` with TVM's error context string,
which names the function, the parameter and its annotation.

``BUILTINS`` lists what this board implements; ``UNSUPPORTED`` names the rest of TVM's builtins
(KV caches, sampling, CUDA graphs, ...) so a library calling one is refused when it is loaded,
with the builtin's name, not halfway through a run.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...protocol.dtypes import DataType
from ..module import ExecutorError
from .registers import Closure, ShapeTuple, Storage, Tensor, aligned_empty, dtype_of

# MatchShapeCode / MakeShapeCode (include/tvm/runtime/vm/builtin.h)
ASSERT_EQ_IMM, STORE_TO_HEAP, NO_OP, ASSERT_EQ_LOAD = 0, 1, 2, 3
USE_IMM, LOAD_SHAPE = 0, 1


class VMError(ExecutorError):
    """An error raised by a VM builtin or the interpreter (the message says what and where)."""


def _ctx(err_ctx: Any) -> str:
    return (err_ctx or "").strip() if isinstance(err_ctx, str) else ""


def _fail(err_ctx: Any, message: str, kind: str = "ValueError"):
    ctx = _ctx(err_ctx)
    raise VMError(f"{kind}: {ctx + ': ' if ctx else ''}{message}")


def _shape_of(value: Any, err_ctx: Any = None) -> tuple:
    if isinstance(value, Tensor):
        return value.array.shape
    if isinstance(value, ShapeTuple):
        return tuple(value)
    _fail(err_ctx, f"expected a tensor or shape, got {_kind(value)}", "TypeError")


def _kind(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor {value.array.dtype}{list(value.array.shape)}"
    if isinstance(value, list):
        return f"a tuple of {len(value)}"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"


def _same_dtype(a: DataType, b: DataType) -> bool:
    """Equal dtypes; booleans match in both spellings (tvm-ffi's bool8, TVM <= 0.20's uint1)."""
    return a == b or (a.is_bool and b.is_bool)


def _heap(heap: Any) -> np.ndarray | None:
    return heap.array if isinstance(heap, Tensor) else None


def alloc_shape_heap(vm, size: int) -> Tensor:
    return Tensor(aligned_empty(8 * max(int(size), 1)).view(np.int64)[:int(size)])


def match_prim_value(value: int, heap: Any, code: int, reg: int, err_ctx: Any = None) -> None:
    data = _heap(heap)
    if code == ASSERT_EQ_IMM:
        if value != reg:
            _fail(err_ctx, f"match_cast error: value {value} is not the expected constant {reg}", "RuntimeError")
    elif code == STORE_TO_HEAP:
        data[reg] = value
    elif code == ASSERT_EQ_LOAD:
        if value != data[reg]:
            _fail(err_ctx, f"match_cast error: value {value} differs from the one seen before ({data[reg]})",
                  "RuntimeError")
    elif code != NO_OP:
        raise VMError(f"match_prim_value: unknown match code {code}")


def match_shape(value: Any, heap: Any, size: int, *rest: Any) -> None:
    if len(rest) < 2 * size:
        raise VMError(f"match_shape: {size} dimensions need {2 * size} code/value arguments, got {len(rest)}")
    err_ctx = rest[2 * size] if len(rest) > 2 * size else None
    shape = _shape_of(value, err_ctx)
    if len(shape) != size:
        _fail(err_ctx, f"expected {size} dimensions, got shape {list(shape)}", "RuntimeError")
    data = _heap(heap)
    for i in range(size):
        code, reg = rest[2 * i], rest[2 * i + 1]
        if code == ASSERT_EQ_IMM:
            if shape[i] != reg:
                _fail(err_ctx, f"shape {list(shape)}: dimension {i} is {shape[i]}, expected {reg}", "RuntimeError")
        elif code == STORE_TO_HEAP:
            data[reg] = shape[i]
        elif code == ASSERT_EQ_LOAD:
            if shape[i] != data[reg]:
                _fail(err_ctx, f"shape {list(shape)}: dimension {i} is {shape[i]}, expected {int(data[reg])} "
                               f"(as seen before)", "RuntimeError")
        elif code != NO_OP:
            raise VMError(f"match_shape: unknown match code {code}")


def make_prim_value(heap: Any, code: int, reg: int) -> int:
    if code == USE_IMM:
        return reg
    if code == LOAD_SHAPE:
        return int(_heap(heap)[reg])
    raise VMError(f"make_prim_value: unknown shape code {code}")


def make_shape(heap: Any, size: int, *rest: Any) -> ShapeTuple:
    data = _heap(heap)
    dims = []
    for i in range(size):
        code, reg = rest[2 * i], rest[2 * i + 1]
        if code == USE_IMM:
            dims.append(reg)
        elif code == LOAD_SHAPE:
            dims.append(int(data[reg]))
        else:
            raise VMError(f"make_shape: unknown shape code {code}")
    return ShapeTuple(dims)


def check_tensor_info(value: Any, ndim: int, *rest: Any) -> None:
    dtype, err_ctx = (None, rest[0]) if len(rest) == 1 else (rest[0], rest[1])
    if not isinstance(value, Tensor):
        _fail(err_ctx, f"expected a tensor, got {_kind(value)}", "TypeError")
    if ndim != -1 and value.array.ndim != ndim:
        _fail(err_ctx, f"expected a tensor of {ndim} dimensions, got shape {list(value.array.shape)}")
    if dtype is not None and not _same_dtype(dtype_of(value), dtype):
        _fail(err_ctx, f"expected a tensor of dtype {dtype}, got {dtype_of(value)}")


def check_shape_info(value: Any, ndim: int, err_ctx: Any = None) -> None:
    if not isinstance(value, ShapeTuple):
        _fail(err_ctx, f"expected a shape, got {_kind(value)}", "TypeError")
    if ndim != -1 and len(value) != ndim:
        _fail(err_ctx, f"expected a shape of {ndim} dimensions, got {list(value)}")


def check_prim_value_info(value: Any, dtype: DataType, err_ctx: Any = None) -> None:
    if isinstance(value, (Tensor, list, ShapeTuple, str)) or value is None:
        _fail(err_ctx, f"expected a {dtype} value, got {_kind(value)}", "TypeError")
    want_float = dtype.code == 2
    if not want_float and isinstance(value, float):
        _fail(err_ctx, f"expected a {dtype} value, got a float", "TypeError")


def check_tuple_info(value: Any, size: int, err_ctx: Any = None) -> None:
    if not isinstance(value, list):
        _fail(err_ctx, f"expected a tuple, got {_kind(value)}", "TypeError")
    if len(value) != size:
        _fail(err_ctx, f"expected a tuple of {size} elements, got {len(value)}")


def check_func_info(value: Any, err_ctx: Any = None) -> None:
    if not callable(value) and not isinstance(value, Closure):
        _fail(err_ctx, f"expected a function, got {_kind(value)}", "TypeError")


def alloc_storage(vm, shape: ShapeTuple, device_index: int, dtype_hint: DataType, scope: str = "global") -> Storage:
    if scope not in ("global", ""):
        raise VMError(f"alloc_storage: memory scope {scope!r} is not supported on this board")
    if device_index >= len(vm.devices) or device_index < -1:
        raise VMError(f"alloc_storage: device index {device_index} out of range ({len(vm.devices)} devices)")
    count = 1
    for d in shape:
        count *= int(d)
    return vm.pool.alloc(count * dtype_hint.itemsize)


def alloc_tensor(storage: Storage, offset: int, shape: ShapeTuple, dtype: DataType, scope: str = "global") -> Tensor:
    if not isinstance(storage, Storage):
        raise VMError(f"alloc_tensor: expected a storage, got {_kind(storage)}")
    try:
        return storage.alloc_tensor(int(offset), tuple(shape), dtype)
    except ValueError as exc:
        raise VMError(str(exc)) from None


def make_closure(clo: Closure, *args: Any) -> Closure:
    if not isinstance(clo, Closure):
        raise VMError(f"make_closure: expected a VM function, got {_kind(clo)}")
    return clo.bind(args)


def invoke_closure(vm, clo: Any, *args: Any) -> Any:
    return vm.invoke(clo, args)


def call_tir_dyn(func: Callable, *args: Any) -> Any:
    if not args or not isinstance(args[-1], ShapeTuple):
        raise VMError("call_tir_dyn: the last argument must be a shape")
    return func(*args[:-1], *args[-1])


def shape_of(value: Any) -> ShapeTuple:
    if not isinstance(value, Tensor):
        raise VMError(f"shape_of expects a tensor, got {_kind(value)}")
    return ShapeTuple(value.array.shape)


def reshape(value: Any, shape: ShapeTuple) -> Tensor:
    if not isinstance(value, Tensor):
        raise VMError(f"reshape expects a tensor, got {_kind(value)}")
    if math.prod(shape) != value.array.size:
        raise VMError(f"reshape: cannot view shape {list(value.array.shape)} as {list(shape)}")
    return Tensor(value.array.reshape(tuple(shape)), value.owner if value.owner is not None else value)


def to_device(value: Tensor, dev_type: int, dev_id: int, scope: str = "global") -> Tensor:
    if dev_type not in (1, 12):
        raise VMError(f"to_device: device type {dev_type} is not available on this board")
    return value


def read_if_cond(cond: Any) -> bool:
    if isinstance(cond, (bool, int, np.integer)):
        return bool(cond)
    if isinstance(cond, Tensor) and cond.array.dtype.kind in "iub" and cond.array.size:
        return bool(cond.array.reshape(-1)[0])
    raise VMError(f"read_if_cond: expected an int or a scalar integer tensor, got {_kind(cond)}")


def tuple_getitem(arr: Any, index: int) -> Any:
    if not isinstance(arr, list):
        raise VMError(f"tuple_getitem: expected a tuple, got {_kind(arr)}")
    if not -len(arr) <= index < len(arr):
        raise VMError(f"tuple_getitem: index {index} out of range for a tuple of {len(arr)}")
    return arr[index]


def tuple_reset_item(arr: Any, index: int) -> None:
    if isinstance(arr, list) and 0 <= index < len(arr):
        arr[index] = None


def tensor_to_shape(value: Tensor) -> ShapeTuple:
    if not isinstance(value, Tensor) or value.array.ndim != 1 or value.array.dtype.kind not in "iu":
        raise VMError(f"tensor_to_shape expects a 1-D integer tensor, got {_kind(value)}")
    return ShapeTuple(int(d) for d in value.array)


def ensure_zero_offset(value: Tensor) -> Tensor:
    return value  # every tensor here has its offset folded into its data pointer


def memory_manager_clear(vm=None) -> None:
    if vm is not None:
        vm.pool.clear()


def invoke_debug_func(*args: Any) -> None:
    raise VMError("invoke_debug_func: debug functions (R.print, R.assert_op with a Python callback) "
                  "are not available on this board")


#: name -> implementation; names that take the VM get it through their ``%vm`` argument
BUILTINS: dict[str, Callable[..., Any]] = {
    "vm.builtin.alloc_shape_heap": alloc_shape_heap,
    "vm.builtin.match_prim_value": match_prim_value,
    "vm.builtin.match_shape": match_shape,
    "vm.builtin.make_prim_value": make_prim_value,
    "vm.builtin.make_shape": make_shape,
    "vm.builtin.check_tensor_info": check_tensor_info,
    "vm.builtin.check_shape_info": check_shape_info,
    "vm.builtin.check_prim_value_info": check_prim_value_info,
    "vm.builtin.check_tuple_info": check_tuple_info,
    "vm.builtin.check_func_info": check_func_info,
    "vm.builtin.alloc_storage": alloc_storage,
    "vm.builtin.alloc_tensor": alloc_tensor,
    "vm.builtin.make_closure": make_closure,
    "vm.builtin.invoke_closure": invoke_closure,
    "vm.builtin.call_tir_dyn": call_tir_dyn,
    "vm.builtin.shape_of": shape_of,
    "vm.builtin.copy": lambda value: value,
    "vm.builtin.reshape": reshape,
    "vm.builtin.null_value": lambda: None,
    "vm.builtin.to_device": to_device,
    "vm.builtin.read_if_cond": read_if_cond,
    "vm.builtin.invoke_debug_func": invoke_debug_func,
    "vm.builtin.tuple_getitem": tuple_getitem,
    "vm.builtin.tuple_reset_item": tuple_reset_item,
    "vm.builtin.make_tuple": lambda *items: list(items),
    "vm.builtin.tensor_to_shape": tensor_to_shape,
    "vm.builtin.ensure_zero_offset": ensure_zero_offset,
    "vm.builtin.memory_manager.clear": memory_manager_clear,
}


def is_builtin_name(name: str) -> bool:
    """Whether ``name`` is in TVM's builtin namespaces (so it cannot be a kernel of the library)."""
    return name.startswith(("vm.builtin.", "vm.", "relax.", "runtime."))
