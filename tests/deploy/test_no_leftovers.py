"""The test suite leaves no process behind (issue 24): TVM's tracker runs its service in a
``tvm.exec.popen_worker`` child that survived ``TvmService.stop`` (five ~200 MB orphans per run of
the suite); and the per-module check of tests/conftest.py sees such orphans at all."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from conftest import live_children, need_module
from farm import TvmService, wait_until


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                            out.append(int(entry))
                            todo.append(int(entry))
                except (OSError, ValueError, IndexError):
                    continue
    return out


def test_tvm_tracker_stops_with_its_popen_worker():
    need_module("tvm", "TVM's own tracker")
    tracker = TvmService("tracker")
    workers = wait_until(lambda: _descendants(tracker.proc.pid), 30)
    assert workers, "TVM's tracker started no popen_worker (has TVM changed?)"
    tracker.stop()
    assert wait_until(lambda: not any(_alive(p) for p in workers), 10), \
        f"still alive after stop: {[p for p in workers if _alive(p)]}"


def test_an_orphaned_grandchild_is_seen_by_the_leftover_check():
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         timeout=30).stdout
    orphan = int(out.strip())
    try:
        seen = wait_until(lambda: orphan in live_children(), 5)
        assert seen, "an orphan of a child was not reparented to the test process (no subreaper?)"
    finally:
        os.kill(orphan, signal.SIGKILL)
        time.sleep(0.1)
