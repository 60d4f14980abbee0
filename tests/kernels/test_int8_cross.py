"""The int8 kernels (``kernels/quant/qgemm*.c``, ``qconv.c``) on the boards' targets: ``int8_check.c`` (every
micro-kernel the CPU runs against exact integer sums at the types' extremes, the requantization rule, dense and
depthwise convs against naive loops) built for this CPU (gcc and clang), for generic x86_64 (the runtime dispatch
still finds VNNI/AVX2), and with the Debian cross compilers for aarch64 (qemu's ``-cpu max`` has the dot product
extension: sdot, then NEON, then generic C) and armv7 with NEON (vmull/vpadal) and without, run under qemu-user."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import need_program
from rpcsrv.executor.kernels.clib import kbuild

HERE = Path(__file__).resolve().parent
SOURCES = [str(HERE / "int8_check.c")] + [str(kbuild.source(name)) for name in ("qgemm.c", "qgemm_x86.c",
                                                                                  "qgemm_arm.c", "qconv.c")]
TARGETS = {  # name: (compiler, flags, runner or None, kernels it must have run)
    "native": ("cc", ["-march=native"], None, 2),
    "clang": ("clang", ["-march=native"], None, 2),
    "x86_64-generic": ("cc", [], None, 2),
    "aarch64": ("aarch64-linux-gnu-gcc", ["-static"], ("qemu-aarch64-static", "-cpu", "max"), 3),
    "armv7-neon": ("arm-linux-gnueabihf-gcc", ["-static", "-mfpu=neon"], ("qemu-arm-static",), 2),
    "armv7": ("arm-linux-gnueabihf-gcc", ["-static"], ("qemu-arm-static",), 1),
}


@pytest.mark.parametrize("target", list(TARGETS))
def test_int8_kernels_match_exact_arithmetic_on_each_target(target, tmp_path):
    cc, flags, runner, kernels = TARGETS[target]
    why = "the int8 kernels are checked on the boards' targets (Debian's cross compilers and qemu-user-static)"
    cc = need_program(cc, why)
    command = [str(tmp_path / "check")]
    if runner:
        command = [need_program(runner[0], why), *runner[1:]] + command
    subprocess.run([cc, "-O3", "-Wall", "-Wextra", "-Werror", *flags, *kbuild.include_flags(),
                    f"-I{kbuild.source('qgemm.c').parent}", "-o", str(tmp_path / "check"), *SOURCES, "-lm"],
                   check=True, capture_output=True, text=True, timeout=300)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stdout[-3000:] + done.stderr[-2000:]
    ran = int(done.stdout.split("(")[1].split()[0])
    assert ran >= kernels, done.stdout  # aarch64: dotprod, NEON and generic; x86: at least AVX2 and generic
