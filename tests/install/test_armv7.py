"""A 32-bit board for real (issue 24): the built wheel in an armhf (armv7 hard-float) Debian userland,
run under qemu-user emulation, serves the real apache-tvm client, which cross-compiles kernels for
``armv7a-linux-gnueabihf`` (a parallel kernel with a workspace, float64, a dynamic shape) and a Relax
VM executable: 32-bit pointers in DLTensor, TVMValue/TVMFFIAny and the shape objects, checked by
the results.  ``rpcsrv check`` there takes the prebuilt armv7 shim and executor kernels (NEON).

Needs an armhf root filesystem with python3 and python3-numpy: ``RPCSRV_ARMHF_ROOTFS`` (a folder, e.g.
``debootstrap --arch=armhf --variant=minbase --include=python3,python3-numpy bookworm DIR``, about 5
minutes), else the armv7 board base that docker/base-image.sh caches as a tarball
(``$RPCSRV_DOCKER_CACHE/bookworm-board-armv7-*.tar``, unpacked for the module); and qemu-user binfmt
(Debian's qemu-user-static), root (chroot) and arm-linux-gnueabihf-gcc.  With neither rootfs it skips;
the Docker armv7 board covers the same ground in the HIL scenario.  The server runs in a private mount namespace
(``unshare -m``) with /proc mounted there, so nothing stays mounted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import install_fixtures
from conftest import need_module, need_program
from install_fixtures import board_requirements

built_wheel = install_fixtures.built_wheel  # the shared fixture


def _rootfs_source() -> Path | None:
    """The armhf userland: a folder (RPCSRV_ARMHF_ROOTFS) or the Docker armv7 base's cached tarball."""
    if os.environ.get("RPCSRV_ARMHF_ROOTFS"):
        return Path(os.environ["RPCSRV_ARMHF_ROOTFS"])
    cache = Path(os.environ.get("RPCSRV_DOCKER_CACHE", "/var/cache/rpcsrv-docker"))
    tars = sorted(cache.glob("bookworm-board-armv7-*.tar"), key=lambda p: p.stat().st_mtime)
    return tars[-1] if tars else None


def _build_base() -> Path | None:
    """Where everything is required (CI), the armv7 Docker board base is built here, or waited for if
    .ci/run's background build holds its lock (docker/base-image.sh: debootstrap under qemu-arm)."""
    if os.environ.get("RPCSRV_REQUIRE_ALL") != "1" or shutil.which("debootstrap") is None:
        return None
    script = Path(__file__).resolve().parents[2] / "docker" / "base-image.sh"
    subprocess.run(["sh", str(script), "board", "armv7"], check=True, timeout=3000, stdout=subprocess.DEVNULL)
    return _rootfs_source()


SOURCE = _rootfs_source()
pytestmark = pytest.mark.skipif(
    SOURCE is None and os.environ.get("RPCSRV_REQUIRE_ALL") != "1",  # required: the fixture builds it
    reason="no armhf userland: set RPCSRV_ARMHF_ROOTFS, or build the armv7 Docker board base "
           "(docker/base-image.sh board armv7)")
TRIPLE = "armv7a-linux-gnueabihf"
SITE = "/opt/rpcsrv-site"


@pytest.fixture(scope="module")
def rootfs(built_wheel, tmp_path_factory):
    root = SOURCE or _build_base()
    if root is None:
        pytest.fail("no armhf userland and no debootstrap to make one (scripts/docker-setup.sh installs it)",
                    pytrace=False)
    source = root
    if source.is_file():  # the Docker base's tarball, unpacked for this module and removed after it
        root = tmp_path_factory.mktemp("armhf")
        subprocess.run(["tar", "-C", str(root), "-xf", str(source)], check=True, timeout=600)
    try:
        yield _prepare(root, built_wheel)
    finally:
        if root != source:
            shutil.rmtree(root, ignore_errors=True)


