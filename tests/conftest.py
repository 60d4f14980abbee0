"""Shared test fixtures and the optional-dependency policy.

Tests that need something heavy or external (the real TVM client, a cross compiler) call
``need_module`` / ``need_program``: on a user's machine a missing dependency skips the test with a
reason; with ``RPCSRV_REQUIRE_ALL=1`` (set by ``.ci/run``) it fails instead, so CI cannot go green
by skipping.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
# The recorded real TVM sessions are test vectors: a copy lives in the repo (tests/data) so that a
# clean checkout anywhere runs them; ../shared is the fallback for anything not copied.
DATA = REPO / "tests" / "data"
REQUIRE_ALL = os.environ.get("RPCSRV_REQUIRE_ALL") == "1"


#: the logger a run plan's bug goes to (rpcsrv/executor/kernels/plans.py: the board runs the step's table kernel
#: instead and says so once, at ERROR); named here so that conftest imports nothing of rpcsrv
PLAN_LOGGER = "rpcsrv.executor.kernels.plans"


class _PlanBugs(logging.Handler):
    """The records of :data:`PLAN_LOGGER` since the current test began."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_PLAN_BUGS = _PlanBugs()
logging.getLogger(PLAN_LOGGER).addHandler(_PLAN_BUGS)


@pytest.fixture(autouse=True)
def no_plan_bugs():
    """Every test fails if a run plan raised anything but ``NotPlannable`` while it ran (on a board that is a
    log line and a slower step; here it is a bug to fix).  A test that provokes one on purpose takes the
    records from this fixture and clears them."""
    _PLAN_BUGS.records.clear()
    yield _PLAN_BUGS.records
    found = [f"{r.getMessage()}" for r in _PLAN_BUGS.records]
    _PLAN_BUGS.records.clear()
    if found:
        pytest.fail("a run plan raised (rpcsrv/executor/kernels/plans.py logged it):\n" + "\n".join(found),
                    pytrace=False)


def _missing(reason: str):
    if REQUIRE_ALL:
        pytest.fail(f"required by RPCSRV_REQUIRE_ALL=1 but missing: {reason}", pytrace=False)
    pytest.skip(reason)


def need_module(name: str, why: str = ""):
    """Import and return module ``name``, or skip (fail under RPCSRV_REQUIRE_ALL=1)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _missing(f"python module {name!r} not importable ({exc}); {why}".rstrip("; "))


def run_with_tvm(board, lib, inputs: dict) -> list:
    """Run library ``lib`` (a path) on ``board`` (host, port) through the real apache-tvm client, as a user does:
    upload, ``load_module``, the graph executor from ``default``, every input set, ``run``; returns every
    output as numpy.  Skips (fails under RPCSRV_REQUIRE_ALL=1) without apache-tvm."""
    tvm = need_module("tvm", "the real TVM client comes from `pip install apache-tvm`")
    sess = tvm.rpc.connect(board.host, board.port)
    sess.upload(str(lib))
    dev = sess.cpu(0)
    m = sess.load_module(Path(lib).name)["default"](dev)
    for name, value in inputs.items():
        m["set_input"](name, tvm.runtime.tensor(value, dev))
    m["run"]()
    return [m["get_output"](k).numpy() for k in range(m["get_num_outputs"]())]


def need_program(name: str, why: str = "") -> str:
    """Path of program ``name`` on PATH, or skip (fail under RPCSRV_REQUIRE_ALL=1)."""
    path = shutil.which(name)
    if path is None:
        _missing(f"program {name!r} not on PATH; {why}".rstrip("; "))
    return path


def need_shared(*parts: str) -> Path:
    """A path under tests/data or ../shared (recorded sessions, seeds), or skip/fail when absent."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        path = SHARED.joinpath(*parts)
    if not path.exists():
        _missing(f"{path} not found (the shared/ folder sits beside the repo)")
    return path


class ServerProcess:
    """``rpcsrv serve`` in a child process on a free port (what a user runs on the board)."""

    def __init__(self, *args: str, workdir=None, env=None, cwd=None, launch=(), flags=()):
        """``launch``: a command that execs the rest (e.g. into a cgroup); ``flags``: rpcsrv's own, before
        ``serve`` (``-v``)."""
        import re
        import subprocess
        import sys

        cmd = [*launch, sys.executable, "-m", "rpcsrv", *flags, "serve", "--port", "0", *args]
        if workdir is not None:
            cmd += ["--workdir", str(workdir)]
        import tempfile

        # the log goes to a file: a pipe nobody reads would block the server once it fills
        self.log = tempfile.TemporaryFile("a+")  # O_APPEND: the child never writes at the offset we read from
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=cwd)
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"rpcsrv did not start: {line!r} {self.stderr()}")
        self.port = int(m.group(1))
        self.host = "127.0.0.1"

    def stderr(self) -> str:
        """What the server logged so far."""
        self.log.seek(0)
        return self.log.read()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        import signal

        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def module_server(tmp_path_factory, *args: str):
    """Body of a module-scoped server fixture: the server must outlive every test that used it."""
    srv = ServerProcess(*args, workdir=tmp_path_factory.mktemp("rpcsrv-work"))
    yield srv
    assert srv.alive(), "the server died during the tests"
    srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A keyless rpcsrv for the tests of one module."""
    yield from module_server(tmp_path_factory)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--key", "board-a")


# ------------------------------------------------------------------------------- no process left behind
# The test process is a child subreaper (Linux): a process the tests start that outlives its parent
# (e.g. the ``tvm.exec.popen_worker`` under TVM's tracker, ~200 MB each) is reparented here instead of
# to init, so the check below sees it.  Each test module must end with no more live child processes
# than it started with (rpcsrv's one warm spare native worker excepted: the server keeps it on purpose; and
# a Docker engine the HIL tests had to start).
# Zombies are left alone: they hold no memory, and reaping them could take a Popen object's exit status.
_PR_SET_CHILD_SUBREAPER = 36
if os.path.isdir("/proc") and hasattr(os, "getpid"):
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def live_children() -> dict[int, str]:
    """pid -> command line of this process's live (not zombie) children, orphans reparented here included."""
    me, found = os.getpid(), {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) != me or fields[0] in "ZX":
                continue
            found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue
    return found


def _docker_engine(children: dict[int, str]) -> set[int]:
    """The processes of a Docker engine scripts/docker-setup.sh started for the HIL tests: a machine's service,
    as CI starts it before the tests.  With the test process a subreaper, the engine and its containers'
    shims (which leave their parent) are this process's children."""
    try:
        engine = int(Path("/run/rpcsrv-dockerd.pid").read_text())
    except (OSError, ValueError):
        return set()
    return {engine} | {pid for pid, cmd in children.items() if cmd.startswith("/usr/bin/containerd-shim")}


def _spare_worker() -> int | None:
    import sys

    process = sys.modules.get("rpcsrv.native.process")
    spare = getattr(getattr(process, "SPARES", None), "spare", None)
    proc = getattr(spare, "proc", None)
    return getattr(proc, "pid", None)


@pytest.fixture(scope="module", autouse=True)
def no_process_left_behind():
    """Fails the module (and kills what it left) if a child process it started outlives it."""
    import signal
    import time

    before = set(live_children())
    yield
    deadline = time.monotonic() + 5
    while True:
        children = live_children()
        spared = {_spare_worker()} | _docker_engine(children)
        left = {pid: cmd for pid, cmd in children.items() if pid not in before and pid not in spared}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, "processes left behind by this module: " + "; ".join(f"{p}: {c[:160]}" for p, c in left.items())
