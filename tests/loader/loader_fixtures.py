"""Build fixture libraries with real compilers, the way TVM's ``export_library`` does.

``c_source`` writes the C file TVM's ``PackImportsToC`` emits (an exported ``const unsigned char``
array holding the 8-byte little-endian blob length and the blob) plus one host function, so the
``_lib`` placeholder has a symbol to list.  The compilers (gcc, Debian cross gcc, clang for
Mach-O) then produce the containers the loader must read; nothing here uses the loader.
"""

from __future__ import annotations

import struct
import subprocess
import tarfile
from pathlib import Path

from conftest import need_program

HOST_FUNCTION = "tvmgen_default_fused_add"

#: name -> (compiler, flags for a shared library or None, flags for an object)
TARGETS = {
    "host": ("gcc", ["-shared", "-fPIC"], ["-c", "-fPIC"]),
    "arm32": ("arm-linux-gnueabihf-gcc", ["-shared", "-fPIC"], ["-c", "-fPIC"]),
    "mips32be": ("mips-linux-gnu-gcc", ["-shared", "-fPIC"], ["-c", "-fPIC"]),
    "macho": ("clang", ["-target", "arm64-apple-macos11", "-shared", "-fuse-ld=lld", "-nostdlib"],
              ["-target", "arm64-apple-macos11", "-c"]),
}


def c_source(blob: bytes, symbol: str) -> str:
    """TVM's PackImportsToC output for ``blob`` (without length header) under ``symbol``."""
    content = struct.pack("<Q", len(blob)) + blob
    rows = []
    for i in range(0, len(content), 20):
        rows.append("  " + "".join(f"0x{b:02x}," for b in content[i:i + 20]))
    return (
        "#ifdef _WIN32\n#define TVM_EXPORT __declspec(dllexport)\n#else\n#define TVM_EXPORT\n#endif\n"
        "#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
        f"TVM_EXPORT extern const unsigned char {symbol}[];\n"
        f"const unsigned char {symbol}[{len(content)}] = {{\n" + "\n".join(rows) + "\n};\n"
        f"int {HOST_FUNCTION}(void* args, int* codes, int n) {{ return n; }}\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )


def compile_library(blob: bytes, symbol: str, target: str, out: Path, kind: str = "shared") -> Path:
    """Compile the C file for ``blob`` with the ``target`` toolchain into ``out``."""
    cc, shared_flags, object_flags = TARGETS[target]
    exe = need_program(cc, f"cross compiler for the {target} fixture")
    flags = shared_flags if kind == "shared" else object_flags
    assert flags is not None, f"{target} has no {kind} build"
    src = out.with_suffix(".c")
    src.write_text(c_source(blob, symbol))
    subprocess.run([exe, "-O1", *flags, "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def strip_section_headers(path: Path) -> Path:
    """Zero e_shoff/e_shnum/e_shstrndx of an ELF file, as ``sstrip`` does; returns the path."""
    data = bytearray(path.read_bytes())
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        struct.pack_into(order + "Q", data, 0x28, 0)
        struct.pack_into(order + "HH", data, 0x3C, 0, 0)
    else:
        struct.pack_into(order + "I", data, 0x20, 0)
        struct.pack_into(order + "HH", data, 0x30, 0, 0)
    path.write_bytes(bytes(data))
    return path


def export_tar(blob: bytes, symbol: str, out: Path) -> Path:
    """What ``export_library("x.tar")`` writes: ``lib0.o`` (host code) and ``devc.o`` (the blob)."""
    work = out.parent
    lib0 = work / "lib0.c"
    lib0.write_text("int tvmgen_default_fused_mul(void* a, int* c, int n) { return 0; }\n")
    gcc = need_program("gcc")
    subprocess.run([gcc, "-c", "-fPIC", "-o", str(work / "lib0.o"), str(lib0)], check=True)
    compile_library(blob, symbol, "host", work / "devc.o", kind="object")
    with tarfile.open(out, "w") as tar:
        tar.add(work / "lib0.o", arcname="lib0.o")
        tar.add(work / "devc.o", arcname="devc.o")
    return out


def universal_dylib(blob: bytes, symbol: str, out: Path) -> Path:
    """A universal (fat) Mach-O with arm64 and x86_64 dylib slices, joined by llvm-lipo."""
    import shutil

    lipo = shutil.which("llvm-lipo") or need_program("llvm-lipo-14", "joins Mach-O slices")
    clang = need_program("clang")
    src = out.with_suffix(".c")
    src.write_text(c_source(blob, symbol))
    slices = []
    for arch in ("arm64", "x86_64"):
        path = out.with_name(f"{out.stem}.{arch}.dylib")
        subprocess.run([clang, "-target", f"{arch}-apple-macos11", "-shared", "-fuse-ld=lld",
                        "-nostdlib", "-o", str(path), str(src)], check=True, capture_output=True)
        slices.append(str(path))
    subprocess.run([lipo, "-create", *slices, "-output", str(out)], check=True, capture_output=True)
    return out


def export_tar_c_source(blob: bytes, symbol: str, out: Path) -> Path:
    """``export_library("x.tar")`` by a TVM without LLVM: ``lib0.o`` and the ``devc.c`` source."""
    work = out.parent
    (work / "devc.c").write_text(c_source(blob, symbol))
    lib0 = work / "lib0.c"
    lib0.write_text("int tvmgen_default_fused_mul(void* a, int* c, int n) { return 0; }\n")
    subprocess.run([need_program("gcc"), "-c", "-fPIC", "-o", str(work / "lib0.o"), str(lib0)], check=True)
    with tarfile.open(out, "w") as tar:
        tar.add(work / "lib0.o", arcname="lib0.o")
        tar.add(work / "devc.c", arcname="devc.c")
    return out


def export_tar_tvm(blob: bytes, symbol: str, out: Path, devc: str = "o") -> Path:
    """``export_library("x.tar")`` exactly as TVM 0.19 writes it (``contrib/tar.py``): the members
    ``lib0.o`` and ``devc.o`` (or ``devc.c`` without LLVM) side by side in a directory, packed by
    the system ``tar -czf OUT -C DIR names...``, so the file is gzip-compressed whatever its name."""
    work = out.parent / f"{out.name}.members"
    work.mkdir()
    (work / "lib0.c").write_text("int tvmgen_default_fused_mul(void* a, int* c, int n) { return 0; }\n")
    gcc = need_program("gcc")
    subprocess.run([gcc, "-c", "-fPIC", "-o", str(work / "lib0.o"), str(work / "lib0.c")], check=True)
    if devc == "o":
        compile_library(blob, symbol, "host", work / "devc.o", kind="object")
    else:
        (work / "devc.c").write_text(c_source(blob, symbol))
    names = ["lib0.o", f"devc.{devc}"]
    subprocess.run([need_program("tar"), "-czf", str(out), "-C", str(work), *names], check=True)
    return out
