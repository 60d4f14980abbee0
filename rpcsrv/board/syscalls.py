"""The session's syscalls (``rpc_endpoint.cc``'s EventHandler, ``rpc_device_api.cc``): global
function lookup, handle freeing, the host device API (alloc, free, attributes, streams) and tensor
copies.  Mixed into :class:`rpcsrv.board.session.Session`, whose handle table, memory account and views
these use; every failure is an :class:`~rpcsrv.board.accounts.RPCUserError` the session answers.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from .accounts import RPCUserError
from .handles import NDArrayRef, PackedFunction
from ..protocol import (CopyFromRemote, CopyToRemote, Device, DeviceAttrKind, Handle, OpaqueHandle, RPCCode,
                       Syscall, TensorHeader)
from ..protocol.dtypes import HOST_DEVICE_TYPES


class SyscallsMixin:
    def _global(self, name: str) -> int:
        """Handle of global function ``name`` (0: none).  Like TVM, asking twice gives the same
        handle, counted: it stays valid until freed as many times as it was handed out."""
        handle = self.globals.get(name)
        if handle is not None:
            self.handles.share(handle)
            return handle
        fn = self.registry.get(name, self)
        if fn is None:
            return 0
        handle = self.put_object(fn)
        self.globals[name] = handle
        return handle

    def _syscall(self, ev: Syscall) -> Any:
        a = ev.args
        code = ev.code
        if code == RPCCode.GET_GLOBAL_FUNC:
            return OpaqueHandle(self._global(_arg(a, 0, str, "function name")))
        if code == RPCCode.FREE_HANDLE:
            obj = self.handles.free_object(_arg(a, 0, Handle, "handle").value)
            if isinstance(obj, PackedFunction) and self.globals.get(obj.name) == a[0].value:
                del self.globals[obj.name]
            if isinstance(obj, NDArrayRef) and obj.data_handle in self.handles.buffers:
                self.handles.free_buffer(obj.data_handle)
            return None
        if code in (RPCCode.DEV_SET_DEVICE, RPCCode.DEV_STREAM_SYNC, RPCCode.DEV_FREE_STREAM,
                    RPCCode.DEV_SET_STREAM):
            self._device(a)
            return None
        if code in (RPCCode.DEV_CREATE_STREAM, RPCCode.DEV_GET_CURRENT_STREAM):
            self._device(a)
            return OpaqueHandle(0)  # host devices have no streams: TVM's CPU API returns null too
        if code == RPCCode.DEV_GET_ATTR:
            return self._dev_attr(_arg(a, 0, Device, "device"), _arg(a, 1, int, "attribute kind"))
        if code == RPCCode.DEV_ALLOC_DATA:
            self._device(a)
            return OpaqueHandle(self.alloc(_arg(a, 1, int, "nbytes")))
        if code == RPCCode.DEV_ALLOC_DATA_WITH_SCOPE:
            t = _arg(a, 0, TensorHeader, "tensor")
            scope = a[1] if len(a) > 1 else None
            if scope not in (None, "global"):
                raise RPCUserError(f"memory scope {scope!r} is not supported on this board")
            self._device([t.device])
            return OpaqueHandle(self.alloc(t.nbytes))
        if code == RPCCode.DEV_FREE_DATA:
            self._device(a)
            self.free(_arg(a, 1, Handle, "data pointer").value)
            return None
        if code == RPCCode.COPY_AMONG_REMOTE:
            src = self.tensor_view(_arg(a, 0, TensorHeader, "source tensor"))
            dst = self.tensor_view(_arg(a, 1, TensorHeader, "target tensor"))
            if src.nbytes != dst.nbytes:
                raise RPCUserError(f"copy between tensors of {src.nbytes} and {dst.nbytes} bytes")
            dst.reshape(-1).view(np.uint8)[:] = src.reshape(-1).view(np.uint8)
            return None
        raise RPCUserError(f"syscall {code.name} is not supported")

    def _device(self, args: list) -> Device:
        dev = _arg(args, 0, Device, "device")
        if dev.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {dev} is not available on this board (cpu and ext_dev only)")
        return dev

    def _dev_attr(self, dev: Device, kind: int) -> Any:
        exists = dev.device_type in HOST_DEVICE_TYPES
        if kind == DeviceAttrKind.EXIST:
            return int(exists)
        if not exists:
            raise RPCUserError(f"device {dev} is not available on this board")
        if kind in (DeviceAttrKind.TOTAL_GLOBAL_MEMORY, DeviceAttrKind.AVAILABLE_GLOBAL_MEMORY):
            try:
                return os.sysconf("SC_PAGE_SIZE") * os.sysconf(
                    "SC_PHYS_PAGES" if kind == DeviceAttrKind.TOTAL_GLOBAL_MEMORY else "SC_AVPHYS_PAGES")
            except (ValueError, OSError):
                return None
        if kind == DeviceAttrKind.DEVICE_NAME:
            return "rpcsrv-cpu"
        return None  # TVM's CPU device API leaves other attributes unset

    def copy_target(self, ev) -> tuple[Optional[memoryview], str]:
        """Where a streamed kCopyToRemote body goes (or None and the reason to refuse it)."""
        try:
            return memoryview(self._copy_target(ev.tensor, ev.nbytes)), ""
        except RPCUserError as exc:
            return None, str(exc)

    def _copy_to(self, ev: CopyToRemote) -> None:
        if ev.in_place:
            return  # already received into the buffer named by copy_target
        dst = self._copy_target(ev.tensor, ev.nbytes)
        dst[:] = np.frombuffer(ev.data, dtype=np.uint8)

    def _copy_from(self, ev: CopyFromRemote) -> memoryview:
        return memoryview(self._copy_target(ev.tensor, ev.nbytes))

    def _copy_target(self, t: TensorHeader, nbytes: int) -> np.ndarray:
        if t.device.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {t.device} is not available on this board")
        buf = self.handles.get_buffer(t.data, "copy")
        if t.byte_offset + nbytes > buf.nbytes:
            raise RPCUserError(f"copy of {nbytes} bytes at offset {t.byte_offset} exceeds the "
                               f"{buf.nbytes}-byte buffer")
        return buf[t.byte_offset:t.byte_offset + nbytes]


def _arg(args: list, i: int, kind, what: str):
    if i >= len(args):
        raise RPCUserError(f"missing argument {i} ({what})")
    v = args[i]
    if kind is int and isinstance(v, bool):
        return int(v)
    if not isinstance(v, kind):
        raise RPCUserError(f"argument {i} ({what}) must be {getattr(kind, '__name__', kind)}, "
                           f"got {type(v).__name__}")
    return v
