"""Building the distribution where only the host's compiler exists (issue 24): ``pip install .`` on a
machine with gcc but no cross compilers still works and prebuilds only the host's shim and executor kernels (the other
machines compile at first use); ``RPCSRV_PREBUILT_REQUIRE=1`` turns the missing ones into an error;
and the sdist carries the C sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import need_program
from install_fixtures import _checkout_copy
from rpcsrv.executor.kernels.clib import kbuild


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return _checkout_copy(tmp_path_factory.mktemp("src") / "rpcsrv")


@pytest.fixture(scope="module")
def host_only_path(tmp_path_factory) -> str:
    """A PATH with python, the host's cc/gcc and binutils, and no cross compiler."""
    bin_dir = tmp_path_factory.mktemp("hostbin")
    for tool in ("cc", "gcc", "as", "ld"):
        os.symlink(need_program(tool, "the host's compiler"), bin_dir / tool)
    os.symlink(sys.executable, bin_dir / "python")
    return str(bin_dir)


def _wheel(source: Path, out: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    scrubbed = {k: v for k, v in os.environ.items() if k not in ("CC", "RPCSRV_CC", "RPCSRV_PREBUILT_REQUIRE")}
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=600,
                          env={**scrubbed, "PATH": path, **env})


def test_pip_wheel_with_the_host_compiler_only_prebuilds_the_host_shim(source, host_only_path, tmp_path):
    assert shutil.which("aarch64-linux-gnu-gcc", path=host_only_path) is None
    done = _wheel(source, tmp_path, host_only_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    prebuilt = sorted(n for n in zipfile.ZipFile(wheel).namelist() if "/prebuilt/" in n)
    host = subprocess.run(["gcc", "-dumpmachine"], capture_output=True, text=True).stdout.strip()
    variants = [kbuild.variant_name(v) for v, _, _ in kbuild.VARIANTS.get(host, ())]
    kernels = [f"rpcsrv/executor/kernels/clib/prebuilt/{host}/{name}"
               for name in sorted([*variants, "libkernels.sha256", "libkernels.so"])]
    shims = [f"rpcsrv/native/prebuilt/{host}/libcheck.so", f"rpcsrv/native/prebuilt/{host}/libshim.so"]
    assert prebuilt == kernels + shims


def test_prebuilt_require_fails_the_build_without_the_cross_compilers(source, host_only_path, tmp_path):
    """(setup.py's build_py alone, as the wheel build runs it: the build environment is not the point here)"""
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "RPCSRV_CC")}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path / "lib")], cwd=source,
                          capture_output=True, text=True, timeout=300,
                          env={**env, "PATH": host_only_path, "RPCSRV_PREBUILT_REQUIRE": "1"})
    assert done.returncode != 0
    assert "RPCSRV_PREBUILT_REQUIRE=1: prebuilt shims for" in done.stdout + done.stderr, done.stderr[-2000:]
    assert "aarch64-linux-gnu-gcc not found" in done.stderr


def test_the_sdist_carries_the_c_sources(source, tmp_path):
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    names = tarfile.open(tmp_path / done.stdout.strip().splitlines()[-1]).getnames()
    for part in ("rpcsrv/native/shim.c", "rpcsrv/native/check_kernel.c", "rpcsrv/native/shimbuild.py", "setup.py"):
        assert any(n.endswith(part) for n in names), part
    assert not any("/prebuilt/" in n for n in names), "the sdist builds its shims where it is installed"
