"""Each confinement layer on its own (rpcsrv/native/confine*.py), applied in a child Python process:
what it refuses and what it still allows; the filter's system call numbers against the kernel headers
where they are installed; the report of the layers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpcsrv.native import confine, confine_landlock, confine_seccomp

LINUX = sys.platform.startswith("linux")
pytestmark = pytest.mark.skipif(not LINUX, reason="worker confinement is Linux only")


def _child(code: str, tmp_path: Path) -> str:
    """Run ``code`` in a fresh Python (after ``from rpcsrv.native import ...``); its stdout."""
    prelude = "import os, sys, errno\nfrom rpcsrv.native import confine, confine_landlock, confine_seccomp\n"
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _header_numbers(path: str, prefix: str = "__NR_") -> dict[str, int]:
    """The header's call numbers, by name; a number defined through another (asm-generic's
    ``#define __NR_fcntl __NR3264_fcntl``) resolved."""
    text = Path(path).read_text()
    values = {m.group(1): m.group(2) for m in re.finditer(r"#define (\w+)\s+(\w+)\b", text)}
    numbers = {}
    for name, value in values.items():
        if name.startswith(prefix):
            while value in values and not value.isdigit():
                value = values[value]
            if value.isdigit():
                numbers[name[len(prefix):]] = int(value)
    return numbers


@pytest.mark.parametrize("arch,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                         ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_syscall_numbers_match_the_kernel_headers(arch, header):
    if not os.path.exists(header):
        pytest.skip(f"no {header} (linux-libc-dev)")
    known = _header_numbers(header)
    col = confine_seccomp.ARCHES[arch][1]
    checked = 0
    for name, numbers in confine_seccomp.SYSCALLS.items():
        if numbers[col] is None:
            # (asm-generic also defines the 32-bit machines' names, under #if __BITS_PER_LONG == 32)
            assert name not in known or arch == "aarch64" and name.endswith(("32", "fcntl64")), (arch, name)
            continue
        if name not in known:  # a call newer than the installed headers (fchmodat2 is 6.6's)
            assert numbers[col] > max(known.values()), (arch, name)
            continue
        assert known[name] == numbers[col], (arch, name, known[name], numbers[col])
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("arch", sorted(confine_seccomp.ARCHES))
def test_filter_program_is_well_formed(arch):
    prog = confine_seccomp.program(arch, 1234)
    assert len(prog) < 4096
    for i, (code, jt, jf, _k) in enumerate(prog):
        if code & 0x07 == 0x05:  # a jump: both targets inside the program
            assert i + 1 + max(jt, jf) < len(prog), (arch, i)
    assert prog[-1] == (confine_seccomp.RET_K, 0, 0, confine_seccomp.RET_ALLOW)


def test_seccomp_alone(tmp_path):
    """No sockets, fork, exec or signals to others; threads and signals to itself still work."""
    out = _child("""
        confine_landlock._libc.prctl(38, 1, 0, 0, 0)  # no_new_privs, as the worker has by then
        print(confine_seccomp.install())
        import socket, threading, subprocess, signal
        for what, f in [("socket", lambda: socket.socket()), ("fork", os.fork),
                        ("exec", lambda: subprocess.run(["true"])),
                        ("kill parent", lambda: os.kill(os.getppid(), 0))]:
            try:
                f(); print(what, "allowed")
            except OSError as e:
                print(what, errno.errorcode[e.errno])
        t = threading.Thread(target=lambda: None); t.start(); t.join(); print("thread ok")
        os.kill(os.getpid(), 0); print("self ok")
    """, tmp_path)
    assert "all threads" in out
    for what in ("socket", "fork", "exec", "kill parent"):
        assert f"{what} EPERM" in out, out
    assert "thread ok" in out and "self ok" in out


@pytest.mark.skipif(confine_landlock.abi_version() < 1, reason="this kernel has no Landlock")
def test_landlock_alone(tmp_path):
    """Read-only trees readable, the workspace writable, everything else refused."""
    ws = tmp_path / "ws"
    ws.mkdir()
    out = _child(f"""
        import rpcsrv, numpy
        roots = sorted({{os.path.realpath(p) for p in [sys.prefix, sys.base_prefix, *sys.path] if p}})
        print(confine_landlock.restrict(roots, [{str(ws)!r}]))
        for path in ("/etc/passwd", "/etc/hostname"):
            try:
                open(path).read(); print(path, "read")
            except OSError as e:
                print(path, errno.errorcode[e.errno])
        with open({str(ws / "f")!r}, "w") as f:
            f.write("ok")
        print("workspace", open({str(ws / "f")!r}).read())
        try:
            os.listdir("/"); print("/ listed")
        except OSError as e:
            print("/", errno.errorcode[e.errno])
    """, tmp_path)
    assert "Landlock ABI" in out
    assert "/etc/passwd EACCES" in out and "/ EACCES" in out and "workspace ok" in out, out


def test_memory_alone(tmp_path):
    """RLIMIT_DATA = data now + budget + headroom: a large allocation fails with MemoryError."""
    out = _child("""
        import numpy as np
        print(confine._memory({"budget": 64 << 20, "headroom": confine.HEADROOM}))
        a = np.ones(32 << 20, np.uint8); print("32 MiB ok")
        try:
            b = np.ones(1 << 30, np.uint8); print("1 GiB allowed")
        except MemoryError:
            print("1 GiB MemoryError")
    """, tmp_path)
    assert "RLIMIT_DATA" in out and "32 MiB ok" in out and "1 GiB MemoryError" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="the identity drop is for root servers")
