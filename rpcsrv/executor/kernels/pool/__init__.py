"""Pools: the table's max, average, global and Lp pool kernels (``pool.py``), their run plans
(``plans_pool.py``) and the rows kernels of ``pools.c`` (the phase-plane pools are ``conv/dwconv.c``'s).

The package holds no names of its own: import the module that defines one.
"""
