"""TVM's RPC wire protocol, sans-IO: both dialects (classic type codes, tvm-ffi type indices)."""

from .codec import ProtocolError, Reader, Writer, decode_packed_seq, detect_dialect, encode_packed_seq
from .codes import (PROTOCOL_VERSION, RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, RPC_SESS_MASK,
                    RPC_TRACKER_MAGIC, DeviceAttrKind, Dialect, RPCCode, TypeCode, TypeIndex)
from .connection import Connection, decode_values, encode_values
from .states import LocalProtocolError, Role, State
from .events import (NEED_DATA, BadPacket, CallFunc, CallFuncChunk, CallFuncEnd, CallFuncStart,
                     ConnectionClosed, CopyAck, CopyFromRemote,
                     CopyToRemote, CopyToRemoteStart, Event, HandshakeDone, HandshakeRefused,
                     HandshakeRequest, InitServer, RemoteError, Return, Shutdown, Syscall)
from .dtypes import DataType, Device, DLDataTypeCode, DLDeviceType
from .kinds import DEFAULT_DIALECT, KINDS, DialectTable, Kind, wire_dialect
from .returns import pack_return, unpack_return
from .values import FunctionHandle, Handle, ModuleHandle, ObjectHandle, OpaqueHandle, RemoteTensor, TensorHeader
