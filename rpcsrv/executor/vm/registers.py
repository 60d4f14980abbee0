"""The values a Relax VM register holds, and the pooled storage tensors live in.

* ``Tensor``: a numpy array plus, made on first use, the DLTensor native kernels receive (its
  address stays valid as long as the Tensor lives).  ``owner`` keeps the storage it was cut from
  alive, as TVM's tensors keep their ``Storage``.
* ``Storage``: one buffer of a ``StoragePool``; when the last reference goes, the buffer goes back
  to the pool (TVM's pooled allocator), so the next run of a function gets the same buffers at the
  same addresses, and the DLTensors cut from them are reused too.
* ``ShapeTuple`` (from the loader) is ``ffi::Shape``; a Python ``list`` is an ``ffi::Array``
  (tuples of Relax; a list, so that ``tuple_reset_item`` can clear a field); ``Closure`` is a VM
  function with bound trailing arguments; ``None`` is null; ``int``/``float``/``bool`` are
  prim values; ``DataType`` a DLDataType; ``str`` a string.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import threading
from typing import Any, Callable

import numpy as np

from ...loader.vm_executable import ShapeTuple
from ...protocol.dtypes import DataType
from ..memory import before_allocation
from .ffi import DLTensor, make_dltensor

#: TVM's allocation alignment (kAllocAlignment): compiled kernels may assume it
ALIGNMENT = 64
#: the pooled allocator rounds sizes up to pages, as TVM's does
PAGE = 4096

__all__ = ["ALIGNMENT", "Closure", "ShapeTuple", "Storage", "StoragePool", "Tensor", "aligned_empty",
           "as_tensor", "dtype_of"]


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data starts on an ``ALIGNMENT`` boundary."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGNMENT
    return raw[skip:skip + nbytes]


def page_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` (a multiple of ``PAGE``) in its own anonymous mapping: page
    aligned, outside the malloc heap (pooled buffers live long; transient arrays would fragment the
    heap around them), returned to the system when the array goes."""
    return np.frombuffer(mmap.mmap(-1, max(nbytes, PAGE)), dtype=np.uint8)[:nbytes]


class Tensor:
    """A VM tensor: ``array`` (numpy, C-contiguous) and its DLTensor for native calls.

    ``dla`` is the DLTensor's address (0 until ``make_dl`` builds it on first native use); ``_dl``
    keeps the DLTensor alive as long as the tensor."""

    __slots__ = ("array", "_dl", "dla", "owner", "__weakref__")

    def __init__(self, array: np.ndarray, owner: Any = None, dl: Any = None):
        self.array = array
        self.owner = owner
        self._dl = dl
        self.dla = ctypes.addressof(dl) if dl is not None else 0

    def make_dl(self) -> int:
        """Address of this tensor's DLTensor (built once)."""
        if not self.dla:
            self._dl = make_dltensor(self.array)
            self.dla = ctypes.addressof(self._dl)
        return self.dla

    @property
    def shape(self) -> tuple:
        return self.array.shape

    def __repr__(self) -> str:
        return f"Tensor({self.array.dtype}{list(self.array.shape)})"


def as_tensor(value: Any) -> Any:
    """An argument from outside the VM as a register value: arrays become Tensors (copied to an
    aligned buffer when their data is not ``ALIGNMENT``-aligned or not contiguous), lists recurse."""
    if isinstance(value, np.ndarray):
        arr = value
        if not arr.flags.c_contiguous or arr.ctypes.data % ALIGNMENT:
            copy = aligned_empty(arr.nbytes).view(arr.dtype).reshape(arr.shape)
            copy[...] = arr
            arr = copy
        return Tensor(arr)
    if isinstance(value, (list, tuple)) and not isinstance(value, ShapeTuple):
        return [as_tensor(v) for v in value]
    return value


