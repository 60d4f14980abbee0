"""The executor kernels prebuilt for boards without a compiler (issue 27; ``kbuild.py``, ``compiled.py``).

The prebuilt libraries are made here by ``kbuild.build_prebuilt``, the code the wheel build runs (setup.py;
tests/install/test_wheel.py checks the wheel itself), for every compiler of the wheel's list found on PATH.
Which library ``compiled.py`` takes, in order: ``RPCSRV_KERNELS_LIB``, the cache, a build with the board's
compiler, the prebuilt for this machine when its stamp matches the sources, else numpy (and ``report``
says which).  The aarch64 and armv7 prebuilts are linked to the depthwise/pool and GEMM checks
(``dwchan_check.c``, ``gemm_check.c``: against naive loops) and run under qemu-user.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import need_program
from rpcsrv.executor.kernels.clib import compiled, kbuild, kcache

HERE = Path(__file__).resolve().parent
#: the wheel's compilers (rpcsrv/native/shimbuild.py's COMPILERS; not imported: a test of the executor layer)
COMPILERS = ("cc", "aarch64-linux-gnu-gcc", "arm-linux-gnueabihf-gcc")
QEMU = {"aarch64-linux-gnu": "qemu-aarch64-static", "arm-linux-gnueabihf": "qemu-arm-static"}
FOUND = {name: shutil.which(name) for name in COMPILERS}  # before a test empties PATH


def _target(cc: str) -> str:
    return subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, check=True).stdout.strip()


def _need(name: str, why: str) -> str:
    return FOUND[name] or need_program(name, why)


@pytest.fixture(scope="module")
def prebuilt_dir(tmp_path_factory) -> Path:
    """``prebuilt/<target>/libkernels.so`` + stamp for each compiler found, as the wheel build makes them."""
    dest = tmp_path_factory.mktemp("prebuilt")
    _need("cc", "builds the prebuilt kernels")
    targets = {}
    for cc in filter(None, FOUND.values()):
        targets.setdefault(_target(cc), cc)
    kbuild.build_prebuilt(dest, targets, log=lambda m: None)
    return dest


@pytest.fixture
def board(prebuilt_dir, tmp_path, monkeypatch):
    """A board without a compiler: an empty PATH, no compiler variables, an empty cache; the prebuilt
    libraries of ``prebuilt_dir`` in the package.  The kernels' state is reset before and after."""
    for name in ("CC", "RPCSRV_CC", "RPCSRV_KERNELS_LIB", compiled.ENV_SWITCH):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("RPCSRV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "PREBUILT", prebuilt_dir)
    compiled.reset()
    yield prebuilt_dir
    compiled.reset()


def _host_target() -> str:
    return _target(_need("cc", "the host's target"))


def _sigmoid_runs(lib) -> None:
    x = np.linspace(-8, 8, 1001, dtype=np.float32)
    y = np.empty_like(x)
    lib.rpcsrv_sigmoid_f32(x.ctypes.data, y.ctypes.data, x.size, 0)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-5, atol=1e-6)


def _variant() -> tuple[str, str]:
    """(variant, file) the prebuilt of this machine should be: x86-64-v3 where the CPU has its features."""
    for name, _, needs in kbuild.VARIANTS.get(_host_target(), ()):
        if needs <= set(compiled._cpu_features().decode().partition(":")[2].split()):
            return name, kbuild.variant_name(name)
    return "generic -O3", kbuild.LIBRARY


def test_without_a_compiler_the_prebuilt_for_this_machine_is_used_and_reported(board):
    target, (variant, file) = _host_target(), _variant()
    report = compiled.report()
    assert report["in_use"], report
    assert report["origin"] == f"prebuilt for {target}, {variant}"
    assert report["library"] == str(board / target / file)
    assert report["summary"].startswith(f"compiled kernels in use (prebuilt for {target}, {variant}: ")
    _sigmoid_runs(compiled.library())
    assert not compiled.POLICY.settings.folder().exists(), "nothing was built or cached"


def test_a_cpu_without_the_variants_features_takes_the_generic_prebuilt(board, monkeypatch):
    target = _host_target()
    if not kbuild.VARIANTS.get(target):
        pytest.skip(f"no variant for {target}")
    monkeypatch.setattr(compiled, "_cpu_features", lambda: b"flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx\n")
    report = compiled.report()
    assert report["origin"] == f"prebuilt for {target}, generic -O3", report
    assert report["library"] == str(board / target / kbuild.LIBRARY)
    _sigmoid_runs(compiled.library())
    assert any("the CPU lacks avx2 bmi1 bmi2 f16c fma movbe" in why for _, _, why in compiled.prebuilt())


