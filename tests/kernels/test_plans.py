"""Run plans (``kernels/plans.py``, the conv plans of ``kernels/conv/plans_conv.py``): a planned depthwise or 1x1
conv gives ``onnx.reference``'s result on the depthwise cases (stride 2, channel multipliers, dilation,
asymmetric pads) and the fused activations; inputs it was not made for (another shape, a non-contiguous view,
other weights, compiled kernels turned off after planning) run the general kernel; no plan without the compiled
kernels; and the ExampleJSON runtime plans a MobileNet-style block's convs and still matches onnxruntime (the
other ops' plans: test_plans_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.conv import plans_conv
from rpcsrv.executor.kernels.pool import pool
from rpcsrv.executor.kernels.conv.conv import conv
from conftest import need_program
from test_compiled_depthwise import ACTIVATIONS, CASES_2D, _case
from test_depthwise_conv import onnx_conv


@pytest.fixture
def c_kernels(monkeypatch):
    need_program("cc", "plans call the compiled kernels, built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    compiled.reset()
    assert compiled.status()["in_use"], compiled.status()
    yield
    compiled.reset()


def _plan(x, w, b, **attrs):
    """The plan for conv(x, w, b, **attrs) with constant w (and b), x computed; asserts there is one."""
    inputs = [(x.shape, x.dtype), w] + ([] if b is None else [b])
    shape = conv(x, w, b, **attrs).shape
    fn = plans.plan("conv", conv, attrs, inputs, shape, np.float32)
    assert fn is not None and fn.__name__ in ("rows", "pointwise", "im2col_chunks"), attrs
    return fn


def _close(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def _close_with_nans(got, want):
    """:func:`_close` for a case whose reference holds NaNs (some outputs, not all): the same outputs are NaN,
    and the others are close."""
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    _close(np.nan_to_num(got), np.nan_to_num(want))


@pytest.mark.parametrize("case", CASES_2D, ids=[str(i) for i in range(len(CASES_2D))])
@pytest.mark.parametrize("bias", [False, True])
def test_planned_depthwise_matches_onnx_reference(case, bias, c_kernels):
    x, w, b, attrs = _case(case, bias, CASES_2D.index(case))
    fn = _plan(x, w, b, **attrs)
    assert fn.__name__ == "rows"
    _close(fn(x, w, b) if b is not None else fn(x, w), onnx_conv(x, w, b, **attrs))


STEMS = [  # (n, c, m, spatial, kernel, strides, dilations, pads): dense convs of <= 32 taps per output
    (1, 3, 16, (33, 31), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # a stem, stride 2, odd sizes
    (2, 3, 5, (12, 12), (3, 3), (1, 1), (1, 1), (0, 1, 2, 0)),  # two images, asymmetric pads
    (1, 2, 4, (15, 14), (3, 3), (1, 2), (2, 1), (2, 2, 2, 2)),  # dilation, a stride on one axis
    (1, 1, 3, (20, 20), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),  # one channel, 5x5 (25 taps)
]


@pytest.mark.parametrize("case", STEMS, ids=[str(i) for i in range(len(STEMS))])
@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None), ("swish", None)], ids=lambda a: str(a[0]))
def test_planned_stem_matches_onnx_reference(case, activation, c_kernels):
    n, c, m, spatial, kernel, strides, dilations, pads = case
    rng = np.random.default_rng(c * m)
    x = rng.standard_normal((n, c) + spatial).astype(np.float32)
    w = (3 * rng.standard_normal((m, c) + kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads))
    name, extra = activation
    want = onnx_conv(x, w, b, **attrs)
    want = ACTIVATIONS[activation](want) if name else want
    attrs.update({"activation": name, "activation_attrs": dict(extra) if extra else None} if name else {})
    fn = _plan(x, w, b, **attrs)
    assert fn.__name__ == "rows"
    _close(fn(x, w, b), want)


POINTWISE = [(1, 16, 96, (12, 12)), (1, 3, 5, (1, 1)), (1, 40, 8, (7, 9))]


@pytest.mark.parametrize("group", [2, 4])
@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("swish", None)], ids=lambda a: str(a[0]))
def test_planned_grouped_pointwise(group, activation, c_kernels):
    """ShuffleNet's grouped 1x1 convs: one batched product, the epilogue after."""
    rng = np.random.default_rng(group)
    x = rng.standard_normal((1, 8 * group, 6, 5)).astype(np.float32)
    w = rng.standard_normal((12 * group, 8, 1, 1)).astype(np.float32)
    b = rng.standard_normal(12 * group).astype(np.float32)
    name, _ = activation
    want = onnx_conv(x, w, b, group=group)
    want = ACTIVATIONS[activation](want) if name else want
    fn = _plan(x, w, b, group=group, **({"activation": name} if name else {}))
    assert fn.__name__ == "pointwise"
    _close(fn(x, w, b), want)


