"""StreamedCall: pieces reach the sink in order, each from a copy (the connection reuses its buffer),
and a failing write is kept, aborts the sink and is raised by finish."""

from __future__ import annotations

import threading

import pytest

from rpcsrv.board.streaming import StreamedCall


class Sink:
    def __init__(self, fail_at: int = -1):
        self.pieces, self.committed, self.aborted = [], False, False
        self.fail_at = fail_at
        self.threads = set()

    def write(self, data) -> None:
        self.threads.add(threading.get_ident())
        if len(self.pieces) == self.fail_at:
            raise OSError("disk full")
        self.pieces.append(bytes(data))

    def commit(self) -> None:
        self.committed = True

    def abort(self) -> None:
        self.aborted = True


async def test_pieces_arrive_in_order_from_copies_in_worker_threads():
    sink = Sink()
    call = StreamedCall(sink)
    shared = bytearray(4)  # what the connection does: one buffer, refilled for every piece
    for k in range(6):
        shared[:] = bytes([k]) * 4
        await call.piece(memoryview(shared))
    await call.finish()
    assert sink.pieces == [bytes([k]) * 4 for k in range(6)]
    assert sink.committed and not sink.aborted
    assert threading.get_ident() not in sink.threads


async def test_failed_write_is_kept_aborts_and_is_raised_at_the_end():
    sink = Sink(fail_at=2)
    call = StreamedCall(sink)
    for k in range(5):
        await call.piece(memoryview(bytes([k]) * 3))  # later pieces are dropped quietly
    with pytest.raises(OSError, match="disk full"):
        await call.finish()
    assert sink.aborted and not sink.committed and len(sink.pieces) == 2


async def test_error_opening_is_raised_at_the_end():
    call = StreamedCall(error=PermissionError("outside the workspace"))
    await call.piece(memoryview(b"xyz"))
    with pytest.raises(PermissionError, match="outside the workspace"):
        await call.finish()
