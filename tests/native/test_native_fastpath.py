"""Native calls without the detours: binary call frames, bound calls reused by argument
signature, worker calls awaited on the event loop, short in-process calls inline.

The frames are checked both ways (every encodable call decodes to what pickle would have carried,
malformed frames are ``ValueError``s), and a real worker answers malformed frames with an error and goes
on.  The event-loop path is driven against a real worker running gcc-built kernels: results, errors,
a crash, the session deadline and a cancelled call each end as they do on the thread path.
"""

from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest
import trio
from hypothesis import given, settings, strategies as st

from native_helpers import build_c
from rpcsrv.native import NativeError, load_native_module
from rpcsrv.native import confine, fastpath
from rpcsrv.native.host import NativeSession
from rpcsrv.native.process import worker_config
from rpcsrv.native.proxy import Worker
from rpcsrv.native.wire import (Ref, Shared, decode_call, decode_result, encode_call, encode_result)
from rpcsrv.native.wire import recv as _recv, send as _send


@pytest.fixture(scope="module")
def c_target(tmp_path_factory):
    return build_c("c_target_kernels", tmp_path_factory.mktemp("fast"))


# ---------------------------------------------------------------------------- frames
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)
_shared = st.builds(lambda region, off, dtype, dims: Shared(region, off, dtype, tuple(dims),
                                                            tuple(d * 4 for d in dims)),
                    st.sampled_from(["session", "worker"]), st.integers(0, (1 << 64) - 1),
                    st.sampled_from(["<f4", "<i8", "|b1", "<c16"]), st.lists(st.integers(0, 1 << 20), max_size=6))
_arg = st.one_of(_shared, _i64, st.floats(allow_nan=False), st.booleans(), st.none(),
                 st.builds(lambda i: Ref("fn", i, ""), st.integers(0, (1 << 64) - 1)))
_budget = st.one_of(st.none(), st.tuples(_i64, st.lists(st.tuples(st.text(max_size=20), _i64, _i64), max_size=4)
                                          .map(tuple)))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 64) - 1), _budget, st.lists(_arg, max_size=8))
def test_call_frames_decode_to_what_pickle_carried(oid, budget, args):
    frame = encode_call(oid, budget, args)
    assert frame is not None and frame[:1] == b"C"
    got_budget, (op, got_oid, got_args) = decode_call(frame)
    assert (op, got_oid, got_budget) == ("call", oid, budget)
    assert [(type(a), a) for a in got_args] == [(type(a), a) for a in args]  # 1 stays int, True bool


def test_calls_that_need_pickle_get_no_frame():
    assert encode_call(1, None, [np.zeros(3)]) is None  # a copied array
    assert encode_call(1, None, ["text"]) is None
    assert encode_call(1, None, [1 << 70]) is None
    assert encode_call(1, None, [[1, 2]]) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_malformed_call_frames_are_value_errors(tail):
    try:
        decode_call(b"C" + tail)
    except ValueError:
        pass


@pytest.mark.parametrize("frame, words", [
    (b"C", "truncated"),
    (encode_call(1, None, [Shared("session", 0, "<f4", (4,), (4,))])[:-3], "truncated"),
    (encode_call(1, None, [3]) + b"x", "stray"),
    (encode_call(1, None, [None]).replace(b"n", b"?"), "unknown argument tag"),
    (encode_call(1, None, [Shared("session", 0, "<f4", (4,), (4,))]).replace(b"S\x00", b"S\x07", 1), "region"),
    (encode_call(1, (0, (("s", 1, 2),)), []).replace(b"\x01s", b"\x01\xff"), "UTF-8"),
])
def test_malformed_call_frames_say_what_is_wrong(frame, words):
    with pytest.raises(ValueError, match=words):
        decode_call(frame)


@pytest.mark.parametrize("value", [None, True, False, 0, -7, (1 << 63) - 1, 2.5, -0.0])
def test_result_frames_round_trip(value):
    got = decode_result(encode_result(("ok", value, [], 1234)))
    assert got == ("ok", value, [], 1234) and type(got[1]) is type(value)


def test_results_that_need_pickle_get_no_frame_and_bad_result_frames_are_errors():
    for answer in (("ok", "text", [], 0), ("ok", None, [np.zeros(1)], 0), ("err", "x", None, 0),
                   ("ok", 1 << 64, [], 0)):
        assert encode_result(answer) is None
    with pytest.raises(ValueError):
        decode_result(b"R\x00")
    with pytest.raises(ValueError, match="kind"):
        decode_result(encode_result(("ok", None, [], 0))[:9] + b"\x09" + bytes(8))


@pytest.fixture
def unconfined():
    """The start message of a raw ``Worker`` started unconfined: these tests speak the wire to it directly
    (confinement, which a session applies before the first load, has its own tests in tests/native/hostile)."""
    return worker_config(confine.ConfineOptions(enabled=False))


def test_worker_answers_malformed_frames_with_errors_and_goes_on(c_target, unconfined):
    worker = Worker(None, config=unconfined)
    try:
        lib = worker.load(str(c_target))
        fn = lib.find_function("twice_plus_one")
        for bad in (b"C", b"C" + bytes(40), encode_call(fn.oid, None, [3]) + b"zz", b"\x80garbage", b"junk"):
            _send(worker.sock, None, data=bad)
            answer = _recv(worker.sock)
            assert answer[0] == "err" and answer[1], answer
        _send(worker.sock, None, data=encode_call(999, None, [3]))  # a function the worker does not have
        assert "unknown worker object" in _recv(worker.sock)[1]
        assert worker.alive and worker.proc.poll() is None
        assert fn(20) == 41  # the binary frame and its binary answer
    finally:
        worker.close()