@pytest.mark.parametrize("case", [CASES_2D[0], CASES_2D[1], CASES_2D[3],
                                  (2, 6, 1, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1))],
                         ids=["s1", "s2", "s3", "batch"])
def test_planned_depthwise_reads_the_shuffle_in_place(case, c_kernels):
    """ShuffleNet's channel shuffle composite on a depthwise conv: the C kernel reads each group's shuffled
    channel where it is (no shuffled copy), as onnx.reference's conv of the shuffled input."""
    x, w, b, attrs = _case(case, True, 9)
    n, c = x.shape[:2]
    if w.shape[0] != c or c % 2:
        pytest.skip("a channel multiplier or an odd channel count: no shuffle of this kind in the models")
    for groups in (2, c // 2) if c > 2 else (2,):
        shuffled = x.reshape(n, groups, c // groups, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)
        fn = _plan(x, w, b, input_shuffle=groups, **attrs)
        assert fn.__name__ == "rows"
        _close(fn(x, w, b), onnx_conv(shuffled, w, b, **attrs))


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a[0] != "sigmoid"] + [(None, None)],
                         ids=lambda a: f"{a[0]}{len(a[1] or ())}")
@pytest.mark.parametrize("kind", ["depthwise", "pointwise"])
def test_planned_fused_activations(kind, activation, c_kernels):
    """relu, clip (ReLU6 and one-sided), hard_swish, swish and none, as the compiled code applies them."""
    if kind == "depthwise":
        x, w, b, attrs = _case(CASES_2D[-1], True, 5)
    else:
        rng = np.random.default_rng(5)
        n, c, m, hw = POINTWISE[0]
        x = rng.standard_normal((n, c) + hw).astype(np.float32)
        w, b = rng.standard_normal((m, c, 1, 1)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
        attrs = {}
    w, b = w * 3, b * 3  # values on both sides of clip's and hard_swish's bounds
    name, extra = activation
    want = onnx_conv(x, w, b, **attrs)
    want = ACTIVATIONS[activation](want) if name else want
    attrs = dict(attrs, **({"activation": name} if name else {}),
                 **({"activation_attrs": dict(extra)} if extra else {}))
    fn = _plan(x, w, b, **attrs)
    assert fn.__name__ == {"depthwise": "rows"}.get(kind, kind)
    _close(fn(x, w, b), want)


@pytest.mark.parametrize("case", POINTWISE, ids=lambda c: "x".join(map(str, c[3])) + f"_{c[1]}to{c[2]}")
@pytest.mark.parametrize("bias", [False, True])
def test_planned_pointwise_matches_onnx_reference(case, bias, c_kernels):
    n, c, m, hw = case
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, c) + hw).astype(np.float32)
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    fn = _plan(x, w, b)
    assert fn.__name__ == "pointwise"
    _close(fn(x, w, b) if b is not None else fn(x, w), onnx_conv(x, w, b))


