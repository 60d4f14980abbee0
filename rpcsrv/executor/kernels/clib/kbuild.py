"""Build the executor's compiled kernels: every ``*.c`` of the kernels' folders (each op family's folder,
``conv/``, ``pool/``, ``norm/``, ``elementwise/``, ...; they include this folder's ``vec.h``) into one shared
library, ``libkernels.so``.

One place for the sources and the compile command, used three ways:

* at run time by ``compiled.py``: the board's compiler, tuned for its CPU (:data:`NATIVE`: ``-march=native``,
  else ``-mcpu=native``, else plain ``-O3``), into the cache;
* at wheel-build time by ``setup.py``, for every compiler ``rpcsrv/native/shimbuild.py`` found (the build
  machine's cc and the cross compilers): portable flags only (:data:`GENERIC`, the compiler's defaults for
  its target: armv7 hard-float without NEON), into ``prebuilt/<target>/libkernels.so`` in this folder,
  (and :data:`VARIANTS`: x86_64's x86-64-v3 and armv7's NEON beside it, taken on CPUs that have their features)
  with ``libkernels.sha256``, the hash of the sources it was built from (:func:`source_hash`; ``compiled.py``
  passes over a prebuilt of other sources, e.g. a stale one in a checkout);
* by hand, for a board nothing fits: ``python rpcsrv/executor/kernels/clib/kbuild.py OUT --cc <cross gcc>``, then
  on the board ``RPCSRV_KERNELS_LIB=OUT/<target>/libkernels.so``.

Standard library only, and no import of rpcsrv: ``setup.py`` loads this file by path in a build environment
that has nothing but setuptools.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the kernels' package, whose folders hold the C files
KERNELS = HERE.parent
#: the library's sources: every C file under the kernels' package, in the order of their names (unique across
#: the folders: tests/test_layers.py), so the command line and the hash do not depend on which folder holds a
#: file (a new kernel file, or a new family folder, is built without a list to edit)
SOURCES = tuple(sorted(KERNELS.rglob("*.c"), key=lambda path: path.name))
#: included by the sources (hashed with them: a change rebuilds): the headers several families share sit in this
#: folder (``vec.h``, ``armfloat.h``), on the include path; a family's own header sits beside its sources
HEADERS = tuple(sorted(KERNELS.rglob("*.h"), key=lambda path: path.name))
LIBRARY, STAMP = "libkernels.so", "libkernels.sha256"
#: the board's own build, the first flags its compiler takes (-mcpu=native: older ARM gcc)
NATIVE = (("-O3", "-march=native"), ("-O3", "-mcpu=native"), ("-O3",))
#: a prebuilt for every board of the compiler's target: no CPU tuning beyond the target's defaults
GENERIC = (("-O3",),)
#: target -> (name, flags, CPU flags of /proc/cpuinfo it needs): a second prebuilt beside the generic one,
#: taken where the CPU has those features.  x86_64's baseline is SSE2 (4 floats, no FMA): there gemm.c's 1x1
#: convs ran 2x slower than OpenBLAS (mobilenetv2: 17.6 against 8.5 ms) while x86-64-v3 (AVX2, FMA; Haswell
#: and later) matched -march=native (7.1 against 6.6 ms); docs/executor.md, "Compiled kernels".  armv7
#: hard-float's baseline (Debian's armhf) is VFPv3-D16 without NEON: every float vector becomes scalar code;
#: nearly every armv7 board has NEON (Cortex-A7/A8/A9/A15, and 32-bit systems on ARMv8), so a NEON build goes
#: beside it (plain NEON, no VFPv4: the Cortex-A8/A9 have none; the 32-bit NEON float mode is ``armfloat.h``'s).
VARIANTS = {"x86_64-linux-gnu": (("x86-64-v3", ("-O3", "-march=x86-64-v3"),
                                  frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"})),),
            "arm-linux-gnueabihf": (("neon", ("-O3", "-mfpu=neon"), frozenset({"neon"})),)}


def variant_name(name: str) -> str:
    """The file of a variant: ``libkernels-<name>.so``."""
    return f"{LIBRARY[:-3]}-{name}.so"


class BuildError(OSError):
    """A compiler was found but failed (its message)."""


def source_bytes() -> bytes:
    """The sources, then the headers, in name order: what the cache key and the prebuilt's stamp hash."""
    return b"".join(path.read_bytes() for path in SOURCES + HEADERS)


