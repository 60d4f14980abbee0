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
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithShims(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        spec = importlib.util.spec_from_file_location("_rpcsrv_shimbuild", HERE / "rpcsrv/native/shimbuild.py")
        shimbuild = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shimbuild)
        dest = Path(self.build_lib) / "rpcsrv" / "native" / "prebuilt"
        shutil.rmtree(dest, ignore_errors=True)  # an earlier build's shims may be stale (pip builds in-tree)
        built = shimbuild.build_prebuilt(dest, log=lambda m: print(m, file=sys.stderr))
        if os.environ.get("RPCSRV_PREBUILT_REQUIRE") == "1" and len(built) < len(shimbuild.COMPILERS):
            raise SystemExit(f"RPCSRV_PREBUILT_REQUIRE=1: prebuilt shims for {sorted(built)} only; "
                             f"needs {', '.join(shimbuild.COMPILERS)} on PATH")


CLIENT = [f"rpcsrv.{name}" for name in find_packages(include=["client", "client.*"])]
setup(packages=find_packages(include=["rpcsrv", "rpcsrv.*"]) + CLIENT, package_dir={"rpcsrv.client": "client"},
      package_data={"rpcsrv.native": ["*.c"], "rpcsrv.executor.kernels": ["*.c", "*.h"]},  # C built on the board
      cmdclass={"build_py": BuildWithShims})