def test_unplanned_layers(c_kernels):
    """Strided or padded 1x1s, grouped convs, batches of 1x1s, large weights and other dtypes get no plan (a
    shuffle on a conv that is not depthwise: the plain conv's plan after the shuffled copy, test_shuffle_fold)."""
    x = np.zeros((1, 8, 6, 6), np.float32)
    w1, w3 = np.ones((4, 8, 1, 1), np.float32), np.ones((4, 8, 3, 3), np.float32)
    assert plans.plan("conv", conv, {"strides": [2, 2]}, [(x.shape, x.dtype), w1], (1, 4, 3, 3),
                      np.float32).__name__ == "im2col_chunks"  # a strided 1x1 (test_plans_im2col.py)
    for w, attrs in ((w1, {"pads": [1, 1, 1, 1]}),
                     (np.ones((4, 4, 3, 3), np.float32), {"group": 2})):
        assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w], conv(x, w, **attrs).shape,
                          np.float32) is None, attrs
    x2 = np.zeros((2, 8, 6, 6), np.float32)
    assert plans.plan("conv", conv, {}, [(x2.shape, x2.dtype), w1], (2, 4, 6, 6), np.float32) is None
    assert plans.plan("conv", conv, {}, [(x2.shape, x2.dtype), w3], (2, 4, 4, 4), np.float32) is None
    big = np.ones((1024, 8, 3, 3), np.float32)  # weights past CHUNK_MAX_WEIGHTS: one band (test_plans_im2col.py)
    assert plans.plan("conv", conv, {}, [(x.shape, x.dtype), big], (1, 1024, 4, 4), np.float32).__name__ \
        == "im2col_chunks"
    assert plans.plan("conv", conv, {}, [(x.shape, np.float64), w1.astype(np.float64)], (1, 4, 6, 6),
                      np.float64) is None
    assert plans.plan("relu", conv, {}, [(x.shape, x.dtype)], x.shape, np.float32) is None
    # an activation the C code does not apply (sigmoid) stays the general kernel's
    assert plans.plan("conv", conv, {"activation": "sigmoid"}, [(x.shape, x.dtype), w1], (1, 4, 6, 6),
                      np.float32) is None


def test_inputs_the_plan_was_not_made_for_run_the_general_kernel(c_kernels, monkeypatch):
    x, w, b, attrs = _case(CASES_2D[1], True, 11)
    fn = _plan(x, w, b, **attrs)
    calls = []
    real = compiled.library()

    def counting(*args, **kwargs):
        calls.append(1)
        return conv(*args, **kwargs)

    fn = plans.plan("conv", counting, attrs, [(x.shape, x.dtype), w, b], onnx_conv(x, w, b, **attrs).shape,
                    np.float32)
    _close(fn(x, w, b), onnx_conv(x, w, b, **attrs))
    assert calls == []  # planned
    view = np.ascontiguousarray(x[..., ::-1])[..., ::-1]  # not C-contiguous
    _close(fn(view, w, b), onnx_conv(x, w, b, **attrs))
    w2 = w * 2  # other weights
    _close(fn(x, w2, b), onnx_conv(x, w2, b, **attrs))
    bigger = np.concatenate([x, x], axis=3)  # another shape
    _close(fn(bigger, w, b), onnx_conv(bigger, w, b, **attrs))
    assert len(calls) == 3
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")  # turned off after planning: numpy runs (at once with
    compiled.reset()  # a reset; plans made later see the environment anyway)
    assert compiled.library() is None and real is not None
    _close(fn(x, w, b), onnx_conv(x, w, b, **attrs))
    assert len(calls) == 4
    assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], (1,), np.float32) is None


@pytest.mark.parametrize("case", [(1, 24, 8, (6, 6)), (1, 24, 40, (3, 3))], ids=["scale-weights", "scale-input"])
@pytest.mark.parametrize("activation", [(None, None), ("hard_swish", None), ("swish", None)],
                         ids=lambda a: str(a[0]))
def test_planned_scaled_pointwise(case, activation, c_kernels):
    """scale_fold's conv(x * s, w, b) (squeeze-and-excitation): the scale on the weights when M <= H*W,
    else on the input; another scale shape runs the folded kernel itself."""
    from rpcsrv.executor.examplejson.scale_fold import scaled

    n, c, m, hw = case
    rng = np.random.default_rng(m)
    x = rng.standard_normal((n, c) + hw).astype(np.float32)
    s = rng.uniform(0, 1, (1, c, 1, 1)).astype(np.float32)
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    name, _ = activation
    attrs = {"activation": name} if name else {}
    want = onnx_conv(x * s, w, b)
    want = ACTIVATIONS[activation](want) if name else want
    kernel = scaled(conv)
    fn = plans.plan(kernel.plan_as, kernel, attrs, [(x.shape, x.dtype), (s.shape, s.dtype), w, b], want.shape,
                    np.float32)
    assert fn is not None and fn.__name__ == "scaled_pointwise"
    _close(fn(x, s, w, b), want)
    _close(fn(x, s.reshape(c, 1, 1), w, b), want)  # not the planned shape: the folded kernel


@pytest.mark.parametrize("c,m,h,w,pads", [(64, 64, 14, 14, (1, 1, 1, 1)), (96, 96, 15, 17, (1, 1, 1, 1)),
                                          (64, 80, 16, 13, (2, 0, 1, 1)), (48, 48, 28, 27, (0, 0, 0, 0))])
