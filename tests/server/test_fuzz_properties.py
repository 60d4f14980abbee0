"""Bounded fuzzing in the suite: mutated packets of both dialects against a live session,
mutated graph JSON and ExampleJSON against their parsers.  (Mutated libraries against the loader:
tests/loader/test_loader_bad_input.py.)  Long runs by hand: fuzz/ (atheris).

A live session here is the real ``serve_connection`` on one end of a socket pair, in process: the
mutated client stream goes in, the server must answer or close, never raise or hang, and its
session must release everything (its memory account back to zero)."""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpcsrv.loader.examplejson_text import ExampleJSONError, parse_examplejson
from rpcsrv.loader.graph_json import GraphJSONError, parse_graph_json
from rpcsrv.executor.kernels import KERNELS
from rpcsrv.board.limits import Limits
from rpcsrv.board.options import ServeOptions
from rpcsrv.board.server import Server, serve_connection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))

from exec_helpers import SEED, seed_graph_json  # noqa: E402
from recordings import streams  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data"
STREAMS = {f"{d[:3]}-{name}": streams(DATA / d / f"{name}.jsonl")["c2s"]
           for d in ("classic-sessions", "ffi-sessions") for name in ("globals", "tensors", "files")}
INTERESTING = [0, 1, 4, 7, 8, 12, 64, 115, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 20]


@st.composite
def mutated(draw, data: bytes):
    """Byte flips, int32 overwrites with interesting values, insertions and one cut, anywhere
    after the handshake (a broken handshake is only ever refused)."""
    buf = bytearray(data)
    lo = struct.unpack_from("<i", data, 4)[0] + 8
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(lo, len(buf) - 1))
        op = draw(st.sampled_from(["byte", "i32", "insert"]))
        if op == "byte":
            buf[at] = draw(st.integers(0, 255))
        elif op == "i32":
            buf[at:at + 4] = struct.pack("<I", draw(st.sampled_from(INTERESTING)))
        else:
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
    cut = draw(st.one_of(st.none(), st.integers(lo, len(buf))))
    return bytes(buf if cut is None else buf[:cut])


async def _drive(data: bytes, tmp: Path) -> bytes:
    """Serve one connection whose client sends ``data`` then closes; returns what the server sent."""
    a, b = socket.socketpair()
    cfg = Server(ServeOptions(workdir=tmp, limits=Limits(max_memory=64 << 20, max_total_memory=128 << 20)))
    out = bytearray()
    with a, b:
        a.setblocking(False)
        server_end = trio.SocketStream(trio.socket.from_stdlib_socket(b))
        with trio.fail_after(20):  # a hang fails the test
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_connection, server_end, cfg)
                client = trio.socket.from_stdlib_socket(a)
                view = memoryview(data)
                while view:
                    try:
                        view = view[await client.send(view):]
                    except OSError:
                        break  # the server closed on us: fine
                client.shutdown(socket.SHUT_WR)
                while True:
                    try:
                        chunk = await client.recv(1 << 16)
                    except OSError:
                        break
                    if not chunk:
                        break
                    out += chunk
    assert cfg.account.used == 0  # everything the session held is released
    assert cfg.sessions == 0
    return bytes(out)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_mutated_packets_against_a_live_session(name, tmp_path):
    data = STREAMS[name]
    assert trio.run(_drive, data, tmp_path)  # the unmutated session is served

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mutated(data))
    def run(bad):
        trio.run(_drive, bad, tmp_path)

    run()


def _mutate_text(draw, text: str) -> str:
    chars = list(text)
    for _ in range(draw(st.integers(1, 5))):
        at = draw(st.integers(0, max(0, len(chars) - 1)))
        op = draw(st.sampled_from(["replace", "delete", "insert", "dup"]))
        piece = draw(st.sampled_from(["0", "-1", "99999999999", " ", "\n", "x", "[", "]", "{", "}", '"',
                                      ",", ":", "null", "1e309", "float16", "inputs:", "shape:"]))
        if op == "replace" and chars:
            chars[at] = piece
        elif op == "delete" and chars:
            del chars[at]
        elif op == "insert":
            chars.insert(at, piece)
        elif chars:
            chars[at:at] = chars[at:at + draw(st.integers(1, 40))]
    return "".join(chars)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_graph_json_is_parsed_or_refused(data):
    text = _mutate_text(data.draw, seed_graph_json())
    try:
        parse_graph_json(text)
    except GraphJSONError as exc:
        assert str(exc)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_examplejson_is_parsed_or_refused(data):
    text = _mutate_text(data.draw, SEED)
    try:
        parse_examplejson(text, KERNELS)
    except ExampleJSONError as exc:
        assert str(exc)


def test_graph_json_values_of_every_json_type_are_refused_cleanly():
    base = json.loads(seed_graph_json())
    for key in list(base) + ["attrs.shape", "attrs.storage_id"]:
        for value in (None, 1, -1, "x", [], {}, [[-1]], 1.5, True):
            g = json.loads(seed_graph_json())
            if key.startswith("attrs."):
                g["attrs"][key[6:]] = value
            else:
                g[key] = value
            try:
                parse_graph_json(json.dumps(g))
            except GraphJSONError:
                pass
