"""The HIL farm as local processes across network namespaces (no Docker).

Each board runs ``rpcsrv serve --tracker`` inside its own ``ip netns`` joined to the root namespace by
a veth pair on a private /30 this test creates (10.231.<n>.0/30: .1 in the root namespace, .2 in the
board's); TVM's tracker and the runner (``deploy/hil_runner.py``, TVM's real client) stay in the root
namespace, so every registration and every session crosses a real network boundary.  The tracker
listens on the first pair's root-side address; each board routes to it through its own pair.
Everything the test creates is removed afterwards.  Needs root and ``ip``; skipped otherwise (fails
under RPCSRV_REQUIRE_ALL=1).

An arm64 board joins the same way: the ``rpcsrv-board:arm64`` image (qemu-user emulation) started with
``--network none``, its namespace named with ``ip netns attach`` and given a veth pair like the others,
so that board too registers and serves across the boundary; it runs the native libraries the runner
cross-compiles for aarch64.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, _missing, need_module, need_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "deploy"))
from farm import TvmService, wait_until  # noqa: E402
from test_docker_hil import engine  # noqa: E402

KEY = "board-x"
SUBNET = 231  # 10.231.<first + i>.0/30


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Netns:
    """A namespace ``name`` linked to the root namespace by veth ``host_if`` (root) / ``eth0`` (inside)."""

    def __init__(self, index: int, tag: str, third: int, pid: int | None = None):
        self.pid = pid  # a process whose namespace this is (a container's), else a new namespace
        self.name = f"rpcsrv-{tag}-b{index}"
        self.host_if = f"rv{tag[-6:]}h{index}"
        self.host_ip = f"10.{SUBNET}.{third}.1"
        self.ip = f"10.{SUBNET}.{third}.2"

    def create(self) -> None:
        ip("netns", *(("attach", self.name, str(self.pid)) if self.pid else ("add", self.name)))
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        for cmd in (["addr", "add", f"{self.ip}/30", "dev", "eth0"], ["link", "set", "eth0", "up"],
                    ["link", "set", "lo", "up"], ["route", "add", "default", "via", self.host_ip]):
            ip("netns", "exec", self.name, "ip", *cmd)

    def remove(self) -> None:
        ip("link", "del", self.host_if, check=False)  # also removes the peer inside
        ip("netns", "del", self.name, check=False)


@pytest.fixture
def namespaces():
    need_program("ip", "iproute2 runs the network namespaces")
    if os.geteuid() != 0:
        _missing("network namespaces need root")
    tag = f"{os.getpid() % 100000}"
    third = 16 + os.getpid() % 200  # a /30 per board inside 10.231.0.0/16, unlikely to collide
    made = [Netns(i, tag, third + i) for i in range(2)]
    try:
        for ns in made:
            ns.create()
    except subprocess.CalledProcessError as exc:
        for ns in made:
            ns.remove()
        _missing(f"cannot create network namespaces here: {exc.stderr.strip()}")
    yield made
    for ns in made:
        ns.remove()
    leftovers = ip("netns", "list").stdout
    assert not any(ns.name in leftovers for ns in made)


def test_farm_across_network_namespaces(namespaces, tmp_path):
    need_module("tornado", "TVM's tracker needs tornado")
    need_module("tvm", "the real TVM tracker and client come from `pip install apache-tvm`")
    tracker = TvmService("tracker", None, host=namespaces[0].host_ip)
    boards, logs = [], []
    try:
        for i, ns in enumerate(namespaces):
            log = tempfile.TemporaryFile("w+")
            cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-m", "rpcsrv", "serve", "--host", ns.ip,
                   "--port", "9090", "--key", KEY, "--tracker", f"{tracker.host}:{tracker.port}",
                   "--workdir", str(tmp_path / f"board{i}")]
            boards.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)))
            logs.append(log)

        def text(i):
            logs[i].seek(0)
            return logs[i].read()

        assert wait_until(lambda: all("registered with tracker" in text(i) for i in range(2)), 20), text(0) + text(1)
        run = subprocess.run([sys.executable, str(REPO / "deploy" / "hil_runner.py"), "--tracker",
                              f"{tracker.host}:{tracker.port}", "--key", KEY, "--requests", "20", "--boards", "2",
                              "--wait", "30"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "runner: PASS" in run.stdout
        assert re.search(r"boards registered: \[\['10\.231\.\d+\.2', 9090\], \['10\.231\.\d+\.2', 9090\]\]",
                         run.stdout), run.stdout
        for i, ns in enumerate(namespaces):
            # each board saw the runner arrive from the root side of its own veth pair
            assert wait_until(lambda: text(i).count(f"session peer={ns.host_ip}:") >= 5, 10), text(i)
    finally:
        for p in boards:
            if p.poll() is None:
                p.terminate()
        for p in boards:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        tracker.stop()
    assert all(p.returncode == 0 for p in boards), [text(i) for i in range(2)]
    assert [x for i in range(2) for x in (tmp_path / f"board{i}").iterdir()] == []


def test_arm64_board_in_a_network_namespace(tmp_path):
    """The emulated arm64 board image behind its own veth pair: registers, serves every native case."""
    need_program("ip", "iproute2 runs the network namespaces")
    need_module("tornado", "TVM's tracker needs tornado")
    need_module("tvm", "the real TVM tracker and client come from `pip install apache-tvm`")
    need_program("aarch64-linux-gnu-gcc", "the runner links the arm64 libraries with it")
    if os.geteuid() != 0:
        _missing("network namespaces need root")
    docker = engine()
    build = subprocess.run(["sh", str(REPO / "docker" / "board-image.sh"), "arm64"], capture_output=True,
                           text=True, timeout=1800, env=dict(os.environ, DOCKER=docker))
    assert build.returncode == 0, build.stderr[-3000:]
    tag = f"{os.getpid() % 100000}"
    ns = Netns(2, tag, 16 + (os.getpid() + 100) % 200)
    tracker = None
    name = f"rpcsrv-netns-arm64-{os.getpid()}"
    try:
        # the tracker listens on the root side of the pair, which exists only once the pair does: the
        # board retries its registration until then
        run = subprocess.run([docker, "run", "-d", "--rm", "--network", "none", "--name", name, "rpcsrv-board:arm64",
                              "--key", "board-arm64", "--tracker", f"{ns.host_ip}:9190"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        ns.pid = int(subprocess.run([docker, "inspect", "-f", "{{.State.Pid}}", name], capture_output=True,
                                    text=True, check=True).stdout)
        ns.create()
        tracker = TvmService("tracker", 9190, host=ns.host_ip)

        def logs():
            out = subprocess.run([docker, "logs", name], capture_output=True, text=True)
            return out.stdout + out.stderr

        assert wait_until(lambda: "registered with tracker" in logs(), 120), logs()
        out = subprocess.run([sys.executable, str(REPO / "deploy" / "hil_runner.py"), "--tracker",
                              f"{ns.host_ip}:9190", "--board", "board-arm64=arm64", "--wait", "60"],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr + logs()
        assert f"boards registered: [['{ns.ip}', 9090]]" in out.stdout, out.stdout
        assert wait_until(lambda: logs().count(f"session peer={ns.host_ip}:") >= 6, 10), logs()
    finally:
        subprocess.run([docker, "stop", "-t", "10", name], capture_output=True, timeout=60)
        if tracker is not None:
            tracker.stop()
        ns.remove()
    assert ns.name not in ip("netns", "list").stdout
