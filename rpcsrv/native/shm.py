"""Shared memory arenas: memory that the session and its native worker both map.

An :class:`Arena` is one ``memfd`` (Linux; sparse, so only touched pages cost memory) mapped
read-write, with a first-fit allocator over it.  Blocks are 64-byte aligned; freeing a block of a
page or more gives its pages back (``MADV_REMOVE``), so they read as zeros when reused; smaller
blocks are zeroed when handed out again.  The session allocates its device buffers here when its
native code is isolated; the worker allocates its executors' storage in its own arena; each side
maps the other's (the descriptor crosses once, when the worker starts), so an array crosses as
``(region, offset, dtype, shape, strides)``.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
from typing import Optional

import numpy as np

ALIGN = 64
PAGE = mmap.PAGESIZE


def seal(fd: int) -> None:
    """Fix the arena's size for good: the other process (native code in a worker) cannot shrink it under
    the server's mapping, where a read past the end would kill the server with SIGBUS."""
    import fcntl

    seals = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)
    if seals and hasattr(fcntl, "F_ADD_SEALS"):
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


def _check_sealed(fd: int, capacity: int) -> None:
    """An arena from the other process: as large as it says, and sealed against shrinking."""
    import fcntl

    if os.fstat(fd).st_size < capacity:
        raise ValueError(f"the shared arena is smaller than its announced {capacity} bytes")
    if hasattr(fcntl, "F_GET_SEALS") and not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
        raise ValueError("the shared arena is not sealed against shrinking")


def address_of(arr: np.ndarray) -> int:
    """Where ``arr``'s memory starts: through ctypes for a writable contiguous array (~0.6 us; numpy's
    ``__array_interface__`` builds a dict each time, ~3 us, and a call reads it for every argument),
    else numpy's way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError, BufferError):  # read-only, not contiguous, empty
        return arr.__array_interface__["data"][0]


class Arena:
    def __init__(self, capacity: int, fd: Optional[int] = None, name: str = "rpcsrv-arena"):
        self.capacity = capacity
        if fd is None:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
            os.ftruncate(fd, capacity)
            seal(fd)
        else:
            _check_sealed(fd, capacity)
        self.fd = fd
        self.map = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = np.frombuffer(self.map, np.uint8)
        self.address = self.base.ctypes.data
        self._free: list[tuple[int, int]] = [(0, capacity)]  # sorted (offset, size)
        self._sizes: dict[int, int] = {}
        self.used = 0  # bytes of the blocks handed out (and not released)
        self._lock = threading.Lock()

    def zeros(self, nbytes: int) -> np.ndarray:
        """A zero-filled block of ``nbytes`` (MemoryError when the arena is full)."""
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for i, (off, room) in enumerate(self._free):
                if room >= size:
                    break
            else:
                raise MemoryError(f"shared arena full ({self.capacity} bytes)")
            if room == size:
                del self._free[i]
            else:
                self._free[i] = (off + size, room - size)
            self._sizes[off] = size
            self.used += size
        block = self.base[off:off + nbytes]
        if size < PAGE:
            block.fill(0)
        return block

    def offset_of(self, arr: np.ndarray) -> Optional[int]:
        """Where ``arr``'s memory starts in this arena, or None when it is not inside."""
        start = address_of(arr) - self.address
        if not 0 <= start < self.capacity:
            return None
        if arr.flags.c_contiguous:
            span = arr.nbytes
        else:
            span = sum((d - 1) * s for d, s in zip(arr.shape, arr.strides) if s > 0) + arr.itemsize if arr.size else 0
        return start if start + span <= self.capacity else None

    def release(self, arr: np.ndarray) -> None:
        off = self.offset_of(arr)
        with self._lock:
            size = self._sizes.pop(off, None) if off is not None else None
            if size is None:
                return
            self.used -= size
            if size >= PAGE:  # hand the whole pages back: they read as zeros when reused
                lo, hi = -(-off // PAGE) * PAGE, (off + size) // PAGE * PAGE
                if hi > lo:
                    self.map.madvise(mmap.MADV_REMOVE, lo, hi - lo)
                if off < lo:
                    self.base[off:lo] = 0
                if off + size > hi >= lo:
                    self.base[hi:off + size] = 0
            i = bisect.bisect(self._free, (off, 0))
            self._free.insert(i, (off, size))
            if i + 1 < len(self._free) and off + size == self._free[i + 1][0]:  # merge with the next
                self._free[i] = (off, size + self._free.pop(i + 1)[1])
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:  # and the previous
                prev = self._free.pop(i - 1)
                self._free[i - 1] = (prev[0], prev[1] + self._free[i - 1][1])

    def view(self, offset: int, dtype: str, shape: tuple, strides: tuple) -> np.ndarray:
        """The array at ``offset`` (bounds checked)."""
        dt = np.dtype(dtype)
        span = (sum((d - 1) * s for d, s in zip(shape, strides)) + dt.itemsize) if all(shape) else 0
        if offset < 0 or offset + span > self.capacity or any(s < 0 for s in strides):
            raise ValueError(f"shared array at {offset} (+{span} bytes) is outside the arena")
        return np.ndarray(shape, dt, buffer=self.map, offset=offset, strides=strides)

    def close(self) -> None:
        """Close the arena's descriptor, once: a second close could hit a descriptor the number was given
        to since (another session's socket or arena)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            os.close(fd)
        except OSError:
            pass
