"""A fresh, slow board: an empty cache and 15% of a CPU (a cgroup v1 ``cpu`` quota), confinement on.

On such a board the compiled kernels take minutes to build.  The first session's native call must still
succeed in ordinary time (the build runs in the background, at the lowest priority; workers never compile),
later sessions must pick up the native build once it exists, and no temporary file may survive any outcome,
a stopped or killed build included.  ``rpcsrv serve`` runs in a child process moved into the cgroup before it
starts; the real TVM client drives it from outside the cgroup.

Needs cgroup v1's cpu controller writable (root; CI runs as root on this kind of machine): without it the tests
skip, and fail under ``RPCSRV_REQUIRE_ALL=1``.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REQUIRE_ALL, ServerProcess, need_module, need_program
from native_helpers import kernel_inputs, tvm_kernels

CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
SLOW_QUOTA_US = 15_000  # 15% of one CPU: a board that needed over 30 s for the kernels
#: what "ordinary time" means for the first native call of the first session on the slow board (its worker
#: starts Python and numpy at 15% of a CPU); before, it failed at the worker's 30 s start window
FIRST_CALL_LIMIT = 25.0
_names = itertools.count()


def _missing(reason: str) -> None:
    if REQUIRE_ALL:
        pytest.fail(f"required by RPCSRV_REQUIRE_ALL=1 but missing: {reason}", pytrace=False)
    pytest.skip(reason)


class Cgroup:
    """A cgroup v1 cpu group with a CPU quota, removed (every process in it killed) at the end."""

    def __init__(self, quota_us: int):
        if not (CPU / "cpu.cfs_quota_us").is_file():
            _missing(f"no cgroup v1 cpu controller at {CPU}")
        self.path = CPU / f"rpcsrv-slow-{os.getpid()}-{next(_names)}"
        try:
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            self.quota(quota_us)
        except OSError as exc:
            if self.path.is_dir():
                self.path.rmdir()
            _missing(f"cannot make a cpu cgroup under {CPU} ({exc.strerror or exc}): needs root")

    def quota(self, quota_us: int) -> None:
        """``quota_us`` per 100 ms period (-1: none)."""
        (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))

    def procs(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def kill_all(self) -> None:
        """SIGKILL every process in the group (a board losing power): the server, its workers, its compiler."""
        for _ in range(100):
            procs = self.procs()
            if not procs:
                return
            for pid in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def remove(self) -> None:
        self.kill_all()
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)


@pytest.fixture
def slow():
    group = Cgroup(SLOW_QUOTA_US)
    yield group
    group.remove()


class BoardServer(ServerProcess):
    """``rpcsrv serve`` in ``group`` from its first instruction, with its own cache folder."""

    def __init__(self, group: Cgroup, cache: Path, workdir: Path, *args: str):
        need_program("cc", "the board's compiler")
        env = {k: v for k, v in os.environ.items() if k not in ("RPCSRV_CACHE_DIR", "RPCSRV_KERNELS_LIB",
                                                                   "RPCSRV_NATIVE_SHIM")}
        super().__init__("--cache-dir", str(cache), *args, workdir=workdir, env=env, flags=("-v",),
                         launch=("sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group.path / "cgroup.procs")))

    def wait_log(self, pattern: str, timeout: float) -> str:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            found = re.search(pattern, self.stderr())
            if found:
                return found.group(0)
            assert self.proc.poll() is None, f"the server ended:\n{self.stderr()}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in the server's log within {timeout:.0f} s:\n{self.stderr()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> Path:
    need_module("tvm", "compiles the native kernel")
    return tvm_kernels(tmp_path_factory.mktemp("tvm"), ["add_one_f32"])["add_one_f32"]


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    """model.so: y = sigmoid(x) on a (1, 8, 16, 16) x, ExampleJSON over the executor's kernels (no native code:
    it loads in the server's own process, where sigmoid is one of the compiled kernels)."""
    from onnx import TensorProto, helper

    from rpcsrv.client.compiler import compile_onnx

    node = helper.make_node("Sigmoid", ["x"], ["y"])
    g = helper.make_graph([node], "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])])
    path = tmp_path_factory.mktemp("graph") / "model.so"
    compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).export_library(str(path))
    return path


def _session(port: int):
    from tvm import rpc

    return rpc.connect("127.0.0.1", port)


