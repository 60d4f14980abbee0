"""The installed package is the product (issue 24): the wheel, installed (not editable) into a fresh
virtualenv with the board's dependencies only and a PATH without any C compiler, serves the real
apache-tvm 0.27 client, which runs kernels it compiled (``tvm.compile`` -> ``export_library`` ->
``upload`` -> ``load_module`` -> call) and a Relax VM executable.  The shim comes prebuilt from the
wheel.  Also: the wheel holds no top-level package but ``rpcsrv``, and carries the shim's source.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module
import install_fixtures
from install_fixtures import InstalledServer

board_venv, built_wheel = install_fixtures.board_venv, install_fixtures.built_wheel  # the shared fixtures

tvm = need_module("tvm", "the real TVM client compiles and calls the kernels")
from tvm import relax, rpc, te  # noqa: E402


def test_the_wheel_holds_rpcsrv_only_with_the_shim_source_and_prebuilt_shims(built_wheel):
    names = zipfile.ZipFile(built_wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"rpcsrv"}, f"top-level entries besides rpcsrv: {sorted(tops - {'rpcsrv'})}"
    assert any(n.startswith("rpcsrv/client/") for n in names), "the client tools install as rpcsrv.client"
    root = Path(__file__).resolve().parents[2]
    sources = {str(p.relative_to(root)) for ext in ("*.c", "*.h")  # built on the board if need be
               for p in (root / "rpcsrv").rglob(ext)}
    assert {"rpcsrv/native/shim.c", "rpcsrv/native/check_kernel.c", "rpcsrv/executor/kernels/conv/dwconv.c",
            "rpcsrv/executor/kernels/conv/dwchan.c", "rpcsrv/executor/kernels/pool/pools.c",
            "rpcsrv/executor/kernels/clib/vec.h"} <= sources
    assert sources | {"rpcsrv/native/shimbuild.py"} <= set(names), sorted(sources - set(names))
    assert "rpcsrv/native/prebuilt/x86_64-linux-gnu/libshim.so" in names or not _x86_64()
    if os.environ.get("RPCSRV_PREBUILT_REQUIRE") == "1":  # CI: the cross compilers are there (.ci/run)
        for target in ("aarch64-linux-gnu", "arm-linux-gnueabihf"):
            for lib in ("libshim.so", "libcheck.so"):
                assert f"rpcsrv/native/prebuilt/{target}/{lib}" in names
    assert built_wheel.name.endswith("-py3-none-any.whl"), "one wheel for every board (docs/native.md)"


def test_the_prebuilt_shims_load_on_old_glibc_boards(built_wheel, tmp_path):
    """glibc 2.34 moved pthread_* into libc under a new symbol version; the prebuilt shims ask for the
    first versions instead (shim.c, RPCSRV_PORTABLE_GLIBC), so they load on glibc >= 2.17 (checked by
    hand on Debian 11, glibc 2.31, where a plain build of shim.c fails: GLIBC_2.34 not found)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with zipfile.ZipFile(built_wheel) as z:
        shims = [n for n in z.namelist() if n.endswith("/libshim.so")]
        assert shims
        for name in shims:
            path = tmp_path / name.replace("/", "_")
            path.write_bytes(z.read(name))
            with open(path, "rb") as f:
                needed = {aux.name for sec in ELFFile(f).iter_sections() if isinstance(sec, GNUVerNeedSection)
                          for _, auxes in sec.iter_versions() for aux in auxes}
            versions = [tuple(int(x) for x in v.split("_")[1].split(".")) for v in needed if v.startswith("GLIBC_")]
            assert versions and max(versions) <= (2, 17), f"{name} needs {sorted(needed)}"


def test_the_wheel_holds_a_kernels_library_per_compiler_built_from_its_sources(built_wheel, tmp_path):
    """Issue 27: the executor kernels prebuilt (generic, plus x86_64's x86-64-v3 and armv7's NEON) for exactly
    the targets the shims are, each the machine of that target's shim, with the hash of the wheel's own kernel
    sources."""
    import hashlib

    from rpcsrv.executor.kernels.clib import kbuild
    from rpcsrv.loader.machine import machine_of

    with zipfile.ZipFile(built_wheel) as z:
        names = z.namelist()
        kdir, ndir = "rpcsrv/executor/kernels/", "rpcsrv/native/prebuilt/"
        pdir = f"{kdir}clib/prebuilt/"
        shims = {n.split("/")[3] for n in names if n.startswith(ndir) and n.endswith("/libshim.so")}
        kernels = {n.split("/")[5] for n in names if n.startswith(pdir) and n.endswith("/libkernels.so")}
        assert kernels == shims and shims, (sorted(kernels), sorted(shims))
        by_name = lambda n: n.rsplit("/", 1)[1]  # noqa: E731 - the sources' order: their names (kbuild.SOURCES)
        sources = sorted((n for n in names if n.startswith(kdir) and n.endswith(".c")), key=by_name)
        headers = sorted((n for n in names if n.startswith(kdir) and n.endswith(".h")), key=by_name)
        assert len(sources) >= 10 and f"{kdir}conv/gemm.c" in sources and f"{kdir}clib/vec.h" in headers, \
            sources + headers
        digest = hashlib.sha256(b"".join(z.read(n) for n in sources + headers)).hexdigest()
        for target in kernels:
            assert z.read(f"{pdir}{target}/libkernels.sha256").decode().strip() == digest, target
            files = [f"{pdir}{target}/libkernels.so", f"rpcsrv/native/prebuilt/{target}/libshim.so"]
            files += [f"{pdir}{target}/{kbuild.variant_name(v)}"
                      for v, _, _ in kbuild.VARIANTS.get(target, ())]
            for name in files:
                (tmp_path / name.replace("/", "_")).write_bytes(z.read(name))
            machines = set()
            for name in files:
                with open(tmp_path / name.replace("/", "_"), "rb") as f:
                    machines.add(str(machine_of(f)))
            assert len(machines) == 1, (target, machines)
    if os.environ.get("RPCSRV_PREBUILT_REQUIRE") == "1":
        assert kernels == {"x86_64-linux-gnu", "aarch64-linux-gnu", "arm-linux-gnueabihf"} or not _x86_64()


