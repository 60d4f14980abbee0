"""Libraries built by real toolchains (gcc, Debian cross gcc for 32-bit ARM and big-endian MIPS,
clang for Mach-O), tars as ``export_library`` writes them, raw blob files: the loader must give
back the tree, graph, params and subgraphs that went in."""

from __future__ import annotations

import json
import mmap
import struct
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from conftest import need_module, need_program
from loader_fixtures import (
    HOST_FUNCTION, TARGETS, c_source, compile_library, export_tar, export_tar_c_source, export_tar_tvm,
    strip_section_headers, universal_dylib,
)
from rpcsrv.loader import (
    BLOB_SYMBOL, FFI_BLOB_SYMBOL, ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,
    HostLibraryModule, build_blob, load_library,
)
from rpcsrv.loader.inspect import format_inspection, inspect_library

SYMBOLS = {"classic": BLOB_SYMBOL, "ffi": FFI_BLOB_SYMBOL}
GRAPH = json.dumps({"nodes": [{"op": "null", "name": "x", "inputs": []},
                              {"op": "tvm_op", "name": "ext0", "inputs": [[0, 0, 0]],
                               "attrs": {"func_name": "ext0", "num_inputs": "1", "num_outputs": "1"}}],
                    "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
                    "attrs": {"shape": ["list_shape", [[2, 3], [2, 3]]],
                              "dltype": ["list_str", ["float32", "float32"]]}})
CODE = "ext0\n  input 0 2 3\n  const 1 2 3 name: ext0_const_0\n  add 2 inputs: 0 1 shape: 2 3\n"
PARAMS = {"p0": np.arange(6, dtype=np.float32).reshape(2, 3), "p1": np.array([7], np.int64)}
CONST = np.full((2, 3), 0.5, np.float32)


def make_tree() -> GraphExecutorFactoryModule:
    ej = ExampleJSONModule(CODE)
    consts = ConstLoaderModule({"ext0_const_0": CONST}, {"ext0": ["ext0_const_0"]}, imports=[ej])
    return GraphExecutorFactoryModule(GRAPH, dict(PARAMS), imports=[HostLibraryModule(imports=[consts])])


def check_tree(root) -> None:
    assert isinstance(root, GraphExecutorFactoryModule)
    assert root.graph_json == GRAPH and root.module_name == "default"
    assert list(root.params) == list(PARAMS)
    for name, arr in PARAMS.items():
        np.testing.assert_array_equal(root.params[name], arr)
        assert root.params[name].dtype == arr.dtype
    (lib,) = root.imports
    assert isinstance(lib, HostLibraryModule)
    (consts,) = lib.imports
    assert consts.const_vars_by_symbol == {"ext0": ["ext0_const_0"]}
    np.testing.assert_array_equal(consts.arrays["ext0_const_0"], CONST)
    assert [m.code for m in consts.imports] == [CODE]


@pytest.fixture(scope="module")
def blobs():
    return {layout: build_blob(make_tree(), layout) for layout in SYMBOLS}


ARCH = {"host": None, "arm32": "ARM ELF32 le", "mips32be": "MIPS ELF32 be", "macho": "ARM64"}


