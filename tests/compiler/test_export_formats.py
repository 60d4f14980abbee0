"""The exporter's file formats: the name decides the format (or it is refused), tars may be
compressed, and every compiler (host, cross, clang for Mach-O) gets the blob through ``.incbin``.

Every library written here is read back by the loader and, for the host, by the dynamic linker."""

from __future__ import annotations

import ctypes
import gzip
import subprocess
import tarfile

import numpy as np
import onnx
import pytest

from rpcsrv.client import CompileError
from rpcsrv.client.cli import main
from rpcsrv.client.demo_models import seed_model
from rpcsrv.client.export import export_library, output_kind, symbol_bytes
from conftest import need_program
from rpcsrv.loader import (
    BLOB_SYMBOL, FFI_BLOB_SYMBOL, GraphExecutorFactoryModule, HostLibraryModule, load_library,
)

W = np.arange(1000, dtype=np.float32)


def tree() -> GraphExecutorFactoryModule:
    return GraphExecutorFactoryModule('{"nodes": []}', {"w": W}, imports=[HostLibraryModule()])


def check(path, container: str, layout: str = "classic"):
    lib = load_library(path)
    assert (lib.container, lib.layout) == (container, layout)
    np.testing.assert_array_equal(lib.root.params["w"], W)
    return lib


@pytest.mark.parametrize("name,kind", [
    ("m.so", ("so", None)), ("M.DYLIB", ("so", None)), ("m.tar", ("tar", None)),
    ("m.tar.gz", ("tar", "gz")), ("m.tgz", ("tar", "gz")), ("m.tar.bz2", ("tar", "bz2")),
    ("m.tar.xz", ("tar", "xz")), ("m.blob", ("blob", None)),
])
def test_format_from_the_name(name, kind):
    assert output_kind(name, None) == kind


@pytest.mark.parametrize("name", ["m.zip", "m.gz", "model", "m.so.1", "m.onnx"])
def test_unknown_name_is_refused_not_written_as_a_raw_blob(name, tmp_path):
    with pytest.raises(CompileError, match=r"cannot tell the library format from the name .*\.tar\.gz"):
        export_library(tree(), tmp_path / name)
    assert not (tmp_path / name).exists()
    export_library(tree(), tmp_path / name, fmt="blob")  # an explicit format takes any name
    check(tmp_path / name, "raw")


def test_explicit_tar_format_keeps_the_compression_the_name_asks_for(tmp_path):
    assert output_kind("m.tar.xz", "tar") == ("tar", "xz")
    assert output_kind("m.tar.xz", "blob") == ("blob", None)
    with pytest.raises(CompileError, match="unknown format 'zip'"):
        output_kind("m.zip", "zip")


@pytest.mark.parametrize("suffix,compression", [("tar.gz", "gz"), ("tgz", "gz"), ("tar.bz2", "bz2"),
                                                ("tar.xz", "xz")])
def test_compressed_tar(suffix, compression, tmp_path):
    need_program("cc")
    path = export_library(tree(), tmp_path / f"m.{suffix}")
    with tarfile.open(path, f"r:{compression}") as tar:
        assert tar.getnames() == ["devc.o"]
    lib = check(path, f"tar.{compression}")
    assert lib.member == "devc.o"


def test_compressed_tar_without_compiler_holds_devc_c(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    path = export_library(tree(), tmp_path / "m.tar.gz")
    assert gzip.open(path).read(1)  # really gzip
    assert check(path, "tar.gz").member == "devc.c"


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_shared_library_through_incbin(layout, tmp_path):
    """The .so made from the ``.S`` file: the dynamic linker finds the symbol and its bytes are the
    symbol content, exported from read-only data, and the stack stays non-executable."""
    need_program("cc")
    path = export_library(tree(), tmp_path / "m.so", layout=layout)
    check(path, "elf", layout)
    symbol = BLOB_SYMBOL if layout == "classic" else FFI_BLOB_SYMBOL
    content = symbol_bytes(tree(), layout)
    handle = ctypes.CDLL(path)
    addr = ctypes.addressof(ctypes.c_char.in_dll(handle, symbol))
    assert ctypes.string_at(addr, len(content)) == content
    readelf = need_program("readelf")
    segments = subprocess.run([readelf, "-lW", path], capture_output=True, text=True, check=True).stdout
    (stack,) = [line for line in segments.splitlines() if "GNU_STACK" in line]
    assert "RWE" not in stack


@pytest.mark.toolchain
@pytest.mark.parametrize("cc,arch", [("arm-linux-gnueabihf-gcc", "ARM ELF32 le"),
                                     ("mips-linux-gnu-gcc", "MIPS ELF32 be")])
@pytest.mark.parametrize("suffix", ["so", "tar"])
def test_cross_compilers(cc, arch, suffix, tmp_path):
    path = export_library(tree(), tmp_path / f"m.{suffix}", cc=need_program(cc))
    lib = check(path, "elf" if suffix == "so" else "tar")
    assert lib.arch == arch


@pytest.mark.toolchain
@pytest.mark.parametrize("suffix", ["dylib", "tar"])
def test_macho_through_clang(suffix, tmp_path):
    """clang targeting macOS (a wrapper script as --cc, as a user would write one): the ``.S`` file
    takes its Mach-O branch (``__APPLE__``), the symbol gets its leading underscore."""
    clang = need_program("clang")
    wrapper = tmp_path / "clang-macos"
    wrapper.write_text(f'#!/bin/sh\nexec {clang} -target arm64-apple-macos11 -fuse-ld=lld -nostdlib "$@"\n')
    wrapper.chmod(0o755)
    path = export_library(tree(), tmp_path / f"m.{suffix}", cc=str(wrapper))
    lib = check(path, "macho" if suffix == "dylib" else "tar")
    assert lib.arch == "ARM64" and lib.symbol == BLOB_SYMBOL


def test_byoc_compile_refuses_an_unknown_suffix(tmp_path, capsys):
    """``byoc compile -o model.zip``: one line naming the names it knows, status 2, nothing written;
    ``-o model.tar.gz`` writes the gzip tar."""
    src = tmp_path / "seed.onnx"
    onnx.save(seed_model(), src)
    assert main(["compile", str(src), "-o", str(tmp_path / "model.zip"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("byoc: error: cannot tell the library format") and "Traceback" not in err
    assert not (tmp_path / "model.zip").exists()
    need_program("cc")
    assert main(["compile", str(src), "-o", str(tmp_path / "model.tar.gz"), "-q"]) == 0
    assert load_library(tmp_path / "model.tar.gz").container == "tar.gz"