def test_identity_alone(tmp_path):
    out = _child("""
        import pwd
        pw = pwd.getpwnam("nobody")
        print(confine._identity({"ids": (pw.pw_uid, pw.pw_gid)}))
        print("uid", os.getuid(), os.geteuid(), os.getgroups())
        try:
            os.setuid(0); print("setuid allowed")
        except OSError as e:
            print("setuid", errno.errorcode[e.errno])
    """, tmp_path)
    assert "no capabilities" in out and "setuid EPERM" in out, out
    assert re.search(r"uid (\d+) \1 \[\]", out) and "uid 0 " not in out, out


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("RPCSRV_TEST_SECRET", "s3cret")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MY_SETTING", "x")
    env = confine.worker_env(dict(os.environ), confine.ConfineOptions(env=("MY_*",)))
    assert "RPCSRV_TEST_SECRET" not in env and "PATH" not in env and "HOME" not in env
    assert env["OMP_NUM_THREADS"] == "2" and env["MY_SETTING"] == "x"
    assert not [k for k in env if k.startswith("RPCSRV_")]  # rpcsrv's settings come in the start message


def test_layers_report(monkeypatch):
    found = confine.layers()
    assert set(found) == set(confine.LAYERS)
    assert found["files"].startswith("in force: Landlock") == (confine_landlock.abi_version() > 0)
    off = confine.ConfineOptions(enabled=False)
    assert all(v.startswith("off") for v in confine.layers(off).values())
    assert "--native-confine off" in confine.report(options=off)


def test_server_logs_the_layers_at_start_up():
    from conftest import ServerProcess

    srv = ServerProcess("-v")
    try:
        log = srv.stderr()
    finally:
        srv.stop()
    assert "native worker confinement" in log
    for name in confine.LAYERS:
        assert re.search(rf"{name}\s+(in force|absent)", log), (name, log)
    srv = ServerProcess("--native-confine", "off")
    try:
        assert "--native-confine off" in srv.stderr()  # a warning even without -v
    finally:
        srv.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="the worker user is looked up only by a root server")
def test_unknown_native_user_stops_the_server():
    proc = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--native-user", "no-such-user-x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no-such-user-x" in proc.stderr and "no such user" in proc.stderr
