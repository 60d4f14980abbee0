"""Run plans: a step's work bound once per graph node, for the layers mobile networks are made of.

A kernel of the table is a general function: each call checks and resolves its attributes, picks a path
(fast paths, im2col, depthwise, compiled or numpy), converts and reshapes its operands, and only then
computes.  That is 15-20 us of numpy and ctypes calls per conv measured alone, and much more inside a
model run: right after a large conv has streamed megabytes through the caches, numpy's and the
interpreter's own code and data are cold, and a small numpy call costs several times its warm price
(a Flatten's ``np.prod`` of a shape tuple: 7 us alone, 35-45 us in MobileNetV2).  MobileNetV2 runs 52
convs, MobileNetV3 62, so this fixed cost was a tenth of their run.

So the ExampleJSON runtime asks :func:`plan` once per step, when the subgraph's constants are bound,
for a function of the step's inputs with everything that depends only on the node's declared shapes,
attributes and constant weights worked out: the path, the reshaped weights, the compiled kernel's
arguments.  A planned call checks that its inputs are what the plan was made for (the declared shape and
dtype, C-contiguous, the very constant arrays it bound, the compiled library still in use) and else
runs the general kernel, so a plan changes no result and never refuses a call the kernel would take.

Planned (float32, 2-D, compiled kernels in use, the activation one the C code applies):

* depthwise convs (``compiled.depthwise_conv2d``'s C kernel, called with its arguments ready; ShuffleNet's
  channel shuffle composite read in place, no shuffled copy; any other conv reading one: the shuffled copy,
  then its own plan, ``plans_conv.shuffled_conv_plan``), and dense convs with few taps per output (stems: 3
  channels, 3x3) by the same rows kernel (``plans_conv.ROWS_MAX_TAPS``);
* 1x1 stride-1 unpadded convs of one image: the weights as an (M, C) matrix times the input read in place
  as (C, H*W) (grouped: one batched product per group), then the compiled epilogue (bias and activation in
  one pass); or, on the shapes ``gemm.takes`` (group 1), ``gemm.c``: the weights packed once, the bias,
  residual and activation applied in its register tiles (``gemm.py``);
* the same convs with a squeeze-and-excitation scale folded in (``scale_fold``, planned as
  ``scaled_conv``): the scale multiplies the weights or the input, whichever has fewer values;
* either with the residual Add after it folded in (``residual_fold``, planned as ``residual_conv`` or
  ``scaled_residual_conv``): the residual, the bias and the activation in the one epilogue pass;
* 3x3 convs that take Winograd (``conv.fast_path``): the compiled transforms (``winograd.c``; F(4x4, 3x3)'s
  ``winograd4.c`` on larger maps), the bias and the activation in the output transform;
* other dense convs of one image (7x7 stems, AlexNet's 11x11, stride-2 3x3s and 1x1s, 3x3s on 7x7 maps,
  5x5s: those no fast path takes): the compiled im2col (``im2col.c``) and the GEMM, a band of output rows
  at a time for small weights, then the compiled epilogue; or, with one BLAS thread, ``gemm.c`` (the
  weights packed once, the bias and activation in its tiles, the columns packed straight from the input);
* Add/Sum of a 4-D tensor and a per-channel constant (a batch norm's shift) or a residual tensor, and the
  fused activation if any: one pass (``epilogue.c``);
* GlobalAveragePool of 4-D float32 tensors and ReduceMean over trailing axes (row means in one pass,
  ``epilogue.c``), Sigmoid, Gelu (erf form), HardSigmoid, Softmax along the last axis (``sigmoid.c``: each
  row while in cache);
* Flatten, and Reshape to a constant shape: a view of the declared shape; a classifier's Gemm (one row);
  MatMul by constant 2-D weights (the bias and activation in one pass after the GEMM);
* 2-D float32 MaxPools (no indices output) and AveragePools: by rows (``pools.c``: separable, KH + KW
  operations per output) or on phase planes (``dwconv.c``: padding -inf or 0), as measured per shape;
* LayerNormalization over the last axis (one C pass per row, ``norm.c``).

Every other step, or any step on a board without the compiled kernels, runs its table kernel as before.
Plans marked ``fn.into`` (pointwise, Winograd, rows, im2col, pools) take ``out=``, a C-contiguous array of the node's
shape to write into and return (``concat_fold``: a slice of a Concat's buffer); their fallbacks ignore it.

Where the planners are: beside the table kernels they stand in for, a family's in its folder
(``conv/plans_conv.py``, ``pool/plans_pool.py``, ``norm/plans_norm.py``, ``elementwise/plans_elementwise.py``),
the other ops' beside their modules (``plans_linalg.py``, ``plans_reduce.py``, ``plans_shape.py``); each module's
``PLANNERS`` names its ops, and this module only dispatches.  What they share is ``plan_support.py``.

Failures: a planner returns None, or raises ``plan_support.NotPlannable``, for a step it does not take (attribute
values the table kernel reports at the run are read inside ``plan_support.attribute_values``).  Anything else it
raises is a bug in the plan: the board survives it (the step runs its table kernel, the result is the same, only
slower), and says so once per op and error type, on the ``rpcsrv.executor.kernels.plans`` logger at ERROR; the
test suite fails every test in which such a record appears (tests/conftest.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from . import plans_linalg, plans_reduce, plans_shape
from .conv import plans_conv
from .elementwise import plans_elementwise
from .norm import plans_norm
from .plan_support import NotPlannable
from .pool import plans_pool
from .quant import plans_qops, plans_quant

Planner = Callable[..., Optional[Callable[..., Any]]]
#: op -> planner(kernel, attrs, inputs, shape, dtype) -> planned function or None
PLANNERS: dict[str, Planner] = {**plans_conv.PLANNERS, **plans_elementwise.PLANNERS, **plans_pool.PLANNERS,
                                **plans_reduce.PLANNERS, **plans_linalg.PLANNERS, **plans_shape.PLANNERS,
                                **plans_norm.PLANNERS, **plans_quant.PLANNERS_GEMM, **plans_qops.PLANNERS_QOPS}


def _max_pool_plan(kernel, attrs, inputs, shape, dtype):
    """MaxPool: of int8 tensors (``quant/plans_qops.py``) or of float32 ones (``pool/plans_pool.py``)."""
    if np.dtype(dtype) in (np.dtype(np.uint8), np.dtype(np.int8)):
        return plans_qops.q_maxpool_plan(kernel, attrs, inputs, shape, dtype)
    return plans_pool.PLANNERS["max_pool"](kernel, attrs, inputs, shape, dtype)


PLANNERS["max_pool"] = _max_pool_plan
LOG = logging.getLogger(__name__)
_reported: set[tuple[str, str]] = set()  # (op, error type) said once


def plan(op: str, kernel: Callable[..., Any], attrs: Mapping[str, Any], inputs: Sequence[Any],
         shape: tuple, dtype: np.dtype) -> Optional[Callable[..., Any]]:
    """A planned function of the step's inputs for op ``op`` (``kernel`` and its ``attrs``: the general
    path it falls back on), or None.  ``inputs``: per input, the bound constant array, or a (shape, dtype)
    pair for a computed one, or None for an omitted optional input; ``shape``/``dtype``: the node's own.
    A planner's error other than ``NotPlannable`` is logged (once per op and error type) and gives None."""
    planner = PLANNERS.get(op)
    if planner is None:
        return None
    try:
        return planner(kernel, dict(attrs), list(inputs), tuple(shape), np.dtype(dtype))
    except NotPlannable:
        return None
    except Exception as exc:  # noqa: BLE001 - a bug in a plan: the table kernel computes the same, slower
        key = (op, type(exc).__name__)
        if key not in _reported:
            _reported.add(key)
            LOG.error("the run plan of a %s step failed, the step runs its table kernel (a bug in the plan): "
                      "%s: %s", op, type(exc).__name__, exc, exc_info=True)
        return None
