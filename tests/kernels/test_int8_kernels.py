"""The compiled int8 kernels (``kernels/quant/qgemm*.c``, ``qconv.c``, ``qops.c``) against exact integer
arithmetic and the numpy reference kernels, with every micro-kernel this CPU runs (AVX-512 VNNI, AVX-VNNI, the
AVX-512VL 8-lane form, AVX2, generic C here): the int32 sums exact at the extremes (255 x 127 and 255 x -128 on
every product, where vpmaddubsw would saturate), the requantization rounding half to even as
``rpcsrv.loader.opset.quant.requantize`` says, per-tensor and per-channel parameters, int8 and uint8 activations
and weights, weight zero points, fused clamps, both activation layouts."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import need_program
from rpcsrv.executor.kernels import KERNELS
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.quant import qpack
from rpcsrv.executor.kernels.quant.plans_qops import (dequantize_plan, q_add_plan, q_gap_plan, q_maxpool_plan,
                                                      q_table_plan, quantize_plan, dynamic_matmul_plan)
from rpcsrv.executor.kernels.quant.plans_quant import q_conv_plan
from rpcsrv.loader.opset.quant import QuantParams, clamp_bounds, multiplier, requantize

RNG = np.random.default_rng(11)
U8, S8, I32, F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float32)


@pytest.fixture(scope="module")
def lib():
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    found = compiled.library()
    assert found is not None, compiled.status()
    return found


def _names(lib):
    return [(k, name) for k, (name, ok) in enumerate(qpack.kernels(lib)) if ok]


@pytest.fixture(params=range(5), ids=lambda k: f"kernel{k}")
def kernel(lib, request):
    """Each micro-kernel this CPU runs, selected for the test (the best one again afterwards)."""
    usable = _names(lib)
    if request.param >= len(usable):
        pytest.skip("fewer micro-kernels on this CPU")
    index, name = usable[request.param]
    assert lib.rpcsrv_qgemm_select(index) == 0
    yield name
    lib.rpcsrv_qgemm_select(usable[0][0])


def _a(x):
    return np.asarray(x)


def _gemm(lib, a, w, bzp, bias, mult, out, yzp=0, lo=0, hi=0, za=0, fbias=None, ascale=1.0):
    packed = qpack.PackedGemm(lib, w, bzp, bias, mult, out, yzp, lo, hi, fbias)
    y = np.empty((a.shape[0], w.shape[1]), out)
    assert lib.rpcsrv_qgemm(packed.ptr, a.ctypes.data, a.shape[0], a.shape[1], qpack.qtype_signed(a.dtype), za,
                            ascale, y.ctypes.data, w.shape[1]) == 0
    return y


def _exact(a, za, w, bzp):
    return (a.astype(np.int64) - za) @ (w.astype(np.int64) - np.asarray(bzp, np.int64).reshape(1, -1))


@pytest.mark.parametrize("adtype, wdtype", [(U8, S8), (S8, S8), (U8, U8), (S8, U8)])
def test_extreme_products_are_exact(lib, kernel, adtype, wdtype):
    """Every product at the types' extremes, with K up to 4099 (sums past 2^20): the int32 sums exact."""
    for k in (1, 3, 4, 17, 64, 1027, 4099):
        for av, wv in ((255, 127), (255, -128), (-128, -128), (127, 127), (0, -128)):
            a = np.full((7, k), np.clip(av, *qpack_bounds(adtype)), adtype)
            w = np.full((k, 37), np.clip(wv, *qpack_bounds(wdtype)), wdtype)
            got = _gemm(lib, a, w, 0, None, np.ones(37, F32), I32)
            np.testing.assert_array_equal(got, _exact(a, 0, w, 0), err_msg=f"{kernel} k={k} a={av} w={wv}")


def qpack_bounds(dtype):
    info = np.iinfo(dtype)
    return info.min, info.max


@pytest.mark.parametrize("adtype, wdtype", [(U8, S8), (S8, S8), (U8, U8)])
def test_random_products_with_zero_points_and_bias(lib, kernel, adtype, wdtype):
    for m, k, n in ((1, 1, 1), (5, 7, 3), (13, 32, 16), (29, 100, 70), (64, 288, 129)):
        a = RNG.integers(*qpack_bounds(adtype), size=(m, k), endpoint=True).astype(adtype)
        w = RNG.integers(*qpack_bounds(wdtype), size=(k, n), endpoint=True).astype(wdtype)
        za = int(RNG.integers(*qpack_bounds(adtype)))
        bzp = RNG.integers(*qpack_bounds(wdtype), size=n).astype(wdtype)
        bias = RNG.integers(-10000, 10000, n).astype(np.int32)
        got = _gemm(lib, a, w, bzp, bias, np.ones(n, F32), I32, za=za)
        np.testing.assert_array_equal(got, _exact(a, za, w, bzp) + bias, err_msg=f"{kernel} {m}x{k}x{n}")


