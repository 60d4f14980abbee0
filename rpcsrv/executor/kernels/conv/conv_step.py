"""The conv step a run plan may take, read once by ``plans_conv.read_step``: the table kernel, the checked
geometry, the bound weights and bias, the fused activation, the compiled library (what every conv plan reads)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np


class ConvStep(NamedTuple):
    """A conv step some plan may take, read once (``plans_conv.read_step``)."""

    kernel: Callable[..., Any]  # the table kernel, and its attributes
    attrs: dict
    general: Callable[..., Any]  # the table kernel on the step's (x, w, b, *rest): inputs a plan was not made for
    xshape: tuple  # the computed input's declared shape, and the node's own
    shape: tuple
    sshape: Optional[tuple]  # the scale's shape (``scaled``), else None
    w: np.ndarray  # the constant weights and bias the plan binds
    b: Optional[np.ndarray]
    bias: Optional[np.ndarray]  # b as (M,), C-contiguous, and its address
    bptr: Optional[int]
    group: int
    shuffle: int  # ``input_shuffle``: 1, or the groups of the shuffle a depthwise kernel reads in place
    strides: tuple  # the checked geometry (``conv.attrs_geometry``)
    dilations: tuple
    begin: tuple
    end: tuple
    out: tuple
    act: int  # the fused activation's code and bounds for the C kernels (``compiled._activation``)
    lo: float
    hi: float
    lib: Any  # the compiled library the plan was made with
