"""Convolutions: the table's conv kernel and its paths, their run plans and their C kernels.

* ``conv.py``: the ``conv`` kernel (geometry, fast paths, im2col + GEMM, the numpy epilogue);
* its paths: ``depthwise.py`` (and the C ``dwconv.c``: rows kernel, stem convs, pools on phase planes;
  ``dwchan.c``: channels side by side), ``taps.py``, ``winograd.py`` (``winograd.c``, ``winograd4.c``),
  ``im2col.py`` (``im2col.c``), ``gemm.py`` (``gemm.c``: 1x1 convs and MatMuls by constant weights);
* ``epilogue.c``: a GEMM conv's bias and activation in one pass (and the one-pass Add, row means and
  affine clip that the other families' plans call);
* ``plans_conv.py``: the conv run plans (``plans.py`` dispatches to them).

The package holds no names of its own: import the module that defines one.
"""
