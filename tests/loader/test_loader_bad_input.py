"""Bad libraries: every defect becomes a LoaderError naming the offset and what was expected,
never a crash and never an allocation the file size cannot justify.  Targeted cases first, then
hypothesis mutating valid libraries of every container."""

from __future__ import annotations

import bz2
import gzip
import io
import struct
import subprocess
import sys
import tarfile
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader_fixtures import compile_library, export_tar, export_tar_c_source, universal_dylib
from rpcsrv.loader import (
    BLOB_SYMBOL, FFI_BLOB_SYMBOL, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule,
    LoaderError, build_blob, load_library,
)
from rpcsrv.executor import load_module as executor_load_module
from rpcsrv.loader.inspect import inspect_library

PARAM = np.arange(16, dtype=np.float32).reshape(4, 4)


def tree():
    lib = HostLibraryModule(imports=[ExampleJSONModule("sg\n  input 0 4\n")])
    return GraphExecutorFactoryModule('{"nodes": []}', {"w": PARAM}, imports=[lib])


def raw_file(layout: str = "classic") -> bytes:
    blob = build_blob(tree(), layout)
    return struct.pack("<Q", len(blob)) + blob


@pytest.fixture(scope="module")
def elf_so(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("bad") / "lib.so"
    return compile_library(build_blob(tree()), BLOB_SYMBOL, "host", path).read_bytes()


def blob_at(data: bytes, layout: str = "classic") -> int:
    """File offset of the blob (found by searching for its bytes, not with the loader)."""
    return data.index(build_blob(tree(), layout))


def patched(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


NOT_A_LIBRARY = "not a TVM library: not ELF, Mach-O, tar or a raw blob"


@pytest.mark.parametrize("data", [
    b"",
    b"\x01\x02",
    b"hello, this is a text file and no library\n",
    b"\x89PNG\r\n\x1a\n" + bytes(64),
    b"\x08\x07\x12\x0bonnx-model" + bytes(100),
    gzip.compress(b"a gzip file that holds no tar" * 20),
    bz2.compress(bytes(1000)),
], ids=["empty", "tiny", "text", "png", "onnx", "gzip", "bzip2"])
def test_not_a_library(data, tmp_path):
    """Any file that is no library says so, not that its first bytes are a bad blob length."""
    with pytest.raises(LoaderError, match=NOT_A_LIBRARY):
        load_library(data)
    if data:
        path = tmp_path / "model.so"
        path.write_bytes(data)
        with pytest.raises(LoaderError, match=rf"model.so: {NOT_A_LIBRARY}"):
            executor_load_module(str(path))  # what tvm.rpc.server.load_module runs


def test_not_a_library_in_rpcsrv_inspect(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is a text file and no library\n")
    run = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"notes.txt: {NOT_A_LIBRARY}" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_raw_blob_whose_length_spells_gzip():
    """A raw blob of 0x088b1f bytes starts with 1f 8b 08 00 00 00 00 00, a gzip header: the loader
    tries the tar, finds none, and reads the raw blob."""
    base = len(build_blob(GraphExecutorFactoryModule("{}", {"w": np.zeros(0, np.uint8)})))
    blob = build_blob(GraphExecutorFactoryModule("{}", {"w": np.zeros(0x088B1F - base, np.uint8)}))
    data = struct.pack("<Q", len(blob)) + blob
    assert data[:3] == b"\x1f\x8b\x08"
    lib = load_library(data)
    assert lib.container == "raw" and lib.root.params["w"].size == 0x088B1F - base


def _one_member_tar(name: str, member: bytes, compression: str) -> bytes:
    """A tar of one member, compressed with ``compression`` (gz, bz2, xz)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(member)
        tar.addfile(info, io.BytesIO(member))
    return buf.getvalue()


def test_truncated_compressed_tar_says_so():
    """A gzip tar cut inside an object member: the decompressor's end-of-data is the error, not the
    garbage a reader would see if it were handed the stream's last bytes again."""
    data = _one_member_tar("lib0.o", b"\x7fELF" + np.random.default_rng(0).bytes(20000), "gz")
    with pytest.raises(LoaderError, match="malformed gz-compressed tar .*ended before the end-of-stream"):
        load_library(data[:len(data) // 2])


def test_compressed_tar_bomb_is_refused():
    """A 20 MB object member packed into a small bzip2 tar: refused before it is decompressed."""
    member = b"\x7fELF" + bytes(20 << 20)
    data = _one_member_tar("devc.o", member, "bz2")
    del member
    assert len(data) * 1032 < 20 << 20
    tracemalloc.start()
    with pytest.raises(LoaderError, match="expands the .*more than 1032 times"):
        load_library(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20


def test_empty_and_tiny_files():
    for data in (b"", b"\x01\x02"):
        with pytest.raises(LoaderError, match="expected"):
            load_library(data)


@pytest.mark.toolchain
def test_truncated_library(elf_so):
    at = blob_at(elf_so)
    for cut in (10, 100, at + 20, at + len(build_blob(tree())) - 1):
        with pytest.raises(LoaderError, match="offset|past the end|malformed ELF"):
            load_library(elf_so[:cut])


@pytest.mark.toolchain
def test_size_header_past_the_end(elf_so):
    at = blob_at(elf_so) - 8
    for size in (len(elf_so), 1 << 62, (1 << 64) - 1):
        with pytest.raises(LoaderError, match=rf"size header at offset {at} says {size} bytes"):
            load_library(patched(elf_so, at, struct.pack("<Q", size)))


def test_raw_size_header_past_the_end():
    data = raw_file()
    with pytest.raises(LoaderError, match="says 4096 bytes.*expected a size that fits"):
        load_library(patched(data, 0, struct.pack("<Q", 4096)))


@pytest.mark.toolchain
def test_lying_lengths_inside_blob(elf_so):
    at = blob_at(elf_so)
    # the first type key's length (after the u64 entry count) and the graph JSON's length
    with pytest.raises(LoaderError, match=rf"length 4611686018427387904 runs past the end.*offset {at + 8}"):
        load_library(patched(elf_so, at + 8, struct.pack("<Q", 1 << 62)))
    json_len_at = at + 8 + 8 + len("GraphExecutorFactory")
    with pytest.raises(LoaderError, match=f"offset {json_len_at}"):
        load_library(patched(elf_so, json_len_at, struct.pack("<Q", 10_000)))
    # the entry count: 2**40 entries cannot fit
    with pytest.raises(LoaderError, match=rf"vector of 1099511627776 elements.*offset {at}"):
        load_library(patched(elf_so, at, struct.pack("<Q", 1 << 40)))


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_bad_param_in_library(layout):
    data = raw_file(layout)
    magic_at = data.index(struct.pack("<Q", 0xDD5E40F096B4A13F))
    with pytest.raises(LoaderError, match=rf"bad NDArray magic.*offset {magic_at}"):
        load_library(patched(data, magic_at, b"\xff" * 8))
    with pytest.raises(LoaderError, match=rf"absurd NDArray ndim 100000.*offset {magic_at + 24}"):
        load_library(patched(data, magic_at + 24, struct.pack("<i", 100_000)))
    with pytest.raises(LoaderError, match=rf"unsupported NDArray dtype \(code 9.*offset {magic_at + 28}"):
        load_library(patched(data, magic_at + 28, bytes([9, 32, 1, 0])))


def test_unknown_module_in_library():
    data = raw_file()
    key = b"examplejson"
    at = data.index(key)
    with pytest.raises(LoaderError, match=r"unknown module type key 'examplejzon'"):
        load_library(patched(data, at, b"examplejzon"))


def test_huge_claims_allocate_nothing():
    """A 1 EiB vector, string or tensor claim in a small file: checked before any allocation."""
    data = raw_file()
    ndarray_at = data.index(struct.pack("<Q", 0xDD5E40F096B4A13F))
    cases = [patched(data, 8, struct.pack("<Q", 1 << 60)),               # entry count
             patched(data, 16, struct.pack("<Q", 1 << 60)),              # type key length
             patched(data, ndarray_at + 32, struct.pack("<qq", 1 << 30, 1 << 30))]  # shape
    for case in cases:
        tracemalloc.start()
        with pytest.raises(LoaderError):
            load_library(case)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 256 * 1024


def _interesting_u64(file_size: int):
    return st.sampled_from([0, 1, 7, 0xFFFF, file_size, file_size + 1, 1 << 31, 1 << 32, 1 << 62,
                            (1 << 63) - 1, 1 << 63, (1 << 64) - 1])


@st.composite
def mutations(draw, size: int, hot: tuple[int, int]):
    """Edits biased towards the blob (``hot``): byte flips, u64 overwrites, one truncation."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        lo, hi = hot if draw(st.booleans()) else (0, size)
        at = draw(st.integers(lo, max(lo, hi - 1)))
        if draw(st.booleans()):
            edits.append(("u64", at, draw(_interesting_u64(size))))
        else:
            edits.append(("byte", at, draw(st.integers(0, 255))))
    cut = draw(st.one_of(st.none(), st.integers(0, size)))
    return edits, cut


def apply(data: bytes, edits, cut) -> bytes:
    buf = bytearray(data)
    for kind, at, value in edits:
        new = struct.pack("<Q", value) if kind == "u64" else bytes([value])
        buf[at:at + len(new)] = new[:max(0, len(buf) - at)]
    return bytes(buf if cut is None else buf[:cut])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, elf_so) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("corpus")
    ffi = build_blob(tree(), "ffi")
    return {
        "raw-classic": raw_file("classic"), "raw-ffi": raw_file("ffi"), "elf-so": elf_so,
        "mips-o": compile_library(ffi, FFI_BLOB_SYMBOL, "mips32be", work / "m.o", "object").read_bytes(),
        "macho-o": compile_library(ffi, FFI_BLOB_SYMBOL, "macho", work / "x.o", "object").read_bytes(),
        "tar": export_tar(build_blob(tree()), BLOB_SYMBOL, work / "x.tar").read_bytes(),
        "fat": universal_dylib(ffi, FFI_BLOB_SYMBOL, work / "f.dylib").read_bytes(),
        "tar-c": export_tar_c_source(build_blob(tree()), BLOB_SYMBOL, work / "c.tar").read_bytes(),
    }


@pytest.mark.toolchain
@pytest.mark.parametrize("name", ["raw-classic", "raw-ffi", "elf-so", "mips-o", "macho-o", "tar", "fat",
                                  "tar-c"])
def test_mutated_libraries(corpus, name):
    data = corpus[name]
    layout = "ffi" if name in ("raw-ffi", "mips-o", "macho-o", "fat") else "classic"
    start = data.find(build_blob(tree(), layout)) - 8
    if start < 0:  # tar-c: the blob is hex text; aim at the array instead
        start = data.find(b"__tvm_dev_mblob")
    hot = (max(0, start), start + 8 + len(build_blob(tree(), layout)))
    for warm_up in (data, data[:len(data) // 2], apply(data, [("u64", hot[0], 1 << 40)], None)):
        try:  # first calls import and cache things; allocations are measured after that
            inspect_library(warm_up)
        except LoaderError:
            pass

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mutations(len(data), hot))
    def run(mutation):
        bad = apply(data, *mutation)
        tracemalloc.start()
        try:
            inspect_library(bad)
        except LoaderError as exc:
            assert "offset" in str(exc) or "expected" in str(exc), str(exc)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 4 * len(data) + (1 << 20), f"peak allocation {peak} for a {len(data)}-byte file"

    run()