# ---------------------------------------------------------------------------- the event-loop path
@pytest.fixture
def native(c_target):
    ns = NativeSession("isolated", timeout=30)
    ns.isolate_all = True
    lib = ns.load(str(c_target))
    yield ns, lib
    ns.close()


async def test_worker_calls_from_the_event_loop(native):
    ns, lib = native
    add_one, twice = lib.find_function("add_one"), lib.find_function("twice_plus_one")
    assert lib.find_function("add_one") is add_one  # looked up once per module
    bufs = [ns.zeros(64).view("float32") for _ in range(4)]
    for i, (a, b) in enumerate([(bufs[0], bufs[1]), (bufs[2], bufs[3]), (bufs[0], bufs[3])] * 2):
        a[:] = np.arange(16) * (i + 1)
        assert await add_one.acall(a, b) == (True, None)  # the same buffers again: the worker's bound call
        np.testing.assert_array_equal(b, a + 1)
    assert await twice.acall(5) == (True, 11)
    with pytest.raises(NativeError, match="num_args should be 2"):
        await add_one.acall(bufs[0])
    with pytest.raises(NativeError, match="always_fail: this fixture refuses every call"):
        await lib.find_function("always_fail").acall()
    assert await add_one.acall(np.zeros(16, "float32"), np.zeros(16, "float32")) == (False, None)  # copied: a thread


async def test_a_crash_on_the_event_loop_path_ends_only_the_worker(native):
    ns, lib = native
    twice = lib.find_function("twice_plus_one")
    with pytest.raises(NativeError, match="crashed"):
        await lib.find_function("crash").acall()
    assert not ns.worker.alive
    assert await twice.acall(1) == (False, None)  # the thread path then says the worker is gone
    with pytest.raises(NativeError, match="gone"):
        twice(1)


async def test_the_deadline_and_a_cancelled_call_stop_the_worker(c_target):
    ns = NativeSession("isolated", timeout=60)
    ns.isolate_all = True
    try:
        lib = ns.load(str(c_target))  # (kept: a dropped module is freed in the worker with the next request)
        ns.deadline = time.monotonic() + 1.5  # the session ends 1.5 s from now (however long its worker took to start)
        spin = lib.find_function("spin")
        start = time.monotonic()
        with pytest.raises(NativeError, match="session deadline"):
            await spin.acall()
        assert time.monotonic() - start < 10 and not ns.worker.alive
    finally:
        ns.close()
    ns = NativeSession("isolated", timeout=60)
    ns.isolate_all = True
    try:
        lib = ns.load(str(c_target))
        with trio.move_on_after(0.5):
            await lib.find_function("spin").acall()
        assert not ns.worker.alive and "session ended" in ns.worker.dead
    finally:
        ns.close()


# ---------------------------------------------------------------------------- in process
def test_in_process_calls_reuse_conversions_only_for_the_same_arrays(c_target):
    fn = load_native_module(str(c_target)).find_function("add_one")
    a, b = np.arange(16, dtype="float32"), np.zeros(16, "float32")
    fn(a, b)
    np.testing.assert_array_equal(b, a + 1)
    c, d = np.full(16, 5, "float32"), np.zeros(16, "float32")
    fn(c, d)
    np.testing.assert_array_equal(d, 6)
    fn(a[:8], b[:8])  # same addresses, another shape: its own conversion
    np.testing.assert_array_equal(b[:8], a[:8] + 1)
    with pytest.raises(NativeError, match="A must be float32"):
        fn(a.view("int32"), b)  # same address, another dtype
    dead = weakref.ref(c)
    del c, d
    gc.collect()
    assert dead() is None  # a reused conversion holds addresses, not the arrays


async def test_short_in_process_calls_run_inline_until_they_prove_long():
    import threading

    where: list[int] = []

    def short():
        where.append(threading.get_ident())
        return 7

    run = fastpath.Inline(short)
    assert await run() == (True, 7)  # the first call: in a thread, timed
    assert await fastpath.Inline(short)() == (True, 7)  # a new runner (looked up again): what was learned holds
    assert where[0] != threading.get_ident() and where[1] == threading.get_ident()

    def long():
        end = time.thread_time() + 2 * fastpath.INLINE_LIMIT
        while time.thread_time() < end:
            pass
        return 1

    slow = fastpath.Inline(long)
    results = [await slow() for _ in range(fastpath.STRIKES + 2)]
    assert results[:fastpath.STRIKES] == [(True, 1)] * fastpath.STRIKES
    assert results[fastpath.STRIKES:] == [(False, None)] * 2  # back to the session's thread for good


# ---------------------------------------------------------------------------- the worker's priority
def _nice(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice


def test_the_worker_answers_at_the_servers_priority_until_its_first_model_run(c_target, monkeypatch, unconfined):
    import os

    monkeypatch.setenv("RPCSRV_WORKER_NICE", "3")
    here = os.getpriority(os.PRIO_PROCESS, 0)
    worker = Worker(None, config=worker_config(confine.ConfineOptions(enabled=False)))  # (with the variable set)
    try:
        pid = worker.pid
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        assert others and all(_nice(pid, t) == min(here + 3, 19) for t in others)  # BLAS, the parent watch
        assert _nice(pid, pid) == here  # the request thread: kernels called one by one are not held back
        lib = worker.load(str(c_target))
        timer = lib.find_function("add_one").time_evaluator((1, 1, 0, 100, 0, 1, 0), "")
        a = np.zeros(16, "float32")
        timer(a, np.zeros(16, "float32"))  # a job in the worker: it asks the server for a slot
        assert _nice(pid, pid) == min(here + 3, 19)
    finally:
        worker.close()