def _prepare(root: Path, built_wheel: Path) -> Path:
    if not (root / "usr/bin/python3").exists() or os.geteuid() != 0:
        pytest.fail(f"{root} has no usr/bin/python3, or this is not root (chroot)", pytrace=False)
    need_program("unshare", "a private mount namespace for /proc")
    root.chmod(0o755)  # its / (pytest makes 0700 folders): the native worker's user must traverse it
    site = root / SITE.lstrip("/")
    shutil.rmtree(site, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--target", str(site)]
    subprocess.run([*pip, "--no-deps", str(built_wheel)], check=True, timeout=300)
    pure = [r for r in board_requirements(built_wheel) if not r.startswith("numpy")]  # numpy: Debian's
    subprocess.run([*pip, "--only-binary=:all:", "--platform", "linux_armv7l", "--python-version", "3.11", *pure],
                   check=True, timeout=300)
    return root


def _in_board(root: Path, *args: str) -> list[str]:
    """``args`` run inside the armhf userland (chroot, /proc of a private mount namespace)."""
    script = f'mount -t proc proc "{root}/proc" && exec chroot "{root}" /usr/bin/env PYTHONPATH={SITE} HOME=/tmp "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *args]


def test_rpcsrv_check_on_armv7(rootfs):
    done = subprocess.run(_in_board(rootfs, "python3", "-m", "rpcsrv", "check", "--json"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["machine"]["elf"] == "ARM ELF32 le hard-float"
    assert "prebuilt for arm-linux-gnueabihf" in report["native"]["shim"]
    assert "32-bit pointers" in report["smoke"]["native"]["detail"]
    # no compiler in the userland: the wheel's armv7 NEON build, since qemu's CPU has NEON (its AT_HWCAP says
    # so; /proc/cpuinfo is the host's here, as a 64-bit kernel's is to a 32-bit process)
    kernels = report["sections"]["kernels"]
    assert kernels["in_use"] and kernels["origin"] == "prebuilt for arm-linux-gnueabihf, neon", kernels


@pytest.fixture(scope="module")
def arm_server(rootfs, tmp_path_factory):
    log = tmp_path_factory.mktemp("armlog") / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(_in_board(rootfs, "python3", "-m", "rpcsrv", "serve", "--port", "0"),
                                stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    m = re.search(r":(\d+)", line)
    if not m:
        proc.kill()
        proc.wait()
        pytest.fail(f"rpcsrv did not start under emulation: {line!r} {log.read_text()[-2000:]}", pytrace=False)
    yield int(m.group(1))
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cross_compile(out: Path):
    tvm = need_module("tvm", "cross-compiles the kernels")
    from tvm import te

    cc = need_program("arm-linux-gnueabihf-gcc", "links the armv7 libraries")
    target = tvm.target.Target({"kind": "llvm", "mtriple": TRIPLE, "mfloat-abi": "hard", "mattr": ["+neon"]})
    fcompile = tvm.support.cc.cross_compiler(cc)
    install_fixtures.mirror_sum(out / "mirror_sum.so", target, fcompile)
    x = te.placeholder((4, 8), name="X", dtype="float64")
    y = te.compute((4, 8), lambda i, j: x[i, j] * x[i, j] + 1.0, name="Y")
    tvm.compile(te.create_prim_func([x, y]).with_attr("global_symbol", "square_plus_one"),
                target=target).export_library(str(out / "square_plus_one.so"), fcompile=fcompile)
    m = tvm.tirx.Var("m", "int64")
    p = te.placeholder((m,), name="P", dtype="int32")
    q = te.compute((m,), lambda i: p[i] * 3 + 1, name="Q")
    tvm.compile(te.create_prim_func([p, q]).with_attr("global_symbol", "dyn_affine"),
                target=target).export_library(str(out / "dyn_affine.so"), fcompile=fcompile)
    return tvm, install_fixtures.relax_mlp(out / "mlp.so", target, fcompile)


def test_cross_compiled_kernels_and_a_relax_vm_on_armv7(arm_server, tmp_path):
    tvm, mlp = _cross_compile(tmp_path)
    from tvm import relax, rpc

    remote = rpc.connect("127.0.0.1", arm_server, session_timeout=600)
    dev = remote.cpu()
    for name in ("mirror_sum", "square_plus_one", "dyn_affine", "mlp"):
        remote.upload(str(tmp_path / f"{name}.so"))
    a = np.random.default_rng(0).standard_normal(1024).astype("float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"), dev)
    remote.load_module("mirror_sum.so")["mirror_sum"](tvm.runtime.tensor(a, dev), out)
    np.testing.assert_allclose(out.numpy(), 2 * a + 2 * a[::-1], rtol=1e-6)
    x = np.arange(32, dtype="float64").reshape(4, 8) / 7
    y = tvm.runtime.tensor(np.zeros((4, 8), "float64"), dev)
    remote.load_module("square_plus_one.so")["square_plus_one"](tvm.runtime.tensor(x, dev), y)
    np.testing.assert_allclose(y.numpy(), x * x + 1, rtol=1e-12)
    dyn = remote.load_module("dyn_affine.so")["dyn_affine"]
    for size in (1, 37):
        p = np.arange(size, dtype="int32") - 5
        q = tvm.runtime.tensor(np.zeros(size, "int32"), dev)
        dyn(tvm.runtime.tensor(p, dev), q)
        np.testing.assert_array_equal(q.numpy(), p * 3 + 1)
    vm = relax.VirtualMachine(remote.load_module("mlp.so"), dev)
    v = np.random.default_rng(2).standard_normal((2, 16)).astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(v, dev)).numpy(), mlp(v), rtol=1e-4, atol=1e-4)
