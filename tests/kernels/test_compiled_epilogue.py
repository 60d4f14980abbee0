"""The compiled GEMM-conv epilogue (``epilogue.c``, ``compiled.bias_activation``): bias and fused activation
in one pass over a 1x1, 3x3, strided (stem), flat-columns and grouped conv's product, against
``onnx.reference``, with the compiled kernels in use and turned off (numpy's epilogue); and that the C
epilogue really ran, or really did not."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.conv.conv import conv
from conftest import need_program
from test_compiled_depthwise import ACTIVATIONS
from test_depthwise_conv import onnx_conv

CASES = [  # (c, m, spatial, kernel, strides, pads, group)
    (16, 24, (12, 12), (1, 1), (1, 1), (0, 0, 0, 0), 1),  # 1x1 (the input is the column matrix)
    (3, 8, (17, 16), (3, 3), (2, 2), (1, 1, 1, 1), 1),  # stem: 3 channels, stride 2 (ones row when no act)
    (8, 6, (10, 11), (3, 3), (1, 1), (1, 0, 2, 1), 1),  # flat columns (computed-and-cropped positions)
    (8, 12, (9, 9), (1, 1), (1, 1), (0, 0, 0, 0), 4),  # grouped 1x1
]


@pytest.fixture(params=["compiled", "numpy"])
def epilogue(request, monkeypatch):
    """The C epilogue in use (and counted), or the compiled kernels turned off (numpy's epilogue)."""
    calls = []
    if request.param == "compiled":
        need_program("cc", "the compiled epilogue is built with the board's C compiler")
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
        assert compiled.status()["in_use"], compiled.status()
        real = compiled.bias_activation
        monkeypatch.setattr(compiled, "bias_activation", lambda *a, **k: calls.append(a) or real(*a, **k))
    else:
        monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
        monkeypatch.setattr(compiled, "bias_activation", lambda *a, **k: pytest.fail("C epilogue while off"))
    return request.param, calls


@pytest.mark.parametrize("activation", [(None, None)] + list(ACTIVATIONS), ids=lambda a: f"{a[0]}{len(a[1] or ())}")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", CASES, ids=["1x1", "stem", "flat", "grouped"])
def test_epilogue_matches_onnx_reference(case, bias, activation, epilogue):
    c, m, spatial, kernel, strides, pads, group = case
    rng = np.random.default_rng(len(spatial) + c + m)
    x = rng.standard_normal((1, c) + spatial).astype(np.float32)
    w = (rng.standard_normal((m, c // group) + kernel) * 3).astype(np.float32)  # both sides of the bounds
    b = (rng.standard_normal(m) * 3).astype(np.float32) if bias else None
    attrs = dict(group=group, strides=list(strides), pads=list(pads))
    y = onnx_conv(x, w, b, **attrs)
    name, extra = activation
    want = y if name is None else ACTIVATIONS[activation](y)
    got = conv(x, w, b, activation=name, activation_attrs=dict(extra) if extra else None, **attrs)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    arm, calls = epilogue
    if arm == "compiled":  # C unless nothing is left to do or numpy applies it after (sigmoid)
        # copied columns with C*K < Q: without an activation the bias rides in the GEMM as a ones row
        ones = kernel != (1, 1) and group == 1 and c * np.prod(kernel) < np.prod(want.shape[2:])
        assert bool(calls) == (name != "sigmoid" and (name is not None or (bias and not ones)))


def test_epilogue_refuses_what_it_cannot_do():
    """Other dtypes, non-contiguous results and unknown activations are left to numpy (False)."""
    y = np.ones((4, 6), np.float64)
    assert not compiled.bias_activation(y, None, "relu")
    y32 = np.ones((4, 12), np.float32)[:, ::2]
    assert not compiled.bias_activation(y32, None, "relu")
    assert not compiled.bias_activation(np.ones((4, 6), np.float32), None, "sigmoid")
    assert not compiled.bias_activation(np.ones((4, 6), np.float32), np.ones(5, np.float32), None)
