"""NDArray and param-dict formats: bytes written out from TVM's ``SaveDLTensor``/``SaveParams``,
byte equality with the real TVM's ``save_param_dict``, zero-copy views, and round trips."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import need_module
from rpcsrv.loader import LoaderError, load_ndarray, load_param_dict, save_ndarray, save_param_dict


def ndarray_bytes(code: int, bits: int, shape: tuple, data: bytes) -> bytes:
    """SaveDLTensor, field by field: magic, reserved, DLDevice(cpu, 0), ndim, DLDataType, shape,
    byte size, data (all little-endian)."""
    return (struct.pack("<QQiii", 0xDD5E40F096B4A13F, 0, 1, 0, len(shape))
            + struct.pack("<BBH", code, bits, 1) + struct.pack(f"<{len(shape)}q", *shape)
            + struct.pack("<q", len(data)) + data)


def test_ndarray_layout_matches_tvm_writer():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = ndarray_bytes(2, 32, (2, 3), arr.tobytes())
    assert save_ndarray(arr) == expected
    got, end = load_ndarray(b"xx" + expected, offset=2)
    assert end == 2 + len(expected)
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("arr, code, bits", [
    (np.array(True), 1, 1),                       # TVM's bool is uint1, one byte per element
    (np.array([1, -2], np.int8), 0, 8),
    (np.zeros((0, 3), np.int64), 0, 64),          # empty tensor
    (np.arange(3, dtype=">f2"), 2, 16),           # big-endian input is stored little-endian
])
def test_ndarray_dtypes(arr, code, bits):
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    raw = ndarray_bytes(code, bits, arr.shape, data)
    assert save_ndarray(arr) == raw
    got, _ = load_ndarray(raw)
    assert got.shape == arr.shape and got.dtype == arr.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, arr)


def test_param_dict_views_not_copies():
    data = bytearray(save_param_dict({"w": np.arange(4, dtype=np.float32)}))
    params = load_param_dict(data)
    assert np.shares_memory(params["w"], np.frombuffer(data, np.uint8))
    data[-4:] = struct.pack("<f", 42.0)  # the view sees the buffer's bytes
    assert params["w"][3] == 42.0


def test_param_dict_equals_real_tvm():
    rt = need_module("tvm.runtime", "real TVM writes the reference param dict")
    params = {"conv_w": np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype("float32"),
              "bias": np.arange(4, dtype="int64"), "scale": np.array(0.5, "float16")}
    theirs = bytes(rt.save_param_dict(params))
    assert save_param_dict(params) == theirs
    back = load_param_dict(theirs)
    assert list(back) == list(params)
    for name in params:
        np.testing.assert_array_equal(back[name], params[name])
    # and TVM reads ours
    again = rt.load_param_dict(save_param_dict(params))
    np.testing.assert_array_equal(again["conv_w"].numpy(), params["conv_w"])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from(["float32", "float64", "int8", "uint16", "int32", "bool",
                                         "float16", "uint64"]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)))
def test_ndarray_round_trip(arr):
    raw = save_ndarray(arr)
    got, end = load_ndarray(raw)
    assert end == len(raw)
    assert got.shape == arr.shape and got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("patch, message", [
    ((0, b"\x00" * 8), "bad NDArray magic"),
    ((24, struct.pack("<i", 1000)), "absurd NDArray ndim 1000"),
    ((24, struct.pack("<i", -1)), "absurd NDArray ndim -1"),
    ((28, bytes([2, 8, 1, 0])), "unsupported NDArray dtype"),   # float8 has no numpy dtype
    ((28, bytes([2, 32, 4, 0])), "unsupported NDArray dtype"),  # vector lanes
    ((16, struct.pack("<i", 2)), "device type 2"),
    ((48, struct.pack("<q", 1 << 40)), "does not match shape"),
])
def test_bad_ndarray(patch, message):
    raw = bytearray(save_ndarray(np.arange(4, dtype=np.float32).reshape(1, 4)))
    at, data = patch
    raw[at:at + len(data)] = data
    with pytest.raises(LoaderError, match=message) as info:
        load_ndarray(bytes(raw))
    assert "offset" in str(info.value)


def test_empty_tensor_with_absurd_shape():
    raw = ndarray_bytes(2, 32, (0, 1 << 62), b"")
    with pytest.raises(LoaderError, match=r"shape \[0, 4611686018427387904\] not representable.*offset 32"):
        load_ndarray(raw)


def test_truncated_ndarray_names_offset():
    raw = save_ndarray(np.arange(4, dtype=np.float32))
    with pytest.raises(LoaderError, match=r"runs past the end.*offset 40"):
        load_ndarray(raw[:-1])


def test_param_dict_count_mismatch():
    raw = bytearray(save_param_dict({"a": np.zeros(2, np.float32)}))
    raw[33:41] = struct.pack("<Q", 2)  # count after the names vector (8+8+8+8+1 bytes)
    with pytest.raises(LoaderError, match=r"arrays: 2 of them, expected one per entry of names \(1\)"):
        load_param_dict(bytes(raw))


_DIM = st.sampled_from([0, 1, 2, 3, 7, 1 << 31, 1 << 62, (1 << 63) - 1, -1, -(1 << 63)])


@settings(max_examples=300, deadline=None)
@given(device=st.sampled_from([1, 2, 0, -1]), ndim=st.integers(-3, 70),
       dtype=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 3)),
       shape=st.lists(_DIM, max_size=8), nbytes=st.one_of(st.integers(-1, 64), _DIM),
       tail=st.binary(max_size=64))
def test_any_ndarray_header_is_accepted_or_refused_cleanly(device, ndim, dtype, shape, nbytes, tail):
    raw = (struct.pack("<QQiii", 0xDD5E40F096B4A13F, 0, device, 0, ndim) + struct.pack("<BBH", *dtype)
           + b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<q", nbytes) + tail)
    try:
        arr, end = load_ndarray(raw)
    except LoaderError as exc:
        assert "offset" in str(exc)
    else:
        assert end <= len(raw) and arr.nbytes <= len(raw)


def test_every_truncation_is_refused():
    raw = save_param_dict({"a": np.arange(3, dtype=np.float32), "b": np.array(2, np.int64)})
    for cut in range(len(raw)):
        with pytest.raises(LoaderError, match="offset"):
            load_param_dict(raw[:cut])
