"""Squeeze-and-excitation's Mul folded into the 1x1 conv after it (rpcsrv.executor.examplejson.scale_fold): the same
values as the unfolded Mul then Conv (numpy, float64), the Mul no longer run, and no fold where the
scaled map has another reader, is an output, is not a per-channel scale, or the conv is not 1x1 group 1."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor import ExampleJSONRuntime

RNG = np.random.default_rng(11)
C, M, HW = 6, 4, 5


def se_tail(scale_shape="1 6 1 1", kernel=1, group=1, extra_reader=False, mul_is_output=False,
            swap=False) -> str:
    """input 0 x (1, C, HW, HW), input 1 the gate s; mul 4 = x * s; conv 5 = conv(mul, w, b)."""
    pad = kernel // 2
    lines = ["se", f"  input 0 1 {C} {HW} {HW}", f"  input 1 {scale_shape}",
             f"  const 2 {M} {C // group} {kernel} {kernel} name: w", f"  const 3 {M} name: b",
             f"  mul 4 inputs: {'1 0' if swap else '0 1'} shape: 1 {C} {HW} {HW}",
             f"  conv 5 inputs: 4 2 3 shape: 1 {M} {HW} {HW} attrs: "
             f'{{"group": {group}, "kernel_shape": [{kernel}, {kernel}], "pads": [{pad}, {pad}, {pad}, {pad}]}}']
    outs = ["5"]
    if extra_reader:
        lines.append(f"  relu 6 inputs: 4 shape: 1 {C} {HW} {HW}")
        outs.append("6")
    if mul_is_output:
        outs.append("4")
    lines.append("  output " + " ".join(outs))
    return "\n".join(lines) + "\n"


def run(text: str, scale_shape, kernel=1, group=1):
    mod = ExampleJSONRuntime(text)
    w = RNG.standard_normal((M, C // group, kernel, kernel)).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32)
    mod.bind("se", {"w": w, "b": b}, "test")
    fn = mod.get_function("se")
    x = RNG.standard_normal((1, C, HW, HW)).astype(np.float32)
    s = RNG.random(scale_shape).astype(np.float32)
    outs = [np.empty((1, M, HW, HW), np.float32)] + [np.empty((1, C, HW, HW), np.float32)
                                                     for _ in fn.outputs[1:]]
    fn(x, s, *outs)
    scaled = x.astype(np.float64) * s
    if kernel == 1 and group == 1:
        want = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), scaled) + b.reshape(1, M, 1, 1)
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
    return fn, outs, scaled


@pytest.mark.parametrize("swap", [False, True], ids=["x*s", "s*x"])
@pytest.mark.parametrize("scale_shape", [(1, C, 1, 1), (C, 1, 1)])
def test_fold_matches_mul_then_conv(scale_shape, swap):
    text = se_tail(" ".join(map(str, scale_shape)), swap=swap)
    fn, _, _ = run(text, scale_shape)
    assert [step[0].op for step in fn.steps] == ["conv"]  # the Mul went into the conv's weights


@pytest.mark.parametrize("case", ["extra_reader", "mul_is_output", "spatial_scale", "3x3", "grouped"])
def test_no_fold_where_it_would_be_wrong(case):
    kwargs, scale_shape, kernel, group = {}, (1, C, 1, 1), 1, 1
    if case in ("extra_reader", "mul_is_output"):
        kwargs[case] = True
    elif case == "spatial_scale":
        scale_shape = (1, C, HW, HW)
    elif case == "3x3":
        kernel = 3
    else:
        group = 2
    text = se_tail(" ".join(map(str, scale_shape)), kernel=kernel, group=group, **kwargs)
    fn, outs, scaled = run(text, scale_shape, kernel, group)
    assert "mul" in [step[0].op for step in fn.steps]
    if case == "extra_reader":
        np.testing.assert_allclose(outs[1], np.maximum(scaled, 0), rtol=1e-6)
    if case == "mul_is_output":
        np.testing.assert_allclose(outs[1], scaled, rtol=1e-6)
