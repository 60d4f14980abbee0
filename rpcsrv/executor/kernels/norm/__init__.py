"""Normalizations: the table's batch, instance, layer, group, RMS, LRN, Lp and mean-variance kernels
(``norm.py``), LayerNormalization's run plan (``plans_norm.py``) and its C kernel (``norm.c``).

The package holds no names of its own: import the module that defines one.
"""