def _graph_run(remote, path: Path) -> None:
    """The graph executor on the board (in the server's process), checked against numpy."""
    import tvm

    dev = remote.cpu()
    remote.upload(str(path))
    m = remote.load_module(path.name)["default"](dev)
    x = np.linspace(-6, 6, 8 * 16 * 16, dtype=np.float32).reshape(1, 8, 16, 16)
    m["set_input"]("x", tvm.runtime.tensor(x, dev))
    m["run"]()
    np.testing.assert_allclose(m["get_output"](0).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def _native_call(remote, path: Path) -> None:
    """upload, load_module (in the session's confined worker), one native call, checked."""
    import tvm

    dev = remote.cpu()
    remote.upload(str(path))
    lib = remote.load_module(path.name)
    (a,) = kernel_inputs("add_one_f32")
    out = tvm.runtime.tensor(np.zeros(16, "float32"), dev)
    lib["add_one_f32"](tvm.runtime.tensor(a, dev), out)
    np.testing.assert_array_equal(out.numpy(), a + 1)


def test_first_native_call_on_a_fresh_slow_board(slow, kernel, graph, tmp_path):
    """15% of a CPU, an empty cache, confinement on: the first session's graph (in the server's process) and
    native call (in its worker) succeed in ordinary time while the kernels build; after the build, the server
    and the next session's worker use the board's own build; the cache holds the two libraries and nothing
    else."""
    cache = tmp_path / "cache"
    srv = BoardServer(slow, cache, tmp_path)
    try:
        start = time.monotonic()
        remote = _session(srv.port)
        _graph_run(remote, graph)
        ran = time.monotonic() - start
        _native_call(remote, kernel)
        first = time.monotonic() - start
        assert first < FIRST_CALL_LIMIT, f"the first native call took {first:.1f} s:\n{srv.stderr()}"
        assert "did not start" not in srv.stderr()
        assert not list(cache.glob("libkernels-*.so")), "built at 15% of a CPU before the first call returned?"
        slow.quota(-1)  # the rest at full speed: the build finishes, and later sessions must pick it up
        srv.wait_log(r"kernels built and in use: \S+", 300)
        built = next(cache.glob("libkernels-*.so"))
        assert str(built) in _maps(srv.proc.pid)  # the server's own sessions compute with it from now on
        remote = _session(srv.port)
        _graph_run(remote, graph)
        _native_call(remote, kernel)
        workers = [pid for pid in _children(srv.proc.pid) if str(built) in _maps(pid)]
        assert workers, "no native worker of the server loaded the board's build"
        assert _only_libraries(cache) == {"libkernels", "libshim"}
    finally:
        assert srv.stop() == 0, srv.stderr()
    print(f"on the slow board: the first graph ran in {ran:.1f} s, the first native call returned at {first:.1f} s")


def test_no_temporary_file_survives_a_stopped_or_killed_build(slow, tmp_path):
    """A build stopped by the server's own stop leaves nothing (its compiler ended with it); one killed with
    the whole board leaves its build folder, which the next start recognises as abandoned and removes."""
    cache = tmp_path / "cache"
    srv = BoardServer(slow, cache, tmp_path)
    _compiling_kernels(slow, 60)
    assert [p for p in cache.iterdir() if p.name.startswith(".build-")]
    assert srv.stop() == 0, srv.stderr()
    assert _only_libraries(cache) <= {"libshim"}, list(cache.iterdir())
    until = time.monotonic() + 5  # (a killed compiler's processes leave the group as they are reaped)
    while slow.procs() and time.monotonic() < until:
        time.sleep(0.05)
    assert slow.procs() == [], "the compiler outlived the server"

    srv = BoardServer(slow, cache, tmp_path)  # (the shim is cached: the kernels' build starts at once)
    _compiling_kernels(slow, 60)
    time.sleep(1.0)  # the compiler is writing into its folder
    slow.kill_all()
    srv.proc.wait(10)
    left = [p for p in cache.iterdir() if p.name.startswith(".build-")]
    assert left, "the kill left nothing to clean up: the test proves nothing"

    srv = BoardServer(slow, cache, tmp_path, "--build", "off")
    try:
        srv.wait_log(r"removed what killed builds left", 30)
        assert _only_libraries(cache) <= {"libshim"}, list(cache.iterdir())
    finally:
        assert srv.stop() == 0, srv.stderr()


def _compiling_kernels(group: Cgroup, timeout: float) -> None:
    """Wait until a process of ``group`` compiles the executor's kernels (the shim, if built, is done)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        for pid in group.procs():
            try:
                if b"/executor/kernels/" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError("the kernels' build did not start")


def _only_libraries(cache: Path) -> set[str]:
    """The kinds of file in the cache (``libshim``, ``libkernels``); a temporary file fails the test."""
    names = [p.name for p in cache.iterdir()]
    assert all(n.startswith(("libshim-", "libkernels-")) and n.endswith(".so") for n in names), names
    return {n.split("-")[0] for n in names}
