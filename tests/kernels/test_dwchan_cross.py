"""``dwchan.c`` and ``pools.c`` on the boards' targets: ``dwchan_check.c`` (random depthwise convs and pools
against naive loops) built for this CPU, for generic x86_64 (SSE: 4-float vectors), and with the Debian cross compilers
for aarch64 (its 32 vector registers hold a 3x3 block's weights, a path x86_64 without AVX-512 never takes)
and armv7 with and without NEON, run under qemu-user."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import need_program
from rpcsrv.executor.kernels.clib import kbuild

HERE = Path(__file__).resolve().parent
SOURCES = [str(HERE / "dwchan_check.c")] + [str(kbuild.source(name)) for name in ("dwchan.c", "pools.c", "sigmoid.c")]
TARGETS = {  # name: (compiler, flags, runner or None)
    "native": ("cc", ["-march=native"], None),
    "x86_64-generic": ("cc", [], None),
    "aarch64": ("aarch64-linux-gnu-gcc", ["-static"], "qemu-aarch64-static"),
    "armv7-neon": ("arm-linux-gnueabihf-gcc", ["-static", "-mfpu=neon"], "qemu-arm-static"),
    "armv7": ("arm-linux-gnueabihf-gcc", ["-static"], "qemu-arm-static"),
}


@pytest.mark.parametrize("target", list(TARGETS))
def test_dwchan_matches_naive_loops_on_each_target(target, tmp_path):
    cc, flags, runner = TARGETS[target]
    why = "dwchan.c is checked on the boards' targets (Debian's cross compilers and qemu-user-static)"
    cc = need_program(cc, why)
    command = [str(tmp_path / "check")]
    if runner:
        command.insert(0, need_program(runner, why))
    subprocess.run([cc, "-O3", "-Wall", "-Wextra", "-Werror", *flags, *kbuild.include_flags(), "-o", command[-1],
                    *SOURCES, "-lm"],
                   check=True, capture_output=True, text=True, timeout=120)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stdout + done.stderr
    assert int(done.stdout.split()[1]) > 200, done.stdout  # that many geometries checked