@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None), ("swish", None)], ids=lambda a: str(a[0]))
def test_planned_winograd(c, m, h, w, pads, activation, c_kernels):
    """3x3 convs that take Winograd: compiled transforms, bias and activation in the output transform
    (odd sizes: cropped tiles; asymmetric pads)."""
    from test_conv_paths import direct_conv

    rng = np.random.default_rng(c + m + h)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (3 * rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    name, extra = activation
    want = direct_conv(xp, wt, b, 1, 0, 1, 1)
    want = ACTIVATIONS[activation](want) if name else want
    attrs = {"pads": list(pads), **({"activation": name} if name else {}),
             **({"activation_attrs": dict(extra)} if extra else {})}
    fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), wt, b], want.shape, np.float32)
    assert fn is not None and fn.__name__ == "winograd_conv"
    got = fn(x, wt, b)
    assert got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())
    wt2 = wt * 2  # other weights: the general kernel
    np.testing.assert_allclose(fn(x, wt2, b), conv(x, wt2, b, **attrs), rtol=1e-5, atol=1e-5)


def test_bad_attributes_leave_the_step_to_the_table_kernel(c_kernels):
    """A plan is an optimisation: attributes it cannot read (the table kernel reports them at the run) give
    no plan, never an error at load."""
    x = np.zeros((1, 4, 6, 6), np.float32)
    w = np.zeros((4, 1, 3, 3), np.float32)
    for attrs in ({"group": 4, "strides": "x"}, {"group": 4, "pads": [1]}, {"group": 4, "dilations": [0, 1]},
                  {"group": "four"}, {"kernel_shape": [5, 5], "group": 4}):
        assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w], (1, 4, 6, 6), np.float32) is None, attrs
    assert plans.plan("max_pool", pool.max_pool, {"kernel_shape": None}, [(x.shape, x.dtype)], x.shape,
                      np.float32) is None
    assert plans.plan("conv", conv, {}, [None], (1,), np.float32) is None


CHUNKED = [  # (c, m, spatial, kernel, strides, dilations, pads): dense convs no fast path takes, small weights
    (3, 16, (40, 38), (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),  # a 7x7 stem, odd sizes
    (3, 8, (47, 47), (11, 11), (4, 4), (1, 1), (0, 0, 0, 0)),  # AlexNet's 11x11 s4
    (6, 8, (17, 15), (3, 3), (2, 1), (2, 1), (0, 1, 2, 0)),  # dilation, a stride on one axis, asymmetric pads
    (16, 12, (14, 14), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # 5x5 stride 1
]


@pytest.mark.parametrize("case", CHUNKED, ids=[str(i) for i in range(len(CHUNKED))])
@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None), ("swish", None)], ids=lambda a: str(a[0]))
@pytest.mark.parametrize("bias", [False, True])
def test_planned_im2col_chunks_match_onnx_reference(case, activation, bias, c_kernels, monkeypatch):
    """im2col a band of output rows at a time: bands of one or a few rows (CHUNK_ELEMENTS made small), or
    the whole output in one."""
    c, m, spatial, kernel, strides, dilations, pads = case
    rng = np.random.default_rng(c * m)
    x = rng.standard_normal((1, c) + spatial).astype(np.float32)
    w = (rng.standard_normal((m, c) + kernel) / np.sqrt(c * kernel[0] * kernel[1])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads))
    name, extra = activation
    want = onnx_conv(x, w, b, **attrs)
    want = ACTIVATIONS[activation](want) if name else want
    attrs.update({"activation": name, "activation_attrs": dict(extra) if extra else None} if name else {})
    for elements in (200, 3000, plans_conv.CHUNK_ELEMENTS):
        monkeypatch.setattr(plans_conv, "CHUNK_ELEMENTS", elements)
        fn = _plan(x, w, b, **attrs)
        assert fn.__name__ == "im2col_chunks"
        _close(fn(x, w, b), want)
        _close(fn(np.asfortranarray(x), w, b), want)  # any layout: the windows are read by strides
    w2 = w * 2  # other weights: the general kernel
    _close(fn(x, w2, b), onnx_conv(x, w2, b, **attrs) if not name else ACTIVATIONS[activation](
        onnx_conv(x, w2, b, **{k: v for k, v in attrs.items() if not k.startswith("activation")})))
