"""Replay the recorded real TVM clients against rpcsrv and compare its answers with TVM's server.

The recorded client bytes are decoded, the handles TVM's server had issued are swapped for the ones
rpcsrv issued in the same place, the packet is re-encoded (byte-exact, see test_recordings) and sent.
rpcsrv's answer must equal the recorded answer up to handle values (mapped consistently) and the
workspace path.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
import trio

from conftest import need_shared
from recordings import packets, reencode
from rpcsrv.protocol import (CallFunc, Connection, CopyAck, CopyFromRemote, CopyToRemote,
                             Dialect, Handle, RemoteError, Return, Role, RPCCode, Syscall, TensorHeader)
from rpcsrv.board.options import ServeOptions
from rpcsrv.board.server import Server, serve

RECORDED_WORKSPACE = "/srv/rpc-workspa"


class HandleMap:
    """Recorded server handle → rpcsrv's handle, built from the answers as they come."""

    def __init__(self):
        self.fwd = {0: 0}
        self.freed: set[int] = set()  # recorded handles the client freed: the value may come back

    def learn(self, recorded: int, ours: int) -> None:
        if recorded in self.freed:
            self.freed.discard(recorded)
            self.fwd[recorded] = ours
        elif recorded in self.fwd:
            assert self.fwd[recorded] == ours, f"handle 0x{recorded:x} mapped twice"
        else:
            self.fwd[recorded] = ours

    def sub(self, v):
        if isinstance(v, Handle):
            return type(v)(self.fwd.get(v.value, v.value))
        if isinstance(v, TensorHeader):
            return replace(v, data=self.fwd.get(v.data, v.data))
        return v


def _same(recorded, ours, handles: HandleMap, workspace: str) -> None:
    if isinstance(recorded, Handle):
        assert type(ours) is type(recorded), (recorded, ours)
        assert (recorded.value == 0) == (ours.value == 0), (recorded, ours)
        handles.learn(recorded.value, ours.value)
    elif isinstance(recorded, TensorHeader):
        assert isinstance(ours, TensorHeader)
        handles.learn(recorded.data, ours.data)
        assert replace(recorded, data=0) == replace(ours, data=0)
    elif isinstance(recorded, str) and recorded.startswith(RECORDED_WORKSPACE):
        assert ours.startswith(workspace) and ours.endswith(recorded.rsplit("/", 1)[1]), ours
    elif isinstance(recorded, memoryview):
        assert bytes(recorded) == bytes(ours)
    else:
        assert recorded == ours and type(recorded) is type(ours), (recorded, ours)


async def _read_packet(stream, buf: bytearray) -> bytes:
    while len(buf) < 8 or len(buf) < 8 + struct.unpack_from("<q", buf)[0]:
        chunk = await stream.receive_some(1 << 16)
        assert chunk, "server closed the connection"
        buf += chunk
    n = 8 + struct.unpack_from("<q", buf)[0]
    out = bytes(buf[:n])
    del buf[:n]
    return out