@pytest.mark.parametrize("out", [U8, S8])
def test_requantization_rounds_half_to_even_and_clamps(lib, kernel, out):
    """Sums that land exactly on .5 after the multiplier (2^-k multipliers make the product exact) round to
    even, as ``quant.requantize``; a narrower clamp (a fused Relu/Clip) is applied."""
    m, k, n = 9, 8, 40
    a = RNG.integers(0, 256, (m, k)).astype(U8)
    w = RNG.integers(-128, 128, (k, n)).astype(S8)
    mult = (2.0 ** -RNG.integers(0, 6, n)).astype(F32)
    yzp = 3 if out == U8 else -5
    lo, hi = qpack_bounds(out)
    for bounds in ((lo, hi), (yzp, hi), (lo + 20, hi - 30)):
        got = _gemm(lib, a, w, 0, None, mult, out, yzp, *bounds, za=17)
        want = requantize(_exact(a, 17, w, 0), mult.reshape(1, -1), np.asarray(yzp, out), bounds)
        np.testing.assert_array_equal(got, want, err_msg=f"{kernel} {bounds}")


def test_float_output_with_a_dynamic_scale(lib, kernel):
    a = RNG.integers(0, 256, (11, 40)).astype(U8)
    w = RNG.integers(-128, 128, (40, 24)).astype(S8)
    bs = (RNG.random(24) * 0.01).astype(F32)
    fbias = RNG.standard_normal(24).astype(F32)
    got = _gemm(lib, a, w, 0, None, bs, F32, za=128, fbias=fbias, ascale=0.037)
    want = _exact(a, 128, w, 0).astype(F32) * (np.float32(0.037) * bs) + fbias
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


