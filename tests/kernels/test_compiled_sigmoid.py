"""The compiled sigmoid and SiLU (``kernels/elementwise/sigmoid.c``, through the ``sigmoid`` and ``swish`` kernels)
against float64 numpy, on and off: every float32 magnitude up to the saturation points, the
non-finite values, odd lengths (the vector loop's scalar tail) and non-contiguous inputs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import need_program

from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.registry import KERNELS


@pytest.fixture(params=["compiled", "numpy"])
def kernels(request, monkeypatch):
    if request.param == "compiled":
        need_program("cc", "the compiled kernels are built with the board's C compiler")
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
        assert compiled.status()["in_use"], compiled.status()
    else:
        monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    return request.param


def _want(x, swish):
    x64 = x.astype(np.float64)
    s = 1 / (1 + np.exp(-x64))
    return x64 * s if swish else s


@pytest.mark.parametrize("op", ["sigmoid", "swish"])
@pytest.mark.parametrize("n", [1, 7, 8, 33, 100003])
def test_values(op, n, kernels):
    x = np.linspace(-90, 90, n, dtype=np.float32) if n > 1 else np.array([0.3], np.float32)
    x = np.random.default_rng(n).permutation(x)
    got = KERNELS[op](x)
    want = _want(x, op == "swish")
    assert got.dtype == np.float32 and got.shape == x.shape
    # relative 1e-6, absolute 1e-35 where the result nears float32's smallest normal (x < -80)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-35)


@pytest.mark.filterwarnings("ignore:invalid value")  # swish(-inf) = -inf * 0: NaN, as in ONNX
def test_non_finite_and_views(kernels):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.8, -88.8, 1e30, -1e30], np.float32)
    got = KERNELS["sigmoid"](x)
    assert np.isnan(got[0]) and got[1] == 1 and got[3] == 0.5 and got[5] == 1 and got[7] == 1
    assert 0 <= got[2] < 1e-38 and 0 <= got[6] < 1e-38 and 0 <= got[8] < 1e-38
    sw = KERNELS["swish"](x)
    assert np.isnan(sw[0]) and sw[1] == np.inf and sw[5] == np.float32(88.8) and sw[7] == np.float32(1e30)
    grid = np.random.default_rng(1).standard_normal((6, 9, 11)).astype(np.float32)
    view = grid.transpose(2, 0, 1)[:, ::2]
    np.testing.assert_allclose(KERNELS["sigmoid"](view), _want(view, False), rtol=1e-6)


def test_other_dtypes_take_numpy():
    x = np.linspace(-5, 5, 11)
    assert compiled.sigmoid(x) is None  # float64: numpy's path
    np.testing.assert_allclose(KERNELS["sigmoid"](x), _want(x, False), rtol=1e-12)
