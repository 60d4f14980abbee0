"""Blob layouts: bytes written out from TVM's ``ModuleSerializer`` (v0.19.0 ``codegen.cc``), the
pre-0.7 writer and tvm-ffi's reader, byte equality with the real TVM's ffi writer, and the module
numbering TVM uses."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import need_module
from rpcsrv.loader import (
    ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, LoaderError,
    UnknownModule, build_blob, load_library, parse_blob, save_ndarray, symbol_content,
)
from rpcsrv.loader.blob import parse_blob_ex
from rpcsrv.loader.location import read_header
from rpcsrv.loader.modules import require_known


def u64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def vec(*values: int) -> bytes:
    return u64(len(values), *values)


CODE = "subgraph_0\n  input 0 2\n  input 1 2\n  add 2 inputs: 0 1 shape: 2\n"
W = np.arange(2, dtype=np.float32)


def factory_payload(json_text: str, params: dict, name: str = "default") -> bytes:
    # graph JSON, param count, names (a vector), NDArrays, module name
    out = s(json_text) + u64(len(params)) + u64(len(params)) + b"".join(s(k) for k in params)
    return out + b"".join(save_ndarray(v) for v in params.values()) + s(name)


def byoc_tree():
    ej = ExampleJSONModule(CODE)
    return GraphExecutorFactoryModule("{}", {"w": W}, imports=[HostLibraryModule(imports=[ej])])


def test_classic_layout_bytes():
    # groups: 0 factory, 1 _lib, 2 examplejson; then _import_tree (row_ptr, child indices)
    expected = (u64(4) + s("GraphExecutorFactory") + factory_payload("{}", {"w": W}) + s("_lib")
                + s("examplejson") + s(CODE) + s("_import_tree") + vec(0, 1, 2, 2) + vec(1, 2))
    assert build_blob(byoc_tree()) == expected
    root, layout = parse_blob_ex(expected)
    assert layout == "classic"
    assert isinstance(root, GraphExecutorFactoryModule) and root.module_name == "default"
    lib = root.imports[0]
    assert isinstance(lib, HostLibraryModule) and lib.imports[0].code == CODE
    np.testing.assert_array_equal(root.params["w"], W)


def test_ffi_layout_bytes():
    expected = (vec(0, 1, 2, 2) + vec(1, 2) + s("GraphExecutorFactory")
                + s(factory_payload("{}", {"w": W})) + s("_lib") + s("examplejson") + s(s(CODE)))
    assert build_blob(byoc_tree(), "ffi") == expected
    root, layout = parse_blob_ex(expected)
    assert layout == "ffi" and root.imports[0].imports[0].code == CODE


def test_legacy_layout_pre_07():
    # v0.6 PackImportsToC: count of the host module's imports, then type key + payload each
    blob = u64(2) + s("examplejson") + s(CODE) + s("examplejson") + s("other\n")
    root, layout = parse_blob_ex(blob)
    assert layout == "legacy" and isinstance(root, HostLibraryModule)
    assert [m.code for m in root.imports] == [CODE, "other\n"]
    assert build_blob(root, "legacy") == blob


def test_host_only_library_has_no_import_tree():
    # TVM writes a zero count and nothing else when the host library imports nothing
    assert build_blob(HostLibraryModule()) == u64(0)
    root, layout = parse_blob_ex(u64(0))
    assert layout == "legacy" and isinstance(root, HostLibraryModule) and not root.imports


def test_numbering_follows_tvm():
    # root imports [shared, a] and a imports shared.  TVM's stack pops a first (index 1), then
    # shared (2); each row lists child indices sorted, so root's imports come back as [a, shared]
    shared = ConstLoaderModule({"c": W}, {"a": ["c"]})
    a = ExampleJSONModule("a\n", imports=[shared])
    root = HostLibraryModule(imports=[shared, a])
    blob = build_blob(root)
    assert blob.endswith(s("_import_tree") + vec(0, 2, 3, 3) + vec(1, 2, 2))
    back = parse_blob(blob)
    assert [m.type_key for m in back.imports] == ["examplejson", "const_loader"]
    assert back.imports[0].imports[0] is back.imports[1]  # shared, decoded once


def test_tvm_refuses_dag_out_of_dfs_order():
    # root imports [a, b], both import shared: TVM numbers b=1, shared=2, a=3, and a -> shared
    # points backwards, which TVM's serializer rejects; so do we, at build time
    shared = ConstLoaderModule({"c": W}, {"a": ["c"]})
    root = HostLibraryModule(imports=[ExampleJSONModule("a\n", imports=[shared]),
                                      ExampleJSONModule("b\n", imports=[shared])])
    with pytest.raises(ValueError, match="cannot export"):
        build_blob(root)


def test_old_type_keys():
    # names vector, count, NDArrays, symbols vector, count, one name vector per symbol
    consts = u64(1) + s("c") + u64(1) + save_ndarray(W) + u64(1) + s("sym") + u64(1) + u64(1) + s("c")
    blob = (u64(3) + s("GraphRuntimeFactory") + factory_payload("{}", {}) + s("metadata") + consts
            + s("_import_tree") + vec(0, 1, 1) + vec(1))
    root = parse_blob(blob)
    assert root.type_key == "GraphRuntimeFactory" and root.imports[0].type_key == "metadata"
    assert root.imports[0].const_vars_by_symbol == {"sym": ["c"]}
    assert build_blob(root) == blob


def test_unknown_type_key():
    classic = u64(2) + s("cuda") + b"\x00" * 32 + s("_import_tree") + vec(0, 0) + vec()
    with pytest.raises(LoaderError, match=r"unknown module type key 'cuda'.*offset 20"):
        parse_blob(classic)
    ffi = vec(0, 1, 1) + vec(1) + s("_lib") + s("cuda") + s(b"\x01\x02\x03")
    root = parse_blob(ffi)
    unknown = root.imports[0]
    assert isinstance(unknown, UnknownModule) and unknown.payload == b"\x01\x02\x03"
    with pytest.raises(ValueError, match="'cuda'"):
        require_known(unknown)
    assert build_blob(root, "ffi") == ffi


@pytest.mark.parametrize("tree, message", [
    (vec(0, 1, 1) + vec(5), "child index 5 out of range"),
    (vec(0, 1, 2) + vec(1, 0), "cycle"),
    (vec(0, 1, 2) + vec(1, 1), "cycle"),
    (vec(0, 2, 1) + vec(1, 1), "row pointers"),
    (vec(0, 1) + vec(1), "row pointers"),
])
def test_bad_import_tree(tree, message):
    blob = u64(3) + s("examplejson") + s("a\n") + s("examplejson") + s("b\n") + s("_import_tree") + tree
    with pytest.raises(LoaderError, match=message):
        parse_blob(blob)


def test_ffi_blob_equals_real_tvm_writer():
    tvm_ffi = need_module("tvm_ffi", "real TVM serializes the reference tvm-ffi blob")
    need_module("tvm", "registers the const_loader module and the blob writer")
    from rpcsrv.loader.modules import PAYLOADS

    codec = PAYLOADS["const_loader"]
    a = ConstLoaderModule({"w": np.arange(3, dtype="float32")}, {"sym_a": ["w"]})
    b = ConstLoaderModule({"v": np.arange(4, dtype="int64").reshape(2, 2)}, {"sym_b": ["v"]})
    a.imports = [b]
    load = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.const_loader")
    ma, mb = (load(codec.fmt.build(codec.encode(m))) for m in (a, b))
    ma.import_module(mb)
    packed = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(ma).numpy().tobytes()
    assert struct.unpack("<Q", packed[:8])[0] == len(packed) - 8
    assert packed[8:] == build_blob(a, "ffi")
    back = parse_blob(packed[8:])
    np.testing.assert_array_equal(back.imports[0].arrays["v"], b.arrays["v"])


_names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=8)
_arrays = hnp.arrays(st.sampled_from(["float32", "int8", "int64", "bool"]),
                     hnp.array_shapes(min_dims=0, max_dims=3, max_side=3))


def _leaf():
    return st.one_of(
        st.builds(ExampleJSONModule, st.text(max_size=40)),
        st.builds(ConstLoaderModule, st.dictionaries(_names, _arrays, max_size=3),
                  st.dictionaries(_names, st.lists(_names, max_size=3), max_size=2)),
        st.builds(GraphExecutorFactoryModule, st.text(max_size=40),
                  st.dictionaries(_names, _arrays, max_size=3), _names),
    )


def _with_imports(children):
    return st.builds(lambda node, kids: (setattr(node, "imports", kids), node)[1], _leaf(),
                     st.lists(children, max_size=3))


def _canonical(mod):
    """Structure and payloads, with imports in any order (TVM renumbers them)."""
    fields = {k: v for k, v in vars(mod).items() if k != "imports"}
    for key in ("params", "arrays"):
        if key in fields:
            fields[key] = {n: (a.dtype.str, a.shape, a.tobytes()) for n, a in fields[key].items()}
    return (type(mod).__name__, repr(sorted(fields.items())),
            sorted(repr(_canonical(m)) for m in mod.imports))


@settings(max_examples=80, deadline=None)
@given(tree=st.recursive(_leaf(), _with_imports, max_leaves=6), layout=st.sampled_from(["classic", "ffi"]),
       with_lib=st.booleans())
def test_random_trees_round_trip(tree, layout, with_lib):
    root = HostLibraryModule(imports=[tree]) if with_lib else tree
    blob = build_blob(root, layout)
    back, found = parse_blob_ex(blob)
    assert found == ("legacy" if layout == "classic" and isinstance(root, HostLibraryModule)
                     and not root.imports else layout)
    assert _canonical(back) == _canonical(root)
    # TVM renumbers siblings on every write, so a second write may differ in order, never in content
    again = build_blob(back, layout)
    assert len(again) == len(blob) and _canonical(parse_blob(again)) == _canonical(root)


@pytest.mark.parametrize("layout", ["classic", "ffi"])
def test_symbol_content_is_length_then_blob(layout):
    """The one declaration of a blob symbol's content: written by ``symbol_content`` (the exporter's
    side), read back by the container readers' ``read_header`` and by ``load_library`` as a raw file."""
    blob = build_blob(GraphExecutorFactoryModule("{}", {"w": W}, imports=[HostLibraryModule()]), layout)
    content = symbol_content(blob)
    assert content == u64(len(blob)) + blob  # TVM's PackImportsToC: little-endian u64 length first
    assert read_header(memoryview(content + b"pad"), 0, len(content), "raw") == (8, len(blob))
    with pytest.raises(LoaderError, match=rf"says {len(blob)} bytes, but only {len(blob) - 1}"):
        read_header(memoryview(content), 0, len(content) - 1, "raw")
    lib = load_library(content)
    assert (lib.container, lib.layout, lib.blob_offset, lib.blob_size) == ("raw", layout, 8, len(blob))