CONVS = [  # (x shape, w shape, group, attrs)
    ((1, 3, 17, 15), (8, 3, 3, 3), 1, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((2, 16, 9, 9), (24, 16, 1, 1), 1, {}),
    ((1, 16, 9, 9), (20, 16, 1, 1), 1, dict(strides=[2, 2])),
    ((1, 12, 8, 10), (16, 12, 3, 3), 1, dict(pads=[1, 1, 1, 1], dilations=[2, 2])),
    ((1, 8, 7, 7), (8, 8, 5, 5), 1, dict(pads=[2, 1, 2, 1])),
    ((1, 32, 12, 12), (32, 1, 3, 3), 32, dict(pads=[1, 1, 1, 1])),
    ((1, 24, 11, 11), (24, 1, 3, 3), 24, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 16, 9, 9), (16, 1, 5, 5), 16, dict(pads=[2, 2, 2, 2])),
    ((2, 40, 13, 13), (40, 1, 3, 3), 40, dict(pads=[1, 0, 1, 1], strides=[2, 2])),  # an odd width: a lone last pixel
    # stride-2 stems: over their space-to-depth copy (qconv_s2d.c) where the tiles read int8 patches in place
    ((2, 3, 23, 19), (16, 3, 7, 7), 1, dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    ((1, 5, 16, 13), (24, 5, 5, 5), 1, dict(pads=[1, 2, 2, 0], strides=[2, 2])),
    ((1, 3, 12, 12), (8, 3, 6, 5), 1, dict(strides=[2, 2])),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("xdtype", [U8, S8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_plan_matches_the_reference_kernel(lib, kernel, case, xdtype, per_channel):
    xshape, wshape, group, attrs = CONVS[case]
    attrs = dict(attrs, group=group, kernel_shape=list(wshape[2:]))
    m = wshape[0]
    x = RNG.integers(*qpack_bounds(xdtype), size=xshape, endpoint=True).astype(xdtype)
    w = RNG.integers(-128, 128, wshape).astype(S8)
    ws = _a((RNG.random(m if per_channel else 1) * 0.01 + 0.001).astype(F32).reshape(-1 if per_channel else ()))
    wz = np.zeros(ws.shape, S8)
    xs, xz = _a(np.float32(0.05)), _a(xdtype.type(7))
    ys, yz = _a(np.float32(0.2)), _a(xdtype.type(-3 if xdtype == S8 else 120))
    b = RNG.integers(-2000, 2000, m).astype(np.int32)
    args = [x, xs, xz, w, ws, wz, ys, yz, b]
    ref_kernel = KERNELS["q_linear_conv"]
    # the float32 rule of quant.requantize (onnxruntime's): the exact sums, times the float32 multiplier
    acc = KERNELS["conv_integer"](x, w, xz, wz, **attrs).astype(np.int64) + b.reshape(-1, 1, 1)
    mult = multiplier(xs, ws, ys).reshape(-1, 1, 1)
    for act in ({}, dict(activation="relu"), dict(activation="clip", activation_attrs={"min": 0.0, "max": 6.0})):
        full = dict(attrs, **act)
        table = ref_kernel(*args, **full)  # the reference (float64 products): a step apart on rare elements
        want = requantize(acc, mult, yz, clamp_bounds(act.get("activation"), act.get("activation_attrs"),
                                                      QuantParams.of(ys, yz)))
        assert np.abs(want.astype(int) - table.astype(int)).max() <= 1
        plan = q_conv_plan(ref_kernel, full, [(x.shape, x.dtype)] + args[1:], want.shape, want.dtype)
        assert plan is not None
        got = plan(*args)
        np.testing.assert_array_equal(got, want, err_msg=f"{kernel} {act}")
        assert got.strides == qpack.nhwc_strides(want.shape)  # written channels-last
        x_last = x.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # the input channels-last, read in place
        np.testing.assert_array_equal(plan(x_last, *args[1:]), want, err_msg=f"{kernel} {act} channels-last")


def _plan(planner, kernel, args, computed_at=(0,), attrs=None):
    attrs = attrs or {}
    want = kernel(*args, **attrs)
    want = want[0] if isinstance(want, tuple) else want
    inputs = [(a.shape, a.dtype) if k in computed_at else a for k, a in enumerate(args)]
    plan = planner(kernel, attrs, inputs, want.shape, want.dtype)
    assert plan is not None
    return plan, want


@pytest.mark.parametrize("dtype", [U8, S8])
def test_the_elementwise_plans_match_the_reference_kernels(lib, dtype):
    shape = (1, 24, 10, 9)
    lo, hi = qpack_bounds(dtype)
    x = (RNG.standard_normal(shape) * 3).astype(F32)
    s, z = _a(np.float32(0.0473)), _a(dtype.type(5))
    plan, want = _plan(quantize_plan, KERNELS["quantize_linear"], [x, s, z])
    q = plan(x, s, z)
    np.testing.assert_array_equal(q, want)
    plan, want = _plan(dequantize_plan, KERNELS["dequantize_linear"], [q, s, z])
    np.testing.assert_array_equal(plan(q, s, z), want)
    b = RNG.integers(lo, hi + 1, shape).astype(dtype)
    add_args = [q, s, z, b, _a(np.float32(0.031)), _a(dtype.type(lo + 2)), _a(np.float32(0.061)), _a(dtype.type(1))]
    plan, want = _plan(q_add_plan, KERNELS["q_linear_add"], add_args, computed_at=(0, 3))
    np.testing.assert_array_equal(plan(*add_args), want)
    gap_args = [q, s, z, _a(np.float32(0.01)), _a(dtype.type(lo + 9))]
    plan, want = _plan(q_gap_plan, KERNELS["q_linear_global_average_pool"], gap_args)
    np.testing.assert_array_equal(plan(*gap_args), want)
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    plan, want = _plan(q_maxpool_plan, KERNELS["max_pool"], [q], attrs=pool)
    np.testing.assert_array_equal(plan(q), want)
    for op, attrs in (("q_linear_sigmoid", {}), ("q_linear_leaky_relu", {"alpha": 0.1})):
        table_args = [q, s, z, _a(np.float32(1 / 256)), _a(dtype.type(lo))]
        plan, want = _plan(q_table_plan, KERNELS[op], table_args, attrs=attrs)
        np.testing.assert_array_equal(plan(*table_args), want)


def test_dynamic_quantize_matmul_matches_the_reference(lib):
    x = (RNG.standard_normal((2, 16, 48)) * 2).astype(F32)
    w = RNG.integers(-128, 128, (48, 40)).astype(S8)
    bs, bz, bias = _a((RNG.random(40) * 0.01).astype(F32)), _a(np.zeros(40, S8)), RNG.standard_normal(40).astype(F32)
    args = [x, w, bs, bz, bias]
    plan, want = _plan(dynamic_matmul_plan, KERNELS["dynamic_quantize_matmul"], args)
    np.testing.assert_allclose(plan(*args), want, rtol=1e-5, atol=1e-5)
    q = np.empty(x.shape, U8)
    params = np.empty(2, F32)
    lib.rpcsrv_dynamic_quantize(x.ctypes.data, x.size, q.ctypes.data, params.ctypes.data)
    ref = KERNELS["dynamic_quantize_linear"](x)
    np.testing.assert_array_equal(q, ref[0])
    assert params[0] == ref[1] and params[1] == ref[2]


def test_every_kernel_is_listed_with_its_instructions(lib):
    listed = qpack.kernels(lib)
    assert listed[-1] == ("generic C", True)
    assert qpack.isa(lib) == next(name for name, ok in listed if ok)
    assert lib.rpcsrv_qgemm_select(len(listed)) == -1
    assert ctypes.c_long  # (the listing reads the support flag through ctypes)


def test_a_plan_given_other_arrays_runs_the_table_kernel(lib):
    """A planned conv called with weights that are not the bound array (equal or not), or an input of another
    layout, gives what the table kernel gives for those arguments."""
    xshape, wshape = (1, 8, 6, 6), (8, 8, 3, 3)
    x = RNG.integers(0, 256, xshape).astype(U8)
    w = RNG.integers(-128, 128, wshape).astype(S8)
    args = [x, _a(np.float32(0.05)), _a(np.uint8(3)), w, _a(np.float32(0.01)), _a(np.int8(0)), _a(np.float32(0.3)),
            _a(np.uint8(9))]
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    ref = KERNELS["q_linear_conv"]
    plan = q_conv_plan(ref, attrs, [(xshape, U8)] + args[1:], xshape, U8)
    planned = plan(*args)  # (the reference's float64 products: a step apart on rare elements)
    assert np.abs(planned.astype(int) - ref(*args, **attrs).astype(int)).max() <= 1
    other = args[:3] + [np.ascontiguousarray(w[::-1])] + args[4:]  # another weight array: not the packed one
    np.testing.assert_array_equal(plan(*other), ref(*other, **attrs))
    same_values = args[:3] + [w.copy()] + args[4:]  # equal values, another array: the table kernel too
    np.testing.assert_array_equal(plan(*same_values), ref(*args, **attrs))
    strided = np.zeros((1, 8, 6, 12), U8)[..., ::2]  # neither layout: copied first
    strided[...] = x
    np.testing.assert_array_equal(plan(strided, *args[1:]), planned)


@pytest.mark.parametrize("dtype", [U8, S8])
def test_an_images_quantize_and_a_wide_max_pool_match_the_reference_kernels(lib, dtype):
    """QuantizeLinear of 3 channels (the image's: its own store) and MaxPool over 64 channels and a tail of 24, at
    the type's extremes (values quantizing to both ends, every pooled pixel's maximum at lo or hi somewhere)."""
    lo, hi = qpack_bounds(dtype)
    x = (RNG.standard_normal((2, 3, 37, 29)) * 4).astype(F32)
    x[:, :, ::5] = 1e4
    x[:, :, 1::5] = -1e4
    s, z = _a(np.float32(0.0173)), _a(dtype.type(lo + 7))
    plan, want = _plan(quantize_plan, KERNELS["quantize_linear"], [x, s, z])
    q = plan(x, s, z)
    np.testing.assert_array_equal(q, want)
    assert {int(q.min()), int(q.max())} == {lo, hi}
    b = RNG.integers(lo, hi + 1, (2, 88, 13, 11)).astype(dtype)
    b[:, :, ::4, ::3] = lo
    b[:, 40:, 1::4] = hi
    for pool in (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), dict(kernel_shape=[2, 2])):
        plan, want = _plan(q_maxpool_plan, KERNELS["max_pool"], [b], attrs=pool)
        np.testing.assert_array_equal(plan(b), want)


def test_float_output_with_a_fused_relu(lib, kernel):
    """The float store's Relu (a dynamic MatMul's fused activation) on every micro-kernel: max(0, y) after the bias,
    the negative sums at the extremes (255 x -128 on every product) among them."""
    a = RNG.integers(0, 256, (13, 36)).astype(U8)
    a[0] = 255
    w = RNG.integers(-128, 128, (36, 40)).astype(S8)
    w[:, 0] = -128
    bs, fbias = (RNG.random(40) * 0.01).astype(F32), RNG.standard_normal(40).astype(F32)
    packed = qpack.PackedGemm(lib, w, 0, None, bs, F32, fbias=fbias, relu=True)
    got = np.empty((13, 40), F32)
    assert lib.rpcsrv_qgemm(packed.ptr, a.ctypes.data, 13, 36, 0, 0, 0.037, got.ctypes.data, 40) == 0
    plain = _exact(a, 0, w, 0).astype(F32) * (np.float32(0.037) * bs) + fbias
    np.testing.assert_allclose(got, np.maximum(plain, 0), rtol=1e-6, atol=1e-6)
    assert got[0, 0] == 0 and (plain < 0).mean() > 0.2 and (got > 0).mean() > 0.2, kernel


def test_dynamic_quantize_matmul_with_relu_matches_the_reference(lib):
    x = (RNG.standard_normal((2, 16, 48)) * 2).astype(F32)
    x[0, 0] = 60.0  # the range's extremes: most of the rest quantizes near the zero point
    x[1, 3] = -45.0
    w = RNG.integers(-128, 128, (48, 40)).astype(S8)
    bs, bz, bias = _a((RNG.random(40) * 0.01).astype(F32)), _a(np.zeros(40, S8)), RNG.standard_normal(40).astype(F32)
    args = [x, w, bs, bz, bias]
    plan, want = _plan(dynamic_matmul_plan, KERNELS["dynamic_quantize_matmul"], args, attrs={"activation": "relu"})
    got = plan(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plain = KERNELS["dynamic_quantize_matmul"](*args)
    np.testing.assert_allclose(want, np.maximum(plain, 0))
    assert (plain < 0).any() and (got > 0).any()


@pytest.mark.parametrize("dtype", [U8, S8])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_q_add_of_every_pair_of_integers_matches_the_reference(lib, dtype, activation):
    """QLinearAdd of all 65536 pairs of operands (and a tail of 13 past the 64-element blocks), exactly the reference
    kernel's integers: the AVX-512 path where the CPU has it, the C loop elsewhere."""
    lo, hi = qpack_bounds(dtype)
    a = np.repeat(np.arange(lo, hi + 1), 256).astype(dtype)[:65536 - 51].reshape(1, -1, 1, 1)
    b = np.tile(np.arange(lo, hi + 1), 256).astype(dtype)[:65536 - 51].reshape(1, -1, 1, 1)
    args = [a, _a(np.float32(0.0371)), _a(dtype.type(lo + 100)), b, _a(np.float32(0.0213)), _a(dtype.type(hi - 90)),
            _a(np.float32(0.0459)), _a(dtype.type(lo + 131))]
    attrs = {"activation": activation} if activation else {}
    plan, want = _plan(q_add_plan, KERNELS["q_linear_add"], args, computed_at=(0, 3), attrs=attrs)
    got = plan(*args)
    np.testing.assert_array_equal(got, want)
    assert {int(got.min()), int(got.max())} == {lo + 131 if activation else lo, hi}


def test_stride_2_stems_of_few_channels_run_over_their_space_to_depth_copy(lib):
    """The 7x7 and 3x3 stems of CONVS (3 channels, stride 2) take ``qconv_s2d.c`` where the tiles read uint8 patches
    in place, a 1x1 stride-2 conv of 16 channels does not; the results are the
    reference's (test_conv_plan_matches_the_reference_kernel)."""
    from rpcsrv.executor.kernels.quant.qchain import step_fn

    if not lib.rpcsrv_qconv_in_place(0):
        pytest.skip("the kernel in use reads no patches in place")
    for (xshape, wshape, group, attrs), want in ((CONVS[0], True), (CONVS[9], True), (CONVS[2], False)):
        x = np.zeros(xshape, U8)
        w = RNG.integers(-128, 128, wshape).astype(S8)
        args = [x, _a(np.float32(0.05)), _a(np.uint8(7)), w, _a(np.float32(0.01)), _a(np.int8(0)),
                _a(np.float32(0.2)), _a(np.uint8(120))]
        full = dict(attrs, group=group, kernel_shape=list(wshape[2:]))
        shape = KERNELS["q_linear_conv"](*args, **full).shape
        plan = q_conv_plan(KERNELS["q_linear_conv"], full, [(x.shape, x.dtype)] + args[1:], shape, U8)
        assert (plan.link(("nhwc",)).fn == step_fn(lib, "s2dconv")) is want, (xshape, wshape)
