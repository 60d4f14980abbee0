"""Element-wise ops: binary ops with broadcasting (``binary.py``), unary ops and activations (``unary.py``),
their run plans (``plans_elementwise.py``: Add/Sum, Sigmoid, Gelu, HardSigmoid, Softmax) and ``sigmoid.c``
(sigmoid, SiLU, GELU, softmax).

The package holds no names of its own: import the module that defines one.
"""
