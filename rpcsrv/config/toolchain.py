"""The board's C compiler and the folder its builds are cached in, found one way for everything built on it:
the native runtime shim (``rpcsrv.native.shim``) and the executor's compiled kernels
(``rpcsrv.executor.kernels.clib.compiled``).  The compile commands themselves stay with their sources
(``shimbuild.py``, ``kbuild.py``: standard-library scripts a wheel build loads by path).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from . import environment

#: compilers tried after ``$RPCSRV_CC`` and ``$CC``, in order
COMPILERS = ("cc", "gcc", "clang")


def c_compiler() -> Optional[str]:
    """The board's C compiler: ``$RPCSRV_CC``, ``$CC``, then cc, gcc, clang on PATH, as a full path (None: none)."""
    for name in (environment.text("RPCSRV_CC"), environment.text("CC"), *COMPILERS):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def cache_dir() -> Path:
    """Where built libraries are cached: ``$RPCSRV_CACHE_DIR``, else ``~/.cache/rpcsrv``."""
    return Path(environment.text("RPCSRV_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rpcsrv"))
