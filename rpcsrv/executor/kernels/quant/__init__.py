"""Integer and quantized linear algebra: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv
(``quant.py``).

The package holds no names of its own: import the module that defines one.
"""
