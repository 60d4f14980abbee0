"""Replay the recorded classic client (``debug-executor.jsonl``: ``tvm.graph_executor.create`` + the
debug executor with a dump root) against rpcsrv: every answer must match TVM v0.19's server up to
handle values and timings, including the per-node outputs the client copies back for its dump files."""

from __future__ import annotations

import struct

import numpy as np

from conftest import need_shared
from debug_helpers import seed_library
from rpcsrv.protocol import Connection, Dialect, Role
from test_replay import replay


def _check_run_individual(recorded: bytes, ours: bytes) -> None:
    """run_individual: int64 node count, then seconds per node; input nodes take 0, the op > 0."""
    assert len(recorded) == len(ours)
    (count,) = struct.unpack_from("<q", recorded)
    assert struct.unpack_from("<q", ours) == (count,) == (5,)
    rec, got = np.frombuffer(recorded[8:]), np.frombuffer(ours[8:])
    assert (rec[:4] == 0).all() and (got[:4] == 0).all()
    assert rec[4] > 0 and 0 < got[4] < 0.1


async def test_replay_classic_debug_executor_session(tmp_path):
    so = seed_library(tmp_path / "ej_seed_full.so")
    writer = Connection(Role.CLIENT, strict=False, dialect=Dialect.CLASSIC)
    seen = []

    def upload(head: bytes) -> bytes:
        (handle,) = struct.unpack_from("<Q", head, 12)
        return b"".join(bytes(p) for p in writer.send_call(handle, ["ej_seed_full.so", so.read_bytes()]))

    def timings(recorded: bytes, ours: bytes) -> None:
        _check_run_individual(recorded, ours)
        seen.append(len(ours))

    compared = await replay(need_shared("classic-sessions", "debug-executor.jsonl"), Dialect.CLASSIC, True,
                            elided=upload, timings=timings)
    assert compared >= 190
    assert seen == [48]  # run_individual was answered once and checked
