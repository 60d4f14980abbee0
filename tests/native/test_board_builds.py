"""What a board builds, where, and who may build it (``rpcsrv.config.toolchain``, ``rpcsrv.native.builds``):
a build's private folder and the sweep of those killed builds left, a compiler a stop ends, workers that load
what their server gives them and never compile, a background build's library installed without breaking the
plans made before, ``rpcsrv check --cache-dir`` building ahead of time.  (The slow board itself:
``test_slow_board.py``.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import need_program
from rpcsrv.config.toolchain import BUILD_PREFIX, STALE_TEMP, BuildSettings, Compiler, build_folder, sweep
from rpcsrv.executor.kernels import plan_support
from rpcsrv.executor.kernels.clib import compiled, kbuild, kcache
from rpcsrv.native import process


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_what_killed_builds_left_and_nothing_else(tmp_path):
    dead = tmp_path / f"{BUILD_PREFIX}{_dead_pid()}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "ccXYZ.o").write_bytes(b"x")
    alive = tmp_path / f"{BUILD_PREFIX}{os.getpid()}-def"  # a build under way in a running process
    alive.mkdir()
    old, fresh = tmp_path / "tmpold.so", tmp_path / "tmpfresh.so"  # older versions' temporary libraries
    for path in (old, fresh):
        path.write_bytes(b"")
    os.utime(old, (time.time() - STALE_TEMP - 10,) * 2)
    kept = tmp_path / "libkernels-0123.so"
    kept.write_bytes(b"lib")
    assert sorted(sweep(tmp_path)) == sorted([dead, old])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, fresh.name, kept.name])
    assert sweep(tmp_path / "missing") == []


def test_a_build_folder_is_removed_on_every_way_out(tmp_path):
    with pytest.raises(RuntimeError):
        with build_folder(tmp_path / "cache") as folder:
            (folder / "half.so").write_bytes(b"x")
            raise RuntimeError("the compiler failed")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_stopped_compiler_ends_with_everything_it_started(tmp_path):
    """``Compiler.stop`` kills the command's process group (a compiler driver and its cc1 alike); its temporary
    files were in the build folder (TMPDIR)."""
    compiler = Compiler(tmp_path)
    pids = tmp_path / "pids"
    out: dict = {}

    def run():
        try:
            compiler.run(["sh", "-c", f'echo "$TMPDIR" > {tmp_path}/tmpdir; sleep 60 & echo $! > {pids}; wait'],
                         timeout=60)
        except subprocess.SubprocessError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    start = time.monotonic()
    thread.start()
    while not (pids.is_file() and pids.read_text().strip()):
        time.sleep(0.01)
    compiler.stop()
    thread.join(10)
    assert time.monotonic() - start < 10 and "stopped" in str(out["error"])
    grandchild = int(pids.read_text())
    for _ in range(100):
        if _gone(grandchild):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the compiler's child outlived the stop")
    assert (tmp_path / "tmpdir").read_text().strip() == str(tmp_path)
    with pytest.raises(subprocess.SubprocessError):
        compiler.run(["true"])


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended (a zombie counts: reaped here when it was reparented to this process)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    if state in ("Z", "X"):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return True
    return False


@pytest.fixture(scope="module")
def generic(tmp_path_factory) -> Path:
    """The kernels built generic (-O3), as a wheel's prebuilt: one library the tests give and install."""
    out = tmp_path_factory.mktemp("generic") / kbuild.LIBRARY
    kbuild.compile_kernels(need_program("cc", "builds the kernels"), out, kbuild.GENERIC)
    return out


@pytest.fixture
def recorder(tmp_path) -> tuple[Path, Path]:
    """A C compiler that records each run (then runs the real one): (the compiler, its record)."""
    cc = need_program("cc", "the board's compiler")
    marker = tmp_path / "compiled"
    script = tmp_path / "cc-recorder"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {cc} \"$@\"\n")
    script.chmod(0o755)
    return script, marker


