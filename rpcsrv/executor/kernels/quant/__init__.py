"""The int8 ops: ONNX's integer and quantized linear algebra (MatMulInteger, ConvInteger, QLinearMatMul,
QLinearConv: ``integer.py``) and the contrib ops of onnxruntime's quantizer (``qlinear.py``).

The package holds no names of its own: import the module that defines one.
"""
