"""Element-wise ops: binary ops with broadcasting (``binary.py``), unary ops and activations (``unary.py``),
their run plans (``plans_elementwise.py``: Add/Sum, Sigmoid, Gelu, HardSigmoid) and ``sigmoid.c`` (sigmoid,
SiLU, GELU, and the softmax of ``reduce.py``'s plan).

The package holds no names of its own: import the module that defines one.
"""
