"""What one client, and all clients together, may make the server hold: the limits and why.

Every limit is a ``rpcsrv serve`` flag; the defaults (and their reasons, repeated in the README):

* ``max_memory`` 4 GiB per session: device arrays, returned arrays, executor storage, workspace
  files, handle entries and the native worker with what it holds, together (see
  :mod:`rpcsrv.board.accounts`); a ResNet-50 session needs ~0.3 GiB.
* ``max_total_memory``: half of physical memory for all sessions together, so the system, the server
  itself and the page cache keep the rest; 16 sessions of 4 GiB on a 2 GiB board are refused.
* ``max_workspace`` 4 GiB per session: files in the session's workspace (also charged to memory).
* ``max_connections`` 512 sockets: each costs a task and a few KiB; far under the usual limit of 1024
  open files, so the server never fails to accept for want of descriptors.
* ``max_sessions`` 128 handshaken clients: each may hold its memory budget (all within the total); a lab
  board has a handful of users, a tuner one session per measurement worker.
* ``max_handles`` 65,536 per session: TVM clients free handles as their objects die, so real programs
  stay in the hundreds; each entry is charged ``HANDLE_COST`` bytes too.
* ``max_packet`` 4 GiB: the largest single message (a whole tensor copy or upload; TVM sends a tensor
  in one packet); bodies grow as their bytes arrive, so a large claim alone costs nothing.
* ``max_ndim`` 32 dimensions for a DLTensor on the wire: real models stay under 8; numpy 1 stops at 32.
* ``idle_timeout`` 900 s without a byte either way (mid-packet or between requests) ends a connection:
  longer than a tuner's compile between measurements, short enough that dead peers go away.
* ``max_threads`` 16 worker threads for all sessions (inference, file writes): more only thrashes a
  small board's cores and memory bandwidth; waiting calls queue fairly (trio's CapacityLimiter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .accounts import default_total_memory
from ..protocol.codec import MAX_NDIM
from ..protocol.connection import DEFAULT_MAX_PACKET


@dataclass(frozen=True)
class Limits:
    max_memory: int = 4 << 30
    max_workspace: int = 4 << 30
    max_total_memory: int = field(default_factory=default_total_memory)
    max_connections: int = 512
    max_sessions: int = 128
    max_handles: int = 1 << 16
    max_packet: int = DEFAULT_MAX_PACKET
    max_ndim: int = MAX_NDIM
    idle_timeout: float = 900.0
    max_threads: int = 16
