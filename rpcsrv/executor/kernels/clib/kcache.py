"""The compiled kernels of this board's CPU in the cache: where the build for this CPU sits
(:func:`cache_path`) and building it there (:func:`build`), in a private build folder of the cache
(``rpcsrv.config.toolchain.build_folder``: the compiler's temporary files included, removed on every way out)
with the board's compiler, ``kbuild``'s command and its :data:`~kbuild.NATIVE` flags.

``compiled.py`` asks it for the first use of a script or ``rpcsrv check`` (built then, inline); a server's
background build (``rpcsrv.native.builds``) builds here and installs the result (``compiled.install``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
from pathlib import Path

from ....config.toolchain import BuildSettings, build_folder, c_compiler
from . import kbuild


def cache_path(folder: Path) -> Path:
    """The cached build for this CPU: keyed by the sources' hash, the machine and the CPU's features (not the
    compiler: a cached build serves without one; the features, since ``-march=native`` builds for them and a
    cache folder may be shared by boards of one architecture but other CPUs)."""
    key = hashlib.sha256(kbuild.source_bytes() + platform.machine().encode() + cpu_features()).hexdigest()[:16]
    return folder / f"libkernels-{key}.so"


def build(settings: BuildSettings, run=subprocess.run, timeout: float = 300) -> tuple[Path, str]:
    """Build the kernels for this CPU into the cache of ``settings``: (the cached file, how it was built).
    ``run``: how the compiler runs (``toolchain.Compiler.run``: one a server can stop).  OSError (a
    ``kbuild.BuildError`` among them) when there is no compiler, it fails, or no cache can be written."""
    cc = c_compiler()
    if cc is None:
        raise OSError("no C compiler (set RPCSRV_CC or CC, or RPCSRV_KERNELS_LIB to a prebuilt library)")
    folder = settings.folder()
    target = cache_path(folder)
    with build_folder(folder) as tmp:
        try:
            flags = kbuild.compile_kernels(cc, tmp / kbuild.LIBRARY, run=run, timeout=timeout)
        except subprocess.SubprocessError as exc:  # a timeout, or a stopped build
            raise kbuild.BuildError(f"building the kernels with {cc}: {exc}") from None
        os.replace(tmp / kbuild.LIBRARY, target)
    return target, f"built with {cc} {' '.join(flags)}, cached in {folder}"


#: 32-bit ARM's ``AT_HWCAP`` bits (the kernel's ``asm/hwcap.h``) a prebuilt variant may need (``kbuild.VARIANTS``)
ARM_HWCAPS = {"neon": 1 << 12, "vfpv4": 1 << 16}
AT_HWCAP = 16


def cpu_features() -> bytes:
    """The first ``flags`` (x86) or ``Features`` (ARM) line of /proc/cpuinfo, or nothing; for a 32-bit ARM
    process, with the names of :data:`ARM_HWCAPS` its ``AT_HWCAP`` has: a 64-bit kernel shows its own
    names (``asimd``, not ``neon``) to a 32-bit process, and qemu-user the host's."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            line = next((line for line in f if line.split(b":")[0].strip() in (b"flags", b"Features")), b"")
    except OSError:
        line = b""
    hwcap = _arm32_hwcap()
    if hwcap:
        line = line.rstrip(b"\n") + b"".join(b" " + n.encode() for n, bit in ARM_HWCAPS.items() if hwcap & bit) + b"\n"
    return line


def _arm32_hwcap() -> int:
    """``getauxval(AT_HWCAP)`` in a 32-bit ARM process (0 elsewhere, or without it)."""
    from ....loader.machine import board

    try:
        if (board().arch, board().bits) != ("ARM", 32):
            return 0
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError, ValueError, RuntimeError):
        return 0
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(getauxval(AT_HWCAP))
