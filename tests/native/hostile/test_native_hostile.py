"""Hostile native code against a real ``rpcsrv serve`` (run as whatever user the tests run as; as root,
the worker drops to an unprivileged user), uploaded and called by the real apache-tvm client.

Every case of ``hostile.c`` runs twice: with ``--native-confine on`` it must be refused (the call fails
with the kernel's reason) while benign native code in the same session goes on; with
``--native-confine off`` the same call must get through, which shows that each case really tries
something the worker could otherwise do (so these tests can fail).  The last test has the seccomp
filter kill a worker (a system call through another architecture's entry) and checks that only that
session's worker ended.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ServerProcess, need_module, need_program

tvm = need_module("tvm", "the real TVM client")
from tvm import rpc  # noqa: E402

HERE = Path(__file__).resolve().parent
SECRET = "RPCSRV_HOSTILE_SECRET"
EPERM, EACCES = "Operation not permitted", "Permission denied"
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def hostile_lib(tmp_path_factory):
    gcc = need_program("gcc", "builds the hostile native library")
    out = tmp_path_factory.mktemp("hostile") / "hostile.so"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(out), str(HERE / "hostile.c"), "-lpthread"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def world():
    """What the hostile code aims at, outside any workspace: a folder with a file and a mount point,
    a listening Unix socket anyone may connect to, and a process to trace."""
    base = Path(tempfile.mkdtemp(prefix="rpcsrv-hostile-", dir="/tmp"))
    base.chmod(0o755)
    (base / "mnt").mkdir()
    target = base / "target"
    target.write_text("outside")
    target.chmod(0o600)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(base / "engine.sock"))
    listener.listen(8)
    (base / "engine.sock").chmod(0o777)  # only the filter stands in the way
    victim = subprocess.Popen(["sleep", "120"])
    yield {"base": base, "victim": victim.pid}
    victim.kill()
    victim.wait()
    listener.close()
    subprocess.run(["umount", "-l", str(base / "mnt")], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module", params=["on", "off"])
def board(request, hostile_lib, world):
    """A server (--native-confine on/off) with a secret in its environment, a second session holding an
    upload, and one session with the hostile library loaded."""
    os.environ[SECRET] = "hunter2"
    try:
        srv = ServerProcess("--native-confine", request.param, "--max-memory-mb", "64")
    finally:
        del os.environ[SECRET]
    other = rpc.connect(srv.host, srv.port)
    other.upload(bytearray(b"the other session's data"), "secret.txt")
    other.upload(str(hostile_lib), "h.so")
    other.load_module("h.so")["benign"]()  # its worker is confined too: its workspace is the worker user's
    other_path = other.get_function("tvm.rpc.server.workpath")("secret.txt")
    remote = rpc.connect(srv.host, srv.port)
    remote.upload(str(hostile_lib), "hostile.so")
    lib = remote.load_module("hostile.so")
    link = remote.get_function("tvm.rpc.server.workpath")("link")  # where an upload would go
    yield {"confined": request.param == "on", "srv": srv, "lib": lib, "other": other, "other_path": other_path,
           "remote": remote, "link": link}
    del lib, remote, other
    assert srv.alive(), "the server died during the hostile tests"
    srv.stop()


def _cases(b: dict, w: dict) -> dict:
    """case -> (function, arguments, what the confined call's error says)."""
    pid, base = b["srv"].proc.pid, w["base"]
    return {
        "write /tmp": ("h_write_file", (f"/tmp/rpcsrv-hostile-{os.getpid()}-w",), EACCES),
        "read /etc/passwd": ("h_read_file", ("/etc/passwd",), EACCES),
        "read another session's upload": ("h_read_file", (b["other_path"],), EACCES),
        "list /": ("h_list_dir", ("/",), EACCES),
        "TCP socket": ("h_socket", (socket.AF_INET, socket.SOCK_STREAM), EPERM),
        "IPv6 socket": ("h_socket", (socket.AF_INET6, socket.SOCK_DGRAM), EPERM),
        "netlink socket": ("h_socket", (socket.AF_NETLINK, socket.SOCK_RAW), EPERM),
        "connect to the board's port": ("h_connect_tcp", (b["srv"].port,), EPERM),
        "connect to a Unix socket": ("h_connect_unix", (str(base / "engine.sock"),), EPERM),
        "fork and exec a shell": ("h_fork_exec", (), EPERM),
        "posix_spawn a shell": ("h_spawn", (), EPERM),
        "signal the server": ("h_kill", (pid, 0), EPERM),
        "process_vm_readv the server": ("h_vm_readv", (pid,), EPERM),
        "read the server's environ": ("h_read_file", (f"/proc/{pid}/environ",), EACCES),
        "a secret of the server's environment": ("h_getenv", (SECRET,), "No such file"),
        "run as root": ("h_is_root", (), "not root" if ROOT else None),
        "allocate and touch 1 GiB (budget 64 MiB)": ("h_alloc_touch", (1024,), "Cannot allocate memory"),
        "ptrace another process": ("h_ptrace", (w["victim"],), EPERM),
        "setuid back to root": ("h_setuid", (0,), EPERM if ROOT else None),
        "mount a tmpfs": ("h_mount", (str(base / "mnt"),), EPERM if ROOT else None),
        "chmod a file outside": ("h_chmod", (str(base / "target"), 0o600), EPERM),
        "write /proc/self/comm": ("h_overwrite", ("/proc/self/comm", "hostile"), EACCES),
        "io_uring": ("h_io_uring", (), EPERM),
        "set the server's limits (prlimit)": ("h_prlimit", (pid,), EPERM),
        "pin the server's CPUs": ("h_setaffinity", (pid,), EPERM),
        "route a descriptor's SIGIO to the server": ("h_setown", (pid,), EPERM),
        "symlink in the workspace to /etc/shadow": ("h_symlink", ("/etc/shadow", b["link"]), EACCES),
    }


CASES = list(_cases({"srv": type("S", (), {"proc": type("P", (), {"pid": 0}), "port": 0}), "other_path": "",
                     "link": ""},
                    {"base": Path("/"), "victim": 0}))


@pytest.mark.parametrize("case", CASES)
def test_hostile_case(board, world, case):
    func, args, refusal = _cases(board, world)[case]
    lib = board["lib"]
    if refusal is None:
        pytest.skip(f"{case}: only a root server can do this unconfined")
    if board["confined"]:
        with pytest.raises(Exception, match=re.escape(refusal)):
            lib[func](*args)
    else:
        lib[func](*args)  # it got through: this is what confinement stops
    assert lib["benign"]() == 42, "benign native code must go on in the same session"


def test_filter_kill_ends_only_that_worker(board, hostile_lib):
    """A system call through the i386 entry on x86-64: the filter kills the worker (SIGSYS), the
    session's call fails like a crash, and the session and the server go on."""
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the foreign-ABI case is x86-64's int 0x80")
    remote = rpc.connect(board["srv"].host, board["srv"].port)
    remote.upload(str(hostile_lib), "k.so")
    lib = remote.load_module("k.so")
    if board["confined"]:
        with pytest.raises(Exception, match="crashed.*SIGSYS"):
            lib["h_foreign_abi"]()
        lib = remote.load_module("k.so")  # a fresh worker for the session
    else:
        lib["h_foreign_abi"]()
    assert lib["benign"]() == 42
    assert board["lib"]["benign"]() == 42, "another session's worker is untouched"
    assert board["srv"].alive()


def _fresh_session(board, hostile_lib):
    remote = rpc.connect(board["srv"].host, board["srv"].port)
    remote.upload(str(hostile_lib), "k.so")
    return remote, remote.load_module("k.so")


def test_forged_answer_stops_only_that_worker(board, hostile_lib, world):
    """Native code writes the server a pickle that would run a command there: the server reads its worker's
    messages as untrusted (rpcsrv/native/confine_wire.py, confined or not), so it runs nothing and stops
    that worker; the session loads again and goes on."""
    marker = world["base"] / f"forged-{board['confined']}"
    remote, lib = _fresh_session(board, hostile_lib)
    with pytest.raises(Exception, match=r"posix\.system"):
        lib["h_forge_answer"](str(marker))
    assert not marker.exists(), "the forged message ran in the server"
    assert remote.load_module("k.so")["benign"]() == 42
    assert board["srv"].alive()


def test_shared_memory_cannot_shrink_under_the_server(board, hostile_lib):
    """The arenas the server maps are sealed against shrinking: truncating them (which would make the
    server's next read of a session buffer a SIGBUS) fails, and the session's buffers stay usable."""
    import numpy as np

    remote, lib = _fresh_session(board, hostile_lib)
    a = tvm.runtime.tensor(np.arange(16, dtype="float32"), remote.cpu())
    with pytest.raises(Exception, match=re.escape(EPERM)):
        lib["h_shrink_arenas"]()
    np.testing.assert_array_equal(a.numpy(), np.arange(16, dtype="float32"))
    assert lib["benign"]() == 42
    assert board["srv"].alive()


def test_a_lent_connection_cannot_reach_the_server(board, hostile_lib):
    """A repeated native call is answered by the worker holding the session's connection (rpcsrv/board/
    baton.py).  Native code run there makes every socket it holds blocking, with a 30 s linger and the
    server as the owner of its SIGIO: the server's reads and writes never wait anyway (MSG_DONTWAIT), it
    ignores SIGIO (confined, the filter refuses the owner), and it drops the linger before its last
    close; it keeps serving the other sessions, and the session itself goes on."""
    import gc
    import threading
    import time

    import numpy as np

    remote, lib = _fresh_session(board, hostile_lib)
    grab = lib["h_grab_sockets"]
    for _ in range(20):
        grab(board["srv"].proc.pid)  # repeated: run by the worker while it holds the connection
    time.sleep(0.3)  # the worker gives the idle connection back: the server waits on it again
    workpath = board["other"].get_function("tvm.rpc.server.workpath")
    served = []
    other = threading.Thread(target=lambda: served.extend(workpath("x") for _ in range(20)), daemon=True)
    other.start()  # (a server whose event loop blocked on the idle socket would never answer)
    other.join(10)
    assert len(served) == 20, "the other session was not served while the hostile one sat idle"
    a = tvm.runtime.tensor(np.arange(4, dtype="float32"), remote.cpu())
    np.testing.assert_array_equal(a.numpy(), np.arange(4, dtype="float32"))
    assert lib["benign"]() == 42
    del grab, lib, a, remote
    gc.collect()
    time.sleep(0.5)  # the server closes that session meanwhile: never waiting for a 30 s linger
    start = time.monotonic()
    for _ in range(20):
        assert workpath("x").endswith("x")
    assert time.monotonic() - start < 5
    assert board["srv"].alive()
