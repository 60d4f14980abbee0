"""Fixtures of the install tests: the wheel built once per test session from a copy of the checkout,
installed (not editable) into a fresh virtualenv that has the board's dependencies only, run with a
PATH that holds no C compiler; and ``rpcsrv serve`` started from that install.

The wheel is built by pip with build isolation, as a user's ``pip install .`` does (the setuptools
backend runs ``setup.py``, which compiles the shims with the compilers it finds).  The board's
dependencies are installed at the versions of this test environment (resolved from pip's cache).
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from conftest import REPO, REQUIRE_ALL

#: variables that would let the board find a compiler, a shim or the source tree
SCRUB = ("CC", "CXX", "RPCSRV_CC", "RPCSRV_NATIVE_SHIM", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


def _pip(*args: str, timeout: float = 600) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        msg = f"pip {' '.join(args)} failed:\n{done.stdout[-1500:]}\n{done.stderr[-2500:]}"
        if REQUIRE_ALL:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def _checkout_copy(dest: Path) -> Path:
    """The files git knows (committed or not, minus ignored ones), copied: a clean checkout.  Outside a
    git checkout, the tree without what builds and runs leave behind."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        junk = shutil.ignore_patterns("build", "dist", "*.egg-info", ".venv", "__pycache__", ".git", "prebuilt",
                                      ".pytest_cache", ".hypothesis")
        shutil.copytree(REPO, dest, ignore=junk)
        return dest
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps`` of a copy of the checkout: the wheel a user's ``pip install .`` makes."""
    base = tmp_path_factory.mktemp("wheel")
    src = _checkout_copy(base / "src")
    _pip("wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(src))
    (wheel,) = (base / "dist").glob("rpcsrv-*.whl")
    return wheel


def board_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without an extra, pinned to this environment's versions where known."""
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        if "extra ==" in req:
            continue
        name = re.split(r"[<>=!~;\[ (]", req, maxsplit=1)[0]
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(req.split(";")[0].strip())
    return out


class BoardVenv:
    """A virtualenv holding the installed wheel and the board's dependencies, nothing else (no pip)."""

    def __init__(self, root: Path, wheel: Path):
        self.root = root
        venv.EnvBuilder(with_pip=False).create(root)
        self.python = root / "bin" / "python"
        self.home = root / "home"
        self.home.mkdir()
        _pip("--python", str(self.python), "install", "-q", "--no-deps", str(wheel))
        _pip("--python", str(self.python), "install", "-q", *board_requirements(wheel))

    def env(self, **extra: str) -> dict:
        """The board's environment: PATH is the venv's bin only, no compiler variables, an empty HOME
        (so no cached shim from an earlier run) and cache folder."""
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env.update(PATH=str(self.root / "bin"), HOME=str(self.home), RPCSRV_CACHE_DIR=str(self.home / "cache"))
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
        """``args`` run with the board's environment, from a folder outside the checkout."""
        return subprocess.run(list(args), env=self.env(**extra), cwd=self.home, capture_output=True, text=True,
                              timeout=timeout)

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)


@pytest.fixture(scope="session")
def board_venv(built_wheel, tmp_path_factory) -> BoardVenv:
    return BoardVenv(tmp_path_factory.mktemp("board") / "venv", built_wheel)


class InstalledServer:
    """``rpcsrv serve`` of the board venv's console script on a free port."""

    def __init__(self, board: BoardVenv, *args: str):
        self.log = tempfile.TemporaryFile("a+")
        self.proc = subprocess.Popen([board.bin("rpcsrv"), "serve", "--port", "0", *args], env=board.env(),
                                     cwd=board.home, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"the installed rpcsrv did not start: {line!r} {self.stderr()}")
        self.host, self.port = "127.0.0.1", int(m.group(1))

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def relax_mlp(path: Path, target="llvm", fcompile=None):
    """Export ``main(x: f32[2, 16]) = relu(x @ w + b) @ w2`` (weights as constants) as a Relax VM
    executable compiled by apache-tvm for ``target``; returns its numpy reference."""
    import numpy as np
    import tvm
    from tvm import relax

    rng = np.random.default_rng(1)
    w, b, w2 = (rng.standard_normal(s).astype("float32") for s in ((16, 32), (32,), (32, 4)))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b))))
            out = bb.emit_output(relax.op.matmul(h, relax.const(w2)))
        bb.emit_func_output(out)
    tvm.compile(bb.get(), target=target).export_library(str(path), **({"fcompile": fcompile} if fcompile else {}))
    return lambda v: np.maximum(v @ w + b, 0) @ w2


def mirror_sum(path: Path, target="llvm", fcompile=None) -> None:
    """Export ``mirror_sum(A, C)``: C[i] = 2 A[i] + 2 A[n-1-i], n = 1024, its loop parallel over an
    intermediate buffer (TVM's parallel launch and workspace allocator), compiled by apache-tvm."""
    import tvm
    from tvm import te

    n = 1024
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[i] + b[n - 1 - i], name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, c]).with_attr("global_symbol", "mirror_sum"))
    block = sch.get_sblock("C") if hasattr(sch, "get_sblock") else sch.get_block("C")
    sch.parallel(sch.get_loops(block)[0])
    tvm.compile(sch.mod, target=target).export_library(str(path), **({"fcompile": fcompile} if fcompile else {}))