@pytest.mark.toolchain
@pytest.mark.parametrize("layout", ["classic", "ffi"])
@pytest.mark.parametrize("kind", ["shared", "object"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_compiled_library(blobs, tmp_path, target, kind, layout):
    path = compile_library(blobs[layout], SYMBOLS[layout], target, tmp_path / f"lib.{kind}", kind)
    lib = load_library(path)
    assert lib.container == ("macho" if target == "macho" else "elf")
    if ARCH[target]:
        assert lib.arch == ARCH[target]
    assert lib.layout == layout and lib.symbol == SYMBOLS[layout] and lib.path == str(path)
    assert HOST_FUNCTION in lib.symbols and lib.root.imports[0].symbols == lib.symbols
    check_tree(lib.root)
    # params are views over the mapped file, at the blob's place in it
    raw = path.read_bytes()
    assert raw[lib.blob_offset - 8:lib.blob_offset] == struct.pack("<Q", len(blobs[layout]))
    assert raw[lib.blob_offset:lib.blob_offset + lib.blob_size] == blobs[layout]
    base = lib.root.params["p0"]
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # a view of the mapping
    assert not lib.root.params["p0"].flags.writeable


STRIP = {"host": "strip", "arm32": "arm-linux-gnueabihf-strip", "mips32be": "mips-linux-gnu-strip"}


@pytest.mark.toolchain
@pytest.mark.parametrize("target", list(STRIP))
def test_stripped(blobs, tmp_path, target):
    """``strip`` (symbols from .dynsym only), then no section headers at all (program headers)."""
    path = compile_library(blobs["classic"], BLOB_SYMBOL, target, tmp_path / "s.so")
    subprocess.run([need_program(STRIP[target]), "--strip-all", str(path)], check=True)
    check_tree(load_library(path).root)
    strip_section_headers(path)
    lib = load_library(path)
    assert HOST_FUNCTION in lib.symbols
    check_tree(lib.root)


@pytest.mark.toolchain
@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_export_tar(blobs, tmp_path, layout):
    lib = load_library(export_tar(blobs[layout], SYMBOLS[layout], tmp_path / "model.tar"))
    assert (lib.container, lib.member, lib.layout) == ("tar", "devc.o", layout)
    assert {HOST_FUNCTION, "tvmgen_default_fused_mul"} <= set(lib.symbols)  # from both members
    check_tree(lib.root)


@pytest.mark.toolchain
@pytest.mark.parametrize("layout,devc", [("classic", "o"), ("ffi", "o"), ("classic", "c")])
def test_tvm_tar_is_gzip(blobs, tmp_path, layout, devc):
    """TVM's export_library("m.tar") runs ``tar -czf``: a gzip file named .tar."""
    path = export_tar_tvm(blobs[layout], SYMBOLS[layout], tmp_path / "model.tar", devc)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    lib = load_library(path)
    assert (lib.container, lib.member, lib.layout) == ("tar.gz", f"devc.{devc}", layout)
    assert "tvmgen_default_fused_mul" in lib.symbols
    check_tree(lib.root)
    where = "of the decoded C array" if devc == "c" else "of the decompressed member"
    assert where in format_inspection(inspect_library(path))


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_compressed_tar_of_any_kind(blobs, tmp_path, compression):
    """Whatever ``tarfile`` opens: the raw-blob-in-C-source member of a tar compressed three ways."""
    path = tmp_path / f"model.tar.{compression}"
    src = tmp_path / "devc.c"
    src.write_text(c_source(blobs["classic"], BLOB_SYMBOL))
    with tarfile.open(path, f"w:{compression}") as tar:
        tar.add(src, arcname="devc.c")
    lib = load_library(path)
    assert (lib.container, lib.member) == (f"tar.{compression}", "devc.c")
    check_tree(lib.root)
    text = format_inspection(inspect_library(path))
    assert text.startswith(f"{path}: tar.{compression} (") and "of the decoded C array" in text


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_raw_blob_file(blobs, tmp_path, layout):
    path = tmp_path / "model.blob"
    path.write_bytes(struct.pack("<Q", len(blobs[layout])) + blobs[layout])
    lib = load_library(path)
    assert (lib.container, lib.layout, lib.symbols) == ("raw", layout, [])
    check_tree(lib.root)
    check_tree(load_library(path.read_bytes()).root)  # bytes in memory work too


@pytest.mark.toolchain
def test_library_without_blob(tmp_path):
    """No blob: a plain host module (TVM's LibraryModule), its functions listed (issue 17)."""
    path = compile_library(b"", "not_the_blob", "host", tmp_path / "plain.so")
    lib = load_library(path)
    assert (lib.layout, lib.root.type_key, lib.root.path) == ("none", "library", str(path))
    assert HOST_FUNCTION in lib.root.symbols


def _tvm_const_loader_tree():
    """A host library importing a const_loader, built inside the real TVM (0.21+ tvm-ffi)."""
    tvm_ffi = need_module("tvm_ffi", "the real TVM writes the reference library")
    need_module("tvm", "registers the const_loader module and the blob writer")
    from rpcsrv.loader.modules import PAYLOADS

    codec = PAYLOADS["const_loader"]
    ours = ConstLoaderModule({"c": CONST}, {"ext0": ["c"]})
    load = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.const_loader")
    return tvm_ffi, ours, load(codec.fmt.build(codec.encode(ours)))


@pytest.mark.tvm
@pytest.mark.toolchain
def test_library_from_tvm_pack_imports_to_c(tmp_path):
    """TVM's own PackImportsToC output, compiled with gcc, read by the loader."""
    tvm_ffi, ours, theirs = _tvm_const_loader_tree()
    c_code = tvm_ffi.get_global_func("runtime.ModulePackImportsToC")(theirs, False, "")
    src = tmp_path / "devc.c"
    src.write_text(c_code)
    out = tmp_path / "devc.so"
    subprocess.run([need_program("gcc"), "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    lib = load_library(out)
    assert (lib.layout, lib.symbol) == ("ffi", FFI_BLOB_SYMBOL)
    assert lib.root.const_vars_by_symbol == ours.const_vars_by_symbol
    np.testing.assert_array_equal(lib.root.arrays["c"], CONST)


@pytest.mark.tvm
@pytest.mark.toolchain
def test_real_tvm_loads_our_library(tmp_path):
    """Our ffi blob in a gcc-built .so, loaded by the real TVM runtime (dlopen + its blob reader)."""
    _, ours, _ = _tvm_const_loader_tree()
    import tvm

    root = HostLibraryModule(imports=[ours])
    path = compile_library(build_blob(root, "ffi"), FFI_BLOB_SYMBOL, "host", tmp_path / "ours.so")
    mod = tvm.runtime.load_module(str(path))
    assert [m.kind for m in mod.imports] == ["const_loader"]


_TVM_EXPORT_TAR = """
import sys
import tvm
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class M:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return R.add(x, x)


tvm.compile(M, target="llvm").export_library(sys.argv[1])
"""


@pytest.mark.tvm
def test_tar_written_by_the_real_tvm(tmp_path):
    """apache-tvm's own export_library("m.tar") (a Relax VM executable: lib0.o plus devc.o holding
    the blob) is a gzip file; the loader finds the blob in devc.o and the host functions in lib0.o."""
    need_module("tvm", "writes the reference tar")
    script = tmp_path / "export_tar.py"  # TVMScript needs its source in a file
    script.write_text(_TVM_EXPORT_TAR)
    path = tmp_path / "m.tar"
    subprocess.run([sys.executable, str(script), str(path)], check=True, capture_output=True, timeout=300)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    lib = load_library(path)
    assert (lib.container, lib.member, lib.layout) == ("tar.gz", "devc.o", "ffi")
    assert "relax.VMExecutable" in [m.type_key for m in lib.modules()]
    assert lib.symbols  # lib0.o's functions


@pytest.mark.toolchain
def test_universal_macho(blobs, tmp_path):
    lib = load_library(universal_dylib(blobs["ffi"], FFI_BLOB_SYMBOL, tmp_path / "fat.dylib"))
    assert lib.container == "macho" and lib.arch.startswith("universal (")
    assert "ARM64" in lib.arch and "x86_64" in lib.arch
    assert lib.layout == "ffi" and HOST_FUNCTION in lib.symbols
    check_tree(lib.root)


@pytest.mark.toolchain
def test_tar_with_c_source(blobs, tmp_path):
    lib = load_library(export_tar_c_source(blobs["classic"], BLOB_SYMBOL, tmp_path / "model.tar"))
    assert (lib.container, lib.member, lib.layout) == ("tar", "devc.c", "classic")
    assert "tvmgen_default_fused_mul" in lib.symbols
    check_tree(lib.root)


@pytest.mark.toolchain
def test_system_lib_prefix(blobs, tmp_path):
    path = compile_library(blobs["classic"], "tvmgen_mymodel_" + BLOB_SYMBOL, "arm32", tmp_path / "p.o",
                           "object")
    lib = load_library(path)
    assert lib.symbol == "tvmgen_mymodel_" + BLOB_SYMBOL and lib.layout == "classic"
    check_tree(lib.root)
