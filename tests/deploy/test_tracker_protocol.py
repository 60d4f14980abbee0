"""The tracker/proxy control protocol at byte level (rpcsrv/protocol/tracker.py).

Reference bytes come from TVM's own code where it is installed (``tvm.rpc.base.sendjson`` writing into
a socket pair), and from hand-written literals of the documented layout otherwise.
"""

from __future__ import annotations

import json
import random
import socket
import struct

import pytest

from conftest import need_module
from rpcsrv.protocol import tracker as tp
from rpcsrv.protocol.codes import RPC_CODE_DUPLICATE, RPC_CODE_MISMATCH, RPC_MAGIC


def test_magic_and_codes_are_tvms():
    assert tp.MAGIC_BYTES == b"\x71\xf2\x02\x00"  # int32 LE 0x2F271
    assert [c.value for c in tp.TrackerCode] == [-1, 0, 1, 2, 3, 4, 5, 6, 7]
    assert tp.TrackerCode.PUT == 3 and tp.TrackerCode.GET_PENDING_MATCHKEYS == 7


def test_put_bytes_literal():
    data = tp.encode(tp.put("board-x", 9091, "board-x:0.5", None))
    body = b'[3, "board-x", [9091, "board-x:0.5"], null]'
    assert data == struct.pack("<i", len(body)) + body


def _tvm_sendjson_bytes(value) -> bytes:
    base = need_module("tvm.rpc.base", "TVM's own framing is the reference")
    a, b = socket.socketpair()
    with a, b:
        base.sendjson(a, value)
        a.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := b.recv(4096):
            out += chunk
    return out


@pytest.mark.parametrize("message", [
    tp.update_info("board-x", 9091, None),
    tp.update_info("board-x", 9091, "10.0.0.7"),
    tp.put("board-x", 9091, "board-x:0.25", "10.0.0.7"),
    tp.pending_matchkeys(), tp.ping(), tp.summary(), tp.request("board-x", "", 1),
])
def test_framing_matches_tvm_sendjson(message):
    assert tp.encode(message) == _tvm_sendjson_bytes(message)


def test_reader_across_splits_and_batches():
    stream = tp.encode(0) + tp.encode(["a:1", "a:2"]) + tp.encode([0, {"queue_info": {}}])
    for cut in range(len(stream) + 1):
        r = tp.MessageReader()
        got = r.feed(stream[:cut]) + r.feed(stream[cut:])
        assert got == [0, ["a:1", "a:2"], [0, {"queue_info": {}}]]
        assert r.pending == 0
    r = tp.MessageReader()
    assert r.feed(b"".join(tp.encode(i) for i in range(5))) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("bad, match", [
    (struct.pack("<i", 0), "outside"),
    (struct.pack("<i", -4), "outside"),
    (struct.pack("<i", tp.MAX_MESSAGE + 1), "outside"),
    (struct.pack("<i", 3) + b"[1,", "JSON"),
    (struct.pack("<i", 2) + b"\xff\xfe", "JSON"),
])
def test_reader_refuses_bad_frames(bad, match):
    with pytest.raises(tp.TrackerError, match=match):
        tp.MessageReader().feed(bad)


def test_encode_refuses_oversized():
    with pytest.raises(tp.TrackerError, match="exceeds"):
        tp.encode("x" * tp.MAX_MESSAGE)


def test_check_magic():
    tp.check_magic(tp.MAGIC_BYTES)
    with pytest.raises(tp.TrackerError, match="not an RPC tracker"):
        tp.check_magic(struct.pack("<i", RPC_MAGIC))


def test_expect_success():
    tp.expect_success(0, "PUT")
    with pytest.raises(tp.TrackerError, match="refused PUT"):
        tp.expect_success(-1, "PUT")


def test_slot_offer_admit_once_and_reoffer():
    slot = tp.BoardSlot(key="board-x", port=9091, custom_addr="10.0.0.7", rng=random.Random(1))
    assert slot.hello() == [5, {"key": "server:board-x", "addr": ["10.0.0.7", 9091]}]
    msg = slot.offer()
    assert msg[:2] == [3, "board-x"] and msg[2][0] == 9091 and msg[3] == "10.0.0.7"
    key = msg[2][1]
    assert key.rsplit(":", 1)[0] == "board-x"  # the tracker finds the queue again by this split
    assert not slot.admit("board-x")  # the plain key is not a match key
    assert not slot.admit(None)
    assert slot.admit(key) and slot.busy == 1
    assert not slot.admit(key)  # one session per handed-out key
    slot.session_done()
    assert slot.busy == 0
    again = slot.offer()[2][1]
    assert again != key and slot.admit(again)


def test_slot_regenerates_an_unused_handed_out_key():
    slot = tp.BoardSlot(key="k", port=1, unmatched_timeout=6.0)
    key = slot.offer()[2][1]
    assert slot.on_pending([key], now=0.0) is None  # still queued at the tracker
    assert slot.on_pending([], now=10.0) is None  # handed out: start the clock
    assert slot.on_pending([], now=15.0) is None
    fresh = slot.on_pending([], now=16.5)
    assert fresh is not None and fresh[2][1] != key
    assert not slot.admit(key) and slot.admit(fresh[2][1])
    with pytest.raises(tp.TrackerError, match="list"):
        slot.on_pending({"not": "a list"}, now=0.0)


def test_proxy_hello_and_answers():
    hello = tp.proxy_hello("board-x")
    assert hello == struct.pack("<ii", RPC_MAGIC, 14) + b"server:board-x"
    assert tp.proxy_answer_code(struct.pack("<i", RPC_MAGIC)) == RPC_MAGIC
    with pytest.raises(tp.TrackerError, match="already has a board"):
        tp.proxy_answer_code(struct.pack("<i", RPC_CODE_DUPLICATE))
    with pytest.raises(tp.TrackerError, match="no client"):
        tp.proxy_answer_code(struct.pack("<i", RPC_CODE_MISMATCH))
    with pytest.raises(tp.TrackerError, match="not an RPC proxy"):
        tp.proxy_answer_code(b"HTTP")


def test_summary_answer_is_json_of_tvms_shape():
    # what TVM's tracker answers to SUMMARY, as it would frame it
    answer = [0, {"queue_info": {"board-x": {"free": 2, "pending": 0}},
                  "server_info": [{"key": "server:board-x", "addr": ["127.0.0.1", 9091]}]}]
    frame = struct.pack("<i", len(json.dumps(answer))) + json.dumps(answer).encode()
    assert tp.MessageReader().feed(frame) == [answer]