def test_a_stale_or_foreign_prebuilt_is_passed_over_for_numpy(board, tmp_path, monkeypatch):
    target = _host_target()
    stale = tmp_path / "stale"
    shutil.copytree(board / target, stale / target)
    (stale / target / kbuild.STAMP).write_text("0" * 64 + "\n")  # built from other sources
    foreign = _need("arm-linux-gnueabihf-gcc", "a library of another machine")
    other = stale / "arm-linux-gnueabihf"
    kbuild.compile_kernels(foreign, other / kbuild.LIBRARY, kbuild.GENERIC)
    (other / kbuild.STAMP).write_text(kbuild.source_hash())  # fresh, but not this board's machine
    monkeypatch.setattr(compiled, "PREBUILT", stale)
    report = compiled.report()
    assert not report["in_use"] and report["summary"].startswith("numpy fallback (no compiled kernels: no C compiler")
    assert f"{target}, generic -O3: built from other sources (stale)" in report["reason"], report["reason"]
    assert "arm-linux-gnueabihf, generic -O3: other machine" in report["reason"], report["reason"]


def test_the_boards_compiler_and_the_explicit_library_come_before_the_prebuilt(board, monkeypatch):
    cc = _need("cc", "the board's own build")
    monkeypatch.setenv("PATH", str(Path(cc).parent))  # (and its assembler and linker)
    report = compiled.report()
    assert report["in_use"] and report["origin"].startswith(f"built with {cc} -O3 -m"), report  # -march/-mcpu
    built = report["library"]
    assert Path(built).parent == compiled.POLICY.settings.folder()
    compiled.reset()
    monkeypatch.setenv("PATH", str(board))  # the cached build serves without the compiler
    assert compiled.report()["origin"].startswith("built for this CPU, cached in")
    compiled.reset()
    monkeypatch.setenv("RPCSRV_KERNELS_LIB", str(board / _host_target() / "libkernels.so"))
    assert compiled.report()["origin"] == "RPCSRV_KERNELS_LIB"
    _sigmoid_runs(compiled.library())


#: (target, library file) of every cross prebuilt: the generic build and the target's variants
CROSS = [(t, f) for t in QEMU
         for f in (kbuild.LIBRARY, *(kbuild.variant_name(v) for v, _, _ in kbuild.VARIANTS.get(t, ())))]


@pytest.mark.parametrize("check", ["dwchan_check.c", "gemm_check.c"])
@pytest.mark.parametrize("target, file", CROSS)
def test_the_cross_prebuilt_loads_and_computes_under_qemu(prebuilt_dir, target, file, check, tmp_path):
    """The prebuilt shared library itself (dynamically linked, loaded by the target's ld.so) against naive
    loops: armv7's generic build runs its vectors as scalar VFP code, its NEON build as NEON (qemu's CPU has it)."""
    why = "the cross-built prebuilt kernels run under qemu-user (Debian's cross compilers, qemu-user-static)"
    cc, qemu = _need(f"{target}-gcc", why), need_program(QEMU[target], why)
    lib_dir = prebuilt_dir / target
    assert (lib_dir / file).is_file(), f"no prebuilt {file} for {target}"
    exe = tmp_path / "check"
    subprocess.run([cc, "-O2", "-o", str(exe), str(HERE / check), f"-L{lib_dir}", f"-l:{file}",
                    f"-Wl,-rpath,{lib_dir}", "-lm"], check=True, capture_output=True, text=True, timeout=120)
    done = subprocess.run([qemu, "-L", f"/usr/{target}", str(exe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stdout[-2000:] + done.stderr[-2000:]


def _float_vector_ops(path: Path, objdump: str) -> tuple[int, int]:
    """(NEON float operations on q registers, writes of the FP status register) in a 32-bit ARM library."""
    text = subprocess.run([objdump, "-d", str(path)], capture_output=True, text=True, check=True, timeout=120).stdout
    return (len(re.findall(r"\tv(?:mla|fma|mul|add|sub|max|min)\.f32\tq", text)), text.count("\tvmsr\t"))


def test_the_armv7_neon_build_computes_in_neon_and_leaves_the_float_mode_alone(prebuilt_dir):
    """GCC keeps 32-bit ARM float vectors off NEON without unsafe math (``armfloat.h`` asks for it per function):
    the NEON build must really hold NEON float code, the generic one none, and neither may set the process's
    flush-to-zero mode at load (what ``-funsafe-math-optimizations`` on the command line links in)."""
    objdump = need_program("arm-linux-gnueabihf-objdump", "reads the armv7 prebuilt's code")
    lib_dir = prebuilt_dir / "arm-linux-gnueabihf"
    neon, writes = _float_vector_ops(lib_dir / kbuild.variant_name("neon"), objdump)
    assert neon > 100 and writes == 0, (neon, writes)
    assert _float_vector_ops(lib_dir / kbuild.LIBRARY, objdump) == (0, 0)


def test_on_32_bit_arm_the_cpu_features_come_from_the_auxiliary_vector(monkeypatch):
    """A 64-bit kernel's /proc/cpuinfo names NEON ``asimd`` to a 32-bit process; ``AT_HWCAP`` says ``neon``."""
    monkeypatch.setattr(kcache, "_arm32_hwcap", lambda: kcache.ARM_HWCAPS["neon"])
    assert "neon" in compiled._cpu_features().decode().partition(":")[2].split()
    monkeypatch.setattr(kcache, "_arm32_hwcap", lambda: 0)
    assert "neon" not in compiled._cpu_features().decode().partition(":")[2].split()
