"""A returned array stays charged while either of its two handles holds it (review finding: the charge
was tied to the data handle alone, so freeing the data pointer while keeping the NDArray object left its
memory alive and uncharged)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import numpy as np

from rpcsrv.board.accounts import MemoryAccount
from rpcsrv.board.globals import REGISTRY
from rpcsrv.protocol import Dialect
from rpcsrv.board.session import Session
from rpcsrv.board.workspace import Workspace

MB = 1 << 20


def session(tmp_path) -> Session:
    conn = SimpleNamespace(wire_dialect=Dialect.CLASSIC)
    return Session(conn, Workspace(tmp_path / "ws"), REGISTRY, account=MemoryAccount(64 * MB))


def test_freeing_the_data_handle_keeps_the_charge_while_the_ndarray_lives(tmp_path):
    sess = session(tmp_path)
    base = sess.account.used
    remote = sess.export_array(np.ones(10 * MB // 4, np.float32))
    assert sess.account.used - base >= 10 * MB
    sess.handles.free_buffer(remote.header.data)  # DevFreeData, the NDArray object handle kept
    gc.collect()
    assert sess.account.used - base >= 10 * MB  # its memory is still held, so still charged
    sess.handles.free_object(remote.handle)
    gc.collect()
    assert sess.account.used - base < MB  # both handles gone: the charge went back


def test_freeing_the_ndarray_keeps_the_charge_while_its_data_handle_lives(tmp_path):
    sess = session(tmp_path)
    base = sess.account.used
    remote = sess.export_array(np.ones(10 * MB // 4, np.float32))
    sess.handles.free_object(remote.handle)
    gc.collect()
    assert sess.account.used - base >= 10 * MB
    sess.handles.free_buffer(remote.header.data)
    gc.collect()
    assert sess.account.used - base < MB
