"""How a function's return value travels back (``LocalSession::EncodeReturn``): the kinds table's
return codes (:mod:`rpcsrv.protocol.kinds`) in the connection's dialect.  Syscall answers carry
just the value (``[value]``)."""

from __future__ import annotations

from typing import Any

from .codes import Dialect
from .kinds import TABLES
from .values import RemoteTensor

__all__ = ["RemoteTensor", "pack_return", "unpack_return"]


def pack_return(value: Any, dialect: Dialect) -> list:
    """The packed sequence a server sends for return value ``value``."""
    return TABLES[dialect].pack_return(value)


def unpack_return(values: list, dialect: Dialect) -> Any:
    """The client side of :func:`pack_return`: rebuild the returned value."""
    return TABLES[dialect].unpack_return(values)