async def replay(path, dialect: Dialect, fixed: bool, key: str = "", elided=None, timing=None,
                 timings=None) -> int:
    """Replay ``path``; returns how many answers were compared.

    ``elided(head) -> bytes``: the packet to send in place of an elided one (given its first bytes).
    ``timing(ev, values) -> bool``: whether a call's bytes answer is a time evaluator's (compared by
    length only); by default, bytes answered to a call without arguments.
    ``timings(recorded, ours)``: compares bytes answers to calls with arguments (timings that differ
    from run to run, e.g. the debug executor's ``run_individual``) instead of byte equality.
    """
    items = packets(path)
    compared = 0
    async with trio.open_nursery() as nursery:
        cfg = Server(ServeOptions(port=0, key=key, dialect=dialect if fixed else None))
        port = await nursery.start(serve, cfg)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        reader = Connection(Role.SERVER, strict=False, dialect=dialect)  # decodes recorded client packets
        writer = Connection(Role.CLIENT, strict=False, dialect=dialect)  # re-encodes them
        ours_dec = Connection(Role.CLIENT, strict=False, dialect=dialect)
        rec_dec = Connection(Role.CLIENT, strict=False, dialect=dialect)
        handles, buf, workspace = HandleMap(), bytearray(), None
        for i, (direction, kind, data) in enumerate(items):
            if direction != "c2s":
                continue
            answer = items[i + 1][2] if i + 1 < len(items) and items[i + 1][0] == "s2c" else None
            if kind == "handshake":
                reader.receive_data(data)
                reader.next_event()
                reader.accept()
                await stream.send_all(data)
                while len(buf) < len(answer):
                    chunk = await stream.receive_some(1 << 16)
                    if not chunk:
                        break
                    buf += chunk
                assert bytes(buf[:len(answer)]) == answer
                del buf[:len(answer)]
                for dec in (rec_dec, ours_dec):
                    dec.receive_data(answer)
                    dec.next_event()
                if len(answer) == 4:  # refused: the server closes
                    assert await stream.receive_some(1 << 16) == b""
                    break
                continue
            if kind == "elided":
                data = elided(data)
            reader.receive_data(data)
            ev = reader.next_event()
            if isinstance(ev, (CallFunc,)):
                ev = CallFunc(handles.fwd.get(ev.handle, ev.handle), [handles.sub(a) for a in ev.args])
            elif isinstance(ev, Syscall):
                freed = ev.args[0 if ev.code == RPCCode.FREE_HANDLE else 1].value \
                    if ev.code in (RPCCode.FREE_HANDLE, RPCCode.DEV_FREE_DATA) else None
                ev = Syscall(ev.code, [handles.sub(a) for a in ev.args])
            elif isinstance(ev, (CopyToRemote, CopyFromRemote)):
                ev = replace(ev, tensor=handles.sub(ev.tensor))
            await stream.send_all(reencode(writer, ev))
            if isinstance(ev, Syscall) and freed is not None:
                handles.freed.add(freed)  # TVM's server may hand the same value out again
            if answer is None:
                break
            got = await _read_packet(stream, buf)
            if struct.unpack_from("<i", data, 8)[0] == 2:
                # dialect-neutral init answer, also with a fixed dialect (so that a client of the
                # other dialect gets as far as its first call, where the mismatch is named)
                assert got == struct.pack("<qii", 8, 4, 0)
                continue
            rec_dec.receive_data(answer)
            ours_dec.receive_data(got)
            r, o = rec_dec.next_event(), ours_dec.next_event()
            assert type(r) is type(o), (r, o)
            if isinstance(r, Return):
                assert len(r.values) == len(o.values), (r, o)
                if workspace is None:
                    workspace = next((v.rsplit("/", 1)[0] for v in o.values if isinstance(v, str)
                                      and v.startswith("/")), None) or ""
                timing_call = isinstance(ev, CallFunc) and (timing(ev, r.values) if timing else not ev.args)
                is_timing = timing_call and isinstance(r.values[-1], memoryview)
                for a, b in zip(r.values, o.values):
                    if is_timing and isinstance(a, memoryview):  # time evaluator: timings differ
                        assert len(a) == len(b)
                        continue
                    if timings is not None and isinstance(ev, CallFunc) and isinstance(a, memoryview):
                        timings(bytes(a), bytes(b))
                        continue
                    _same(a, b, handles, workspace)
            elif isinstance(r, CopyAck):
                assert bytes(r.data) == bytes(o.data), "copied data differs"
            else:
                assert isinstance(r, RemoteError)
            compared += 1
        await stream.aclose()
        nursery.cancel_scope.cancel()
    return compared


CASES = [("classic-sessions", n, Dialect.CLASSIC) for n in ("globals", "tensors", "files")] + \
        [("ffi-sessions", n, Dialect.FFI) for n in ("globals", "tensors", "files")]


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-dialect", "auto-dialect"])
@pytest.mark.parametrize("folder,name,dialect", CASES, ids=[f"{f[:3]}-{n}" for f, n, _ in CASES])
async def test_replay_matches_tvm_server(folder, name, dialect, fixed):
    compared = await replay(need_shared(folder, f"{name}.jsonl"), dialect, fixed)
    assert compared >= 4


async def test_replay_keyed_session():
    assert await replay(need_shared("classic-sessions", "keyed.jsonl"), Dialect.CLASSIC, True,
                        key="board-a") >= 4  # (the init answer is checked, not counted)


async def test_replay_wrong_key_is_refused():
    await replay(need_shared("classic-sessions", "wrong-key.jsonl"), Dialect.CLASSIC, True, key="board-a")


async def test_replay_classic_graph_executor_session(tmp_path):
    """The recorded classic GraphModule flow, with our own build of the same seed library uploaded in
    place of the elided TVM-built one: every later answer must match TVM's, including the output."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "interop"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loader"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
    from loader_fixtures import compile_library
    from rpcsrv.loader import BLOB_SYMBOL, build_blob
    from test_tvm_graph import seed_tree

    so = compile_library(build_blob(seed_tree()), BLOB_SYMBOL, "host", tmp_path / "ej_seed_full.so")
    writer = Connection(Role.CLIENT, strict=False, dialect=Dialect.CLASSIC)

    def upload(head: bytes) -> bytes:
        (handle,) = struct.unpack_from("<Q", head, 12)
        return b"".join(bytes(p) for p in writer.send_call(handle, ["ej_seed_full.so", so.read_bytes()]))

    compared = await replay(need_shared("classic-sessions", "graph-executor.jsonl"), Dialect.CLASSIC,
                            True, elided=upload)
    assert compared >= 60