def _x86_64() -> bool:
    import platform

    return platform.machine() == "x86_64"


def test_the_board_has_no_compiler_and_imports_the_installed_copy(board_venv):
    code = ("import shutil, rpcsrv, importlib.util as u; print(shutil.which('cc'), shutil.which('gcc'), "
            "shutil.which('clang')); print(rpcsrv.__file__); print([m for m in ('onnx', 'rich', 'tvm') "
            "if u.find_spec(m)])")
    done = board_venv.run(str(board_venv.python), "-c", code)
    assert done.returncode == 0, done.stderr
    which, where, extras = done.stdout.splitlines()
    assert which == "None None None"
    assert where.startswith(str(board_venv.root)) and "site-packages" in where
    assert extras == "[]", f"the board install pulled in client packages: {extras}"


def test_byoc_without_the_client_extra_says_what_to_install(board_venv):
    done = board_venv.run(board_venv.bin("byoc"), "--help")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and 'pip install "rpcsrv[client]"' in done.stderr, done.stderr


@pytest.fixture(scope="module")
def installed_server(board_venv):
    srv = InstalledServer(board_venv)
    yield srv
    assert srv.proc.poll() is None, f"the installed server died: {srv.stderr()[-2000:]}"
    srv.stop()


def _kernels(out_dir):
    """A parallel kernel with a workspace, and a plain one, compiled for this machine by apache-tvm."""
    par = out_dir / "mirror_sum.so"
    install_fixtures.mirror_sum(par)
    x = te.placeholder((4, 8), name="X", dtype="float32")
    y = te.compute((4, 8), lambda i, j: x[i, j] * x[i, j] + 1.0, name="Y")
    plain = out_dir / "square_plus_one.so"
    tvm.compile(te.create_prim_func([x, y]).with_attr("global_symbol", "square_plus_one"),
                target="llvm").export_library(str(plain))
    return par, plain


def test_tvm_compiled_kernels_run_on_the_installed_board(installed_server, tmp_path):
    par, plain = _kernels(tmp_path)
    remote = rpc.connect(installed_server.host, installed_server.port)
    dev = remote.cpu()
    remote.upload(str(par))
    lib = remote.load_module(par.name)
    a = np.random.default_rng(0).standard_normal(1024).astype("float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"), dev)
    lib["mirror_sum"](tvm.runtime.tensor(a, dev), out)
    np.testing.assert_allclose(out.numpy(), 2 * a + 2 * a[::-1], rtol=1e-6)
    remote.upload(str(plain))
    lib2 = remote.load_module(plain.name)
    x = np.arange(32, dtype="float32").reshape(4, 8) / 7
    y = tvm.runtime.tensor(np.zeros((4, 8), "float32"), dev)
    lib2["square_plus_one"](tvm.runtime.tensor(x, dev), y)
    np.testing.assert_allclose(y.numpy(), x * x + 1, rtol=1e-6)


def test_a_relax_vm_executable_runs_on_the_installed_board(installed_server, tmp_path):
    lib_path = tmp_path / "mlp.so"
    reference = install_fixtures.relax_mlp(lib_path)
    remote = rpc.connect(installed_server.host, installed_server.port)
    remote.upload(str(lib_path))
    vm = relax.VirtualMachine(remote.load_module(lib_path.name), remote.cpu())
    x = np.random.default_rng(2).standard_normal((2, 16)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x, remote.cpu())).numpy()
    np.testing.assert_allclose(out, reference(x), rtol=1e-4, atol=1e-4)


def test_rpcsrv_check_on_the_installed_board_finds_the_prebuilt_shim_and_kernels(board_venv):
    """No compiler, an empty cache: the shim and the executor kernels (issue 27) come prebuilt from the wheel."""
    done = board_venv.run(board_venv.bin("rpcsrv"), "check", "--json", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    native = report["native"]
    assert native["compiler"] is None
    assert "prebuilt for" in native["shim"], native
    assert report["smoke"]["native"]["ok"] and report["smoke"]["examplejson"]["ok"], report["smoke"]
    kernels = report["sections"]["kernels"]
    assert kernels["in_use"] and kernels["origin"].startswith("prebuilt for "), kernels
    assert kernels["summary"].startswith("compiled kernels in use (prebuilt for "), kernels
    assert "/site-packages/rpcsrv/executor/kernels/clib/prebuilt/" in kernels["library"], kernels
    if _x86_64():
        assert kernels["origin"].startswith("prebuilt for x86_64-linux-gnu, "), kernels
    assert not (board_venv.home / "cache").exists() or not any((board_venv.home / "cache").glob("libkernels*"))
