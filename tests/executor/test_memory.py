"""The allocator tuning helper: idempotent, harmless without glibc, applied when modules load."""

from __future__ import annotations

import ctypes

import pytest

from rpcsrv.executor import build_runtime, memory
from rpcsrv.loader import ExampleJSONModule as EJNode


@pytest.fixture
def fresh_state(monkeypatch):
    """Forget whether the process was tuned, and record mallopt calls instead of making them."""
    calls = []

    def fake(param, value):
        calls.append((param, value))
        return 1

    monkeypatch.setattr(memory, "_state", {})
    monkeypatch.setattr(memory, "_mallopt", lambda: fake)
    return calls


def test_tune_sets_both_thresholds_once(fresh_state):
    assert memory.tune_allocator() is True
    assert memory.tune_allocator() is True
    assert fresh_state == [(memory.M_TRIM_THRESHOLD, 256 << 20), (memory.M_MMAP_THRESHOLD, 32 << 20)]


def test_no_mallopt_is_a_no_op(monkeypatch):
    monkeypatch.setattr(memory, "_state", {})
    monkeypatch.setattr(memory, "_mallopt", lambda: None)
    assert memory.tune_allocator() is False


def test_refused_values_report_false(monkeypatch):
    monkeypatch.setattr(memory, "_state", {})
    monkeypatch.setattr(memory, "_mallopt", lambda: (lambda param, value: 0))
    assert memory.tune_allocator() is False


def test_build_runtime_tunes_the_allocator(fresh_state):
    build_runtime(EJNode("f\n  input 0 2\n  relu 1 inputs: 0 shape: 2\n"))
    assert len(fresh_state) == 2


def test_real_mallopt_accepts_the_values():
    fn = memory._mallopt()
    if fn is None:
        pytest.skip("no glibc mallopt here")
    assert isinstance(fn, ctypes._CFuncPtr)
    assert memory.tune_allocator() is True  # the real call (the process keeps the setting)
