"""Replay the recorded classic TVM kernel session (tests/data/classic-sessions/host-kernel.jsonl).

Our own classic-ABI ``add_one.so`` (``fixtures/c_target_kernels.c`` built by gcc, a plain host
library without blob, following TVM's C-target conventions) is uploaded in place of the elided
TVM-built one; every later answer must match TVM's server up to handle values, the copied-back
result of ``add_one`` included (timings only by length).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from conftest import need_shared
from native_helpers import build_c
from rpcsrv.protocol import Connection, Dialect, Role

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from test_replay import replay  # noqa: E402


async def test_replay_classic_host_kernel_session(tmp_path):
    so = build_c("c_target_kernels", tmp_path)
    writer = Connection(Role.CLIENT, dialect=Dialect.CLASSIC, strict=False)  # a codec: re-encodes recorded packets

    def upload(head: bytes) -> bytes:
        (handle,) = struct.unpack_from("<Q", head, 12)
        return b"".join(bytes(p) for p in writer.send_call(handle, ["add_one.so", so.read_bytes()]))

    compared = await replay(need_shared("classic-sessions", "host-kernel.jsonl"), Dialect.CLASSIC, True,
                            elided=upload, timing=lambda ev, values: True)
    assert compared >= 20
