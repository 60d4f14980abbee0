"""Which packages the distribution holds, and the native shims built into the wheel (the rest of the
metadata is in pyproject.toml).

Packages: the client tools live in ``client/`` in the checkout but install as ``rpcsrv.client``, so
that the only top-level package a user gets is ``rpcsrv`` (a top-level ``client`` would collide with
other distributions).  ``find_packages`` keeps new packages in without a list to maintain.

Native shims (docs/native.md, "Packaging"): ``build_py`` also compiles ``rpcsrv/native/shim.c`` and
the ``rpcsrv check`` kernel with every compiler of ``rpcsrv/native/shimbuild.py``'s list found on
PATH (the build machine's cc, aarch64-linux-gnu-gcc, arm-linux-gnueabihf-gcc) into
``rpcsrv/native/prebuilt/<target>/`` of the build, so one wheel serves boards without a compiler.
A missing cross compiler only leaves its machine out (the board then compiles at first use, or says
what to do); ``RPCSRV_PREBUILT_REQUIRE=1`` makes it an error (release and CI builds).  Editable
installs build nothing: the shim is compiled at first use there.  The C sources ship in the wheel and
the sdist (package data).

Executor kernels (docs/executor.md, "Compiled kernels"): the same compilers also build
``rpcsrv/executor/kernels/clib/kbuild.py``'s library (the C files of every kernel family folder), generic -O3
(no CPU tuning: it must run on every board of its target), into ``rpcsrv/executor/kernels/clib/prebuilt/<target>/``
with the hash of its sources; boards without a compiler take it instead of the numpy kernels.
``RPCSRV_PREBUILT_REQUIRE=1`` covers them too (they are built for exactly the targets the shims are).  Every
package under ``rpcsrv.executor.kernels`` ships its C files and headers (package data), so a new family folder
needs no list here either.
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load(name: str, path: str):
    """A standard-library-only build module of the package, by path (the build has nothing else)."""
    spec = importlib.util.spec_from_file_location(name, HERE / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithShims(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        shimbuild = _load("_rpcsrv_shimbuild", "rpcsrv/native/shimbuild.py")
        kbuild = _load("_rpcsrv_kbuild", "rpcsrv/executor/kernels/clib/kbuild.py")
        dest = Path(self.build_lib) / "rpcsrv" / "native" / "prebuilt"
        kernels = Path(self.build_lib) / "rpcsrv" / "executor" / "kernels" / "clib" / "prebuilt"
        for old in (dest, kernels):  # an earlier build's libraries may be stale (pip builds in-tree)
            shutil.rmtree(old, ignore_errors=True)
        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        built = shimbuild.build_prebuilt(dest, log=log)
        kbuild.build_prebuilt(kernels, built, log=log)  # the same compilers and targets
        if os.environ.get("RPCSRV_PREBUILT_REQUIRE") == "1" and len(built) < len(shimbuild.COMPILERS):
            raise SystemExit(f"RPCSRV_PREBUILT_REQUIRE=1: prebuilt shims for {sorted(built)} only; "
                             f"needs {', '.join(shimbuild.COMPILERS)} on PATH")


CLIENT = [f"rpcsrv.{name}" for name in find_packages(include=["client", "client.*"])]
PACKAGES = find_packages(include=["rpcsrv", "rpcsrv.*"])
#: the C the board builds: the native shim's, and the kernels' (each family folder's .c, clib's shared headers)
C_SOURCES = {"rpcsrv.native": ["*.c"], **{name: ["*.c", "*.h"] for name in PACKAGES
                                          if name.startswith("rpcsrv.executor.kernels")}}
setup(packages=PACKAGES + CLIENT, package_dir={"rpcsrv.client": "client"}, package_data=C_SOURCES,
      cmdclass={"build_py": BuildWithShims})
