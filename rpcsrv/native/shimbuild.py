"""Compile the native shim (``shim.c``) and ``rpcsrv check``'s smoke kernel (``check_kernel.c``).

One place for the compile command, used three ways:

* at wheel-build time by ``setup.py``: every compiler of :data:`COMPILERS` found on PATH builds both
  libraries into ``rpcsrv/native/prebuilt/<target>/`` of the wheel (``<target>`` is the compiler's
  ``-dumpmachine``, e.g. ``aarch64-linux-gnu``), so a board without a compiler finds its shim;
* at run time by ``shim.py``, where no prebuilt shim fits the board and a compiler exists (the board's
  compiler and cache folder: ``rpcsrv.config.toolchain``, which the compiled kernels use too);
* by hand, for a board nothing fits: ``python -m rpcsrv.native.shimbuild OUT --cc <cross gcc>``
  (or ``python rpcsrv/native/shimbuild.py ...`` from a checkout), then on the board
  ``RPCSRV_NATIVE_SHIM=OUT/<target>/libshim.so``.

Standard library only, and no import of rpcsrv: ``setup.py`` loads this file by path in a build
environment that has nothing but setuptools.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: library name -> (source beside this file, extra link flags)
LIBRARIES = {"libshim.so": ("shim.c", ["-lpthread"]), "libcheck.so": ("check_kernel.c", [])}
#: compilers a wheel build tries: the build machine's own, then Debian's cross compilers for the boards
#: rpcsrv is tested on (arm64 and armv7 hard-float; ``.ci/run`` installs them)
COMPILERS = ("cc", "aarch64-linux-gnu-gcc", "arm-linux-gnueabihf-gcc")
FLAGS = ["-O2", "-shared", "-fPIC"]
#: prebuilt (glibc) shims: the oldest pthread symbol versions and libpthread.so.0 as a dependency, so a
#: shim built against glibc >= 2.34 also loads on older boards (see shim.c)
PORTABLE = ["-DRPCSRV_PORTABLE_GLIBC", "-Wl,--no-as-needed", "-l:libpthread.so.0", "-Wl,--as-needed"]


class BuildError(RuntimeError):
    """A compiler was found but failed (its message)."""


def target_of(cc: str) -> str:
    """The machine ``cc`` builds for, as its target triple (``gcc -dumpmachine``)."""
    proc = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BuildError(f"{cc} -dumpmachine failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip()


def compile_library(cc: str, name: str, out: Path, portable: bool = False, run=subprocess.run,
                    timeout: float = 300) -> Path:
    """``LIBRARIES[name]`` compiled by ``cc`` into ``out`` (written atomically); ``portable``: for other
    boards of the machine (:data:`PORTABLE`, glibc targets only).  ``run``: how the command runs
    (``subprocess.run``'s call; a board's build passes one it can stop), ``timeout`` its seconds."""
    source, libs = LIBRARIES[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        extra = PORTABLE if portable and name == "libshim.so" else []
        proc = run([cc, *FLAGS, "-o", tmp, str(HERE / source), *libs, *extra], capture_output=True, text=True,
                   timeout=timeout)
        if proc.returncode != 0:
            raise BuildError(f"building {name} with {cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def build_prebuilt(dest: Path, compilers=COMPILERS, log=print) -> dict[str, str]:
    """Both libraries for every compiler of ``compilers`` on PATH, into ``dest/<target>/``.
    Returns {target: compiler}; a compiler that is absent is skipped (said through ``log``)."""
    built: dict[str, str] = {}
    for name in compilers:
        cc = shutil.which(name)
        if cc is None:
            log(f"rpcsrv shimbuild: {name} not found; no prebuilt shim for its machine")
            continue
        target = target_of(cc)
        if target in built:
            continue
        for lib in LIBRARIES:
            compile_library(cc, lib, dest / target / lib, portable=target.endswith(("-gnu", "-gnueabihf")))
        built[target] = cc
        log(f"rpcsrv shimbuild: built {', '.join(LIBRARIES)} for {target} with {name}")
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rpcsrv.native.shimbuild",
                                description="Build rpcsrv's native shim and check kernel into OUT/<target>/.")
    p.add_argument("out", help="folder to write (OUT/<target triple>/libshim.so, libcheck.so)")
    p.add_argument("--cc", action="append", metavar="COMPILER",
                   help=f"a C compiler (repeatable; default: those of {', '.join(COMPILERS)} on PATH)")
    p.add_argument("--require", action="store_true", help="fail unless every compiler asked for was found")
    args = p.parse_args(argv)
    compilers = args.cc or COMPILERS
    try:
        built = build_prebuilt(Path(args.out), compilers, log=lambda m: print(m, file=sys.stderr))
    except BuildError as exc:
        print(f"rpcsrv shimbuild: error: {exc}", file=sys.stderr)
        return 1
    if args.require and len(built) < len(compilers):
        print(f"rpcsrv shimbuild: error: built for {len(built)} of {len(compilers)} compilers", file=sys.stderr)
        return 1
    for target in built:
        print(Path(args.out) / target / "libshim.so")
    return 0


if __name__ == "__main__":
    sys.exit(main())