def source_hash() -> str:
    return hashlib.sha256(source_bytes()).hexdigest()


def source(name: str) -> Path:
    """The source file of this name, in whichever family folder holds it (tests compile some alone)."""
    for path in SOURCES:
        if path.name == name:
            return path
    raise FileNotFoundError(f"no kernel source {name} under {KERNELS}")


def include_flags() -> list[str]:
    """The include path of every compile of the sources: this folder (they include the shared headers by name)."""
    return [f"-I{HERE}"]


def compile_kernels(cc: str, out: Path, ladder=NATIVE, run=subprocess.run, timeout: float = 300) -> tuple[str, ...]:
    """The library built by ``cc`` into ``out`` (atomically) with the first flags of ``ladder`` it takes;
    returns those flags.  BuildError when none does.  ``run``: how each command runs (``subprocess.run``'s
    call; a board's build passes one it can stop, ``rpcsrv.config.toolchain.Compiler``), ``timeout`` its
    seconds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        err = ""
        for flags in ladder:
            proc = run([cc, *flags, *include_flags(), "-shared", "-fPIC", "-o", tmp, *map(str, SOURCES), "-lm"],
                       capture_output=True, text=True, timeout=timeout)
            if proc.returncode == 0:
                os.replace(tmp, out)
                return tuple(flags)
            err = proc.stderr.strip()[-300:]
        raise BuildError(f"building {', '.join(p.name for p in SOURCES)} with {cc} failed: {err}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_prebuilt(dest: Path, compilers: dict[str, str], log=print) -> dict[str, str]:
    """The generic library (and the target's :data:`VARIANTS`) for each ``{target: compiler}`` (shimbuild's
    ``build_prebuilt`` result), into ``dest/<target>/`` with its stamp; the compilers run side by side (one
    per core: they are most of the wheel build's time).  Returns ``compilers``."""
    digest = source_hash()
    jobs = [(cc, dest / target / LIBRARY, GENERIC) for target, cc in compilers.items()]
    jobs += [(cc, dest / target / variant_name(name), (flags,)) for target, cc in compilers.items()
             for name, flags, _ in VARIANTS.get(target, ())]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        list(pool.map(lambda job: compile_kernels(*job), jobs))  # (the first BuildError is raised here)
    for target, cc in compilers.items():
        (dest / target / STAMP).write_text(digest + "\n")
        also = "".join(f", {variant_name(n)} ({' '.join(f)})" for n, f, _ in VARIANTS.get(target, ()))
        log(f"rpcsrv kbuild: built {LIBRARY} ({' '.join(GENERIC[0])}){also} for {target} with {cc}")
    return compilers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python rpcsrv/executor/kernels/clib/kbuild.py",
                                description="Build rpcsrv's executor kernels, generic for the compiler's target, "
                                            "into OUT/<target>/libkernels.so.")
    p.add_argument("out")
    p.add_argument("--cc", action="append", required=True, metavar="COMPILER", help="a C compiler (repeatable)")
    args = p.parse_args(argv)
    try:
        targets = {}
        for cc in args.cc:
            proc = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise BuildError(f"{cc} -dumpmachine failed: {proc.stderr.strip()[-300:]}")
            targets[proc.stdout.strip()] = cc
        build_prebuilt(Path(args.out), targets, log=lambda m: print(m, file=sys.stderr))
    except OSError as exc:
        print(f"rpcsrv kbuild: error: {exc}", file=sys.stderr)
        return 1
    for target in targets:
        print(Path(args.out) / target / LIBRARY)
    return 0


if __name__ == "__main__":
    sys.exit(main())