def _worker(config: process.WorkerConfig) -> process.WorkerProcess:
    return process.WorkerProcess(config)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_worker_loads_what_its_server_gave_and_never_compiles(recorder, generic, tmp_path):
    """A confined worker with an empty cache and a compiler it could run: given no kernels, it runs numpy;
    given the server's build, it maps that file.  Neither compiles (before: ``_preload`` built the kernels
    inside the 30 s start window)."""
    cc, marker = recorder
    settings = {"RPCSRV_CC": str(cc), "RPCSRV_CACHE_DIR": str(tmp_path / "empty-cache")}
    built = generic
    for kernels in (None, str(built)):
        worker = _worker(process.WorkerConfig(settings=settings, confine=True, kernels=kernels))
        try:
            maps = _maps(worker.proc.pid)
        finally:
            worker.kill()
            os.close(worker.arena_fd)
        assert (str(built) in maps) == (kernels is not None)
        assert "libkernels" not in maps.replace(str(built), "")
    assert not marker.exists(), marker.read_text()
    assert not (tmp_path / "empty-cache").exists()


def test_the_start_message_carries_the_servers_shim_and_kernels():
    from rpcsrv.native.confine import ConfineOptions
    from rpcsrv.native.shim import shim_path

    config = process.worker_config(ConfineOptions())
    assert config.shim == str(shim_path())
    assert config.kernels == compiled.in_use_path() and (config.kernels is None) == (compiled.library() is None)


def test_given_policies_never_build(recorder, tmp_path):
    """A process told ``given`` with nothing (a worker whose server had nothing yet) runs numpy and has no
    shim, with a reason; the compiler is never run (in a fresh interpreter: this one has its shim loaded)."""
    cc, marker = recorder
    code = """if True:
        from rpcsrv.executor.kernels.clib import compiled
        from rpcsrv.native import shim
        shim.POLICY.configure("given")
        compiled.POLICY.configure("given")
        assert compiled.library() is None
        print(compiled.status()["reason"])
        try:
            shim.load_shim()
        except shim.ShimUnavailable as exc:
            print(exc)
    """
    env = {**os.environ, "RPCSRV_CC": str(cc), "RPCSRV_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "the server had no compiled kernels" in out.stdout and "the server had none" in out.stdout
    assert not marker.exists() and not (tmp_path / "cache").exists()


@pytest.fixture
def restored():
    """The kernels' policy and state as this test process had them, after the test."""
    yield
    compiled.POLICY.configure()
    compiled.reset()


def test_background_policy_serves_without_building_then_installs(recorder, generic, tmp_path, monkeypatch,
                                                                 restored):
    """A server's process (``background``): the first use finds nothing and builds nothing (numpy runs, the
    reason says the build is under way); the build's library is installed for new plans while a plan made
    with the library before stays valid (both loaded); a reset invalidates both."""
    cc, marker = recorder
    monkeypatch.setenv("RPCSRV_CC", str(cc))
    monkeypatch.delenv("RPCSRV_KERNELS_LIB", raising=False)
    monkeypatch.setattr(compiled, "PREBUILT", tmp_path / "no-prebuilt")
    settings = BuildSettings(tmp_path / "cache")
    compiled.POLICY.configure("background", settings)
    compiled.POLICY.idle.clear()
    compiled.reset()
    assert compiled.library() is None and "being built in the background" in compiled.status()["reason"]
    assert "under way in the background" in compiled.report()["summary"]
    assert not marker.exists()

    compiled.install(generic, "an earlier build")
    lib_a = compiled.library()
    plan_valid = plan_support.in_use(lib_a)
    with monkeypatch.context() as m:  # what the background thread runs (with the recorder), on one small source
        m.setattr(kbuild, "SOURCES", (kbuild.source("norm.c"),))
        path, origin = kcache.build(settings)
        assert path == kcache.cache_path(settings.folder())
    assert marker.exists() and origin.startswith(f"built with {cc}")
    assert [p.name for p in settings.folder().iterdir()] == [path.name]  # its build folder is gone
    second = tmp_path / "second.so"
    shutil.copy(generic, second)  # (the library a full build makes: the small one lacks most functions)
    compiled.install(second, origin)
    compiled.POLICY.idle.set()
    assert compiled.library() is not lib_a and compiled.in_use_path() == str(second)
    assert plan_valid()
    compiled.reset()
    assert not plan_valid()


def test_check_builds_ahead_into_the_cache_dir(tmp_path):
    """``rpcsrv check --cache-dir DIR``: the shim and this CPU's kernels built there, nothing else left."""
    need_program("cc", "the board's compiler")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("RPCSRV_CACHE_DIR", "RPCSRV_KERNELS_LIB")}
    out = subprocess.run([sys.executable, "-m", "rpcsrv", "check", "--cache-dir", str(cache), "--json",
                          "--native", "inprocess"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    names = sorted(p.name.split("-")[0] for p in cache.iterdir())
    assert names == ["libcheck", "libkernels", "libshim"], names
