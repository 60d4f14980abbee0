"""Numbers of TVM's RPC protocol: magics, RPC codes and the two dialects' type numbering.

Facts from TVM's source (see ../shared/TVM_SOURCES.md): ``python/tvm/rpc/base.py`` (magics, tracker
codes), ``src/runtime/minrpc/rpc_reference.h`` (RPC codes; classic type codes at v0.19.0, tvm-ffi
type indices at HEAD), ``include/tvm/ffi/c_api.h`` in apache/tvm-ffi (type indices).
"""

from __future__ import annotations

import enum

RPC_MAGIC = 0xFF271
RPC_TRACKER_MAGIC = 0x2F271
RPC_CODE_SUCCESS = RPC_MAGIC + 0
RPC_CODE_DUPLICATE = RPC_MAGIC + 1
RPC_CODE_MISMATCH = RPC_MAGIC + 2

#: version string exchanged in kInitServer; unchanged from TVM 0.7 to tvm-ffi
PROTOCOL_VERSION = "0.8.0"
#: device types on the client side carry (session index + 1) * RPC_SESS_MASK; never on the wire
RPC_SESS_MASK = 128


class RPCCode(enum.IntEnum):
    """The first int32 of every packet."""

    NONE = 0
    SHUTDOWN = 1
    INIT_SERVER = 2
    CALL_FUNC = 3
    RETURN = 4
    EXCEPTION = 5
    COPY_FROM_REMOTE = 6
    COPY_TO_REMOTE = 7
    COPY_ACK = 8
    # syscalls
    GET_GLOBAL_FUNC = 9
    FREE_HANDLE = 10
    DEV_SET_DEVICE = 11
    DEV_GET_ATTR = 12
    DEV_ALLOC_DATA = 13
    DEV_FREE_DATA = 14
    DEV_STREAM_SYNC = 15
    COPY_AMONG_REMOTE = 16
    DEV_ALLOC_DATA_WITH_SCOPE = 17
    DEV_CREATE_STREAM = 18
    DEV_FREE_STREAM = 19
    DEV_SET_STREAM = 20
    DEV_GET_CURRENT_STREAM = 21


SYSCALL_START = RPCCode.GET_GLOBAL_FUNC


class TypeCode(enum.IntEnum):
    """Classic dialect (TVM 0.7-0.20): ``TVMArgTypeCode``; a code array precedes the values."""

    INT = 0
    UINT = 1
    FLOAT = 2
    OPAQUE_HANDLE = 3
    NULLPTR = 4
    DATA_TYPE = 5
    DEVICE = 6
    DLTENSOR_HANDLE = 7
    OBJECT_HANDLE = 8
    MODULE_HANDLE = 9
    PACKED_FUNC_HANDLE = 10
    STR = 11
    BYTES = 12
    NDARRAY_HANDLE = 13
    OBJECT_RVALUE_REF = 14
    BOOL = 15


#: classic: object values are RPC object references with this type index
CLASSIC_RPC_OBJECT_REF = 9


class TypeIndex(enum.IntEnum):
    """tvm-ffi dialect (TVM >= 0.21): ``TVMFFITypeIndex``; each value is preceded by its index."""

    NONE = 0
    INT = 1
    BOOL = 2
    FLOAT = 3
    OPAQUE_PTR = 4
    DATA_TYPE = 5
    DEVICE = 6
    DLTENSOR_PTR = 7
    RAW_STR = 8
    BYTE_ARRAY_PTR = 9
    OBJECT_RVALUE_REF = 10
    SMALL_STR = 11
    SMALL_BYTES = 12
    STATIC_OBJECT_BEGIN = 64
    OBJECT = 64
    STR = 65
    BYTES = 66
    ERROR = 67
    FUNCTION = 68
    SHAPE = 69
    TENSOR = 70
    ARRAY = 71
    MAP = 72
    MODULE = 73
    DYN_OBJECT_BEGIN = 128


#: tvm-ffi: remote object references (``kTVMFFIDynObjectBegin - 13`` in rpc_session.h)
FFI_RPC_OBJECT_REF = TypeIndex.DYN_OBJECT_BEGIN - 13


class DeviceAttrKind(enum.IntEnum):
    """``DeviceAttrKind`` (``include/tvm/runtime/device_api.h``) as asked by kDevGetAttr."""

    EXIST = 0
    MAX_THREADS_PER_BLOCK = 1
    WARP_SIZE = 2
    MAX_SHARED_MEMORY_PER_BLOCK = 3
    COMPUTE_VERSION = 4
    DEVICE_NAME = 5
    MAX_CLOCK_RATE = 6
    MULTI_PROCESSOR_COUNT = 7
    MAX_THREAD_DIMENSIONS = 8
    MAX_REGISTERS_PER_BLOCK = 9
    GCN_ARCH = 10
    API_VERSION = 11
    DRIVER_VERSION = 12
    L2_CACHE_SIZE_BYTES = 13
    TOTAL_GLOBAL_MEMORY = 14
    AVAILABLE_GLOBAL_MEMORY = 15
    IMAGE_PITCH_ALIGNMENT = 16


class Dialect(enum.Enum):
    """Which packed-argument encoding the peer speaks."""

    CLASSIC = "classic"
    FFI = "ffi"

    # members are singletons compared by identity: hash them the C way (Enum's own __hash__ is Python
    # code, and dialect-keyed tables are looked up for every packet)
    __hash__ = object.__hash__
