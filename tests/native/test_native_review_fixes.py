"""Fixes from the end-of-stop review of the native layer: an arena closes its descriptor once (a second
close could hit a descriptor the number went to since), and what a worker reports holding is believed only
within sense (never a credit against the budgets)."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="arenas and workers are Linux's")


def test_an_arena_closes_its_descriptor_once():
    from rpcsrv.native.shm import Arena

    arena = Arena(1 << 16)
    number = arena.fd
    arena.close()
    other = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: most likely the arena's old one
    try:
        arena.close()  # again (a worker closed after it died, then the session's end)
        os.fstat(other)  # still open, whatever its number
    finally:
        os.close(other)
    assert arena.fd == -1 and number >= 0


def test_a_negative_or_garbled_held_report_is_no_credit():
    from rpcsrv.accounts import MemoryAccount
    from rpcsrv.native.proxy import Worker

    worker = Worker.__new__(Worker)  # only _settle's state: no process
    worker.account, worker.charged = MemoryAccount(1 << 20), 0
    worker._settle(("ok", None, 4096))
    assert worker.account.used == 4096 and worker.charged == 4096
    for report in (-(1 << 30), "lots", None):
        worker._settle(("ok", None, report))
        assert worker.account.used == 4096 and worker.charged == 4096
    worker._settle(("ok", None, 0))
    assert worker.account.used == 0


def test_a_dead_spare_worker_is_closed_and_replaced():
    """take_worker: a spare whose process died is closed (process reaped, descriptors closed), and the
    session gets a fresh worker that works."""
    import time

    from rpcsrv.native import proxy

    first = proxy.take_worker(None, lambda: None)  # starts a spare in the background
    try:
        for _ in range(300):
            if proxy._spare is not None:
                break
            time.sleep(0.1)
        spare = proxy._spare
        assert spare is not None, "no spare worker started"
        spare.proc.kill()
        spare.proc.wait(10)
        second = proxy.take_worker(None, lambda: None)
        try:
            assert second is not spare and second.alive and second.proc.poll() is None
            assert spare.dead is not None  # closed, not left to the garbage collector
        finally:
            second.close()
    finally:
        first.close()