class InputStaging:
    """Aligned buffers for arguments that arrive unaligned (or not contiguous), one per argument
    position, shape and dtype, reused call after call (no allocation, and the DLTensor is built
    once).  A staged tensor handed back out of the VM (a function returning its argument) takes its
    buffer with it (``escape``)."""

    def __init__(self):
        self.buffers: dict[tuple, Tensor] = {}

    def stage(self, position: int, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return as_tensor(value)
        if value.flags.c_contiguous and not value.ctypes.data % ALIGNMENT:
            return Tensor(value)
        key = (position, value.shape, value.dtype.str)
        t = self.buffers.get(key)
        if t is None:
            arr = aligned_empty(value.nbytes).view(value.dtype).reshape(value.shape)
            t = self.buffers[key] = Tensor(arr, _Staged(self, key))
            t.make_dl()
        np.copyto(t.array, value)
        return t


class _Staged:
    __slots__ = ("staging", "key")

    def __init__(self, staging: InputStaging, key: tuple):
        self.staging, self.key = staging, key

    def escape(self) -> None:
        self.staging.buffers.pop(self.key, None)


def dtype_of(t: Tensor) -> DataType:
    return DataType.from_numpy(t.array.dtype)


class Storage:
    """One pooled buffer (``vm.builtin.alloc_storage``); tensors are views at byte offsets."""

    __slots__ = ("pool", "block", "__weakref__")

    def __init__(self, pool: "StoragePool", block: "_Block"):
        self.pool = pool
        self.block = block

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    def alloc_tensor(self, offset: int, shape: tuple, dtype: DataType) -> Tensor:
        """The tensor of ``shape`` and ``dtype`` at byte ``offset`` (TVM's ``AllocTensor``)."""
        key = (offset, shape, dtype)
        cached = self.block.views.get(key)
        if cached is not None:
            t = Tensor.__new__(Tensor)
            t.array, t._dl, t.dla, t.owner = cached[0], cached[1], cached[2], self
            return t
        npdt = dtype.numpy()
        count = 1
        for d in shape:
            if d < 0:
                raise ValueError(f"alloc_tensor: negative dimension in shape {list(shape)}")
            count *= d
        nbytes = count * npdt.itemsize
        if offset < 0 or offset + nbytes > self.block.nbytes:
            raise ValueError(f"alloc_tensor: {nbytes} bytes at offset {offset} do not fit in a storage of "
                             f"{self.block.nbytes} bytes")
        arr = self.block.data[offset:offset + nbytes].view(npdt).reshape(shape)
        dl = make_dltensor(arr)
        if len(self.block.views) < 64:
            self.block.views[key] = (arr, dl, ctypes.addressof(dl))
        return Tensor(arr, self, dl)

    def escape(self) -> None:
        """The buffer is handed out of the VM: never give it back to the pool."""
        self.block.escaped = True

    def __del__(self):
        try:
            self.pool.release(self.block)
        except Exception:  # interpreter shutdown
            pass


class _Block:
    __slots__ = ("data", "nbytes", "views", "escaped")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.data = page_empty(nbytes)
        self.views: dict[tuple, tuple[np.ndarray, DLTensor, int]] = {}
        self.escaped = False


class StoragePool:
    """TVM's pooled allocator: freed buffers are kept by page-rounded size and handed out again.

    ``naive=True`` (TVM's naive allocator) drops freed buffers instead.  ``budget`` bounds the
    bytes held (live and pooled); above it the pool is emptied first, then an error is raised.
    """

    def __init__(self, naive: bool = False, budget: int = 4 << 30):
        self.naive = naive
        self.budget = budget
        self.free: dict[int, list[_Block]] = {}
        self.live_bytes = 0
        self.pooled_bytes = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()
        #: blocks given back but not yet accounted: a release may come from a finalizer that the garbage
        #: collector runs inside ``alloc`` on this very thread, which must not wait for the lock it holds
        self._returned: collections.deque = collections.deque()

    def alloc(self, nbytes: int) -> Storage:
        if nbytes < 0:
            raise ValueError(f"alloc_storage: negative size {nbytes}")
        size = max(PAGE, -(-nbytes // PAGE) * PAGE)
        with self._lock:
            self._account_returned_locked()
            blocks = self.free.get(size)
            if blocks:
                block = blocks.pop()
                self.pooled_bytes -= size
            else:
                if self.live_bytes + self.pooled_bytes + size > self.budget:
                    self._clear_locked()
                if self.live_bytes + size > self.budget:
                    raise MemoryError(f"alloc_storage: {size} bytes exceed the VM memory budget "
                                      f"({self.live_bytes} of {self.budget} bytes in use)")
                block = _Block(size)  # a fresh mapping, no page touched yet: charged to the session's
                before_allocation(block.data.base, size, "VM storage")  # budget (or refused) until its last view goes
            self.live_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.live_bytes + self.pooled_bytes)
        return Storage(self, block)

    def release(self, block: _Block) -> None:
        """Give ``block`` back: accounted now when the lock is free, else by the lock's holder or the next
        ``alloc`` (never waits: it may run in a finalizer inside ``alloc``)."""
        self._returned.append(block)
        if self._lock.acquire(blocking=False):
            try:
                self._account_returned_locked()
            finally:
                self._lock.release()

    def _account_returned_locked(self) -> None:
        while self._returned:
            block = self._returned.popleft()
            self.live_bytes -= block.nbytes
            if not (block.escaped or self.naive):
                self.free.setdefault(block.nbytes, []).append(block)
                self.pooled_bytes += block.nbytes

    def clear(self) -> None:
        """Drop every pooled (free) buffer (``vm.builtin.memory_manager.clear``)."""
        with self._lock:
            self._account_returned_locked()
            self._clear_locked()

    def _clear_locked(self) -> None:
        self.free.clear()
        self.pooled_bytes = 0


class Closure:
    """A VM function (``impl(vm, *args)``) with trailing arguments bound (``make_closure``)."""

    __slots__ = ("name", "impl", "bound")

    def __init__(self, name: str, impl: Callable[..., Any], bound: tuple = ()):
        self.name = name
        self.impl = impl
        self.bound = bound

    def bind(self, extra: tuple) -> "Closure":
        return Closure(self.name, self.impl, self.bound + tuple(extra))

    def __repr__(self) -> str:
        return f"Closure({self.name!r}, {len(self.bound)} bound)"


def host_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function of another module (an ExampleJSON subgraph, a classic native function) as the VM
    calls it: tensors go in as numpy arrays over the same memory (destination-passing outputs are
    written in place), a returned array comes back as a tensor."""
    def call(*args: Any) -> Any:
        return as_tensor(fn(*[export_view(a) for a in args]))
    call.__name__ = getattr(fn, "__name__", "function")
    return call


def export_view(value: Any) -> Any:
    """A register value for a function outside the VM, without copying: tensors as their arrays."""
    if isinstance(value, Tensor):
        return value.array
    if isinstance(value, list):
        return [export_view(v) for v in value]
    return value


#: tensors up to this size leave the VM as copies, so their pooled buffer (and the DLTensors cut
#: from it) serve the next run too; larger ones leave as they are and their buffer leaves the pool
COPY_OUT_BYTES = 64 << 10


def export(value: Any) -> Any:
    """A register value as it leaves the VM: tensors become numpy arrays the caller owns (a copy,
    or the tensor itself with its buffer taken out of the pool), tuples become lists of those."""
    if isinstance(value, Tensor):
        owner = value.owner
        while isinstance(owner, Tensor):
            owner = owner.owner
        if owner is None or not hasattr(owner, "escape"):
            return value.array
        if value.array.nbytes <= COPY_OUT_BYTES:
            return value.array.copy()
        owner.escape()
        return value.array
    if isinstance(value, list):
        return [export(v) for v in value]
    if isinstance(value, ShapeTuple):
        return tuple(value)
    return value
