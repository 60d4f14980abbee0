"""The op catalogue: one declaration per op of the ExampleJSON language (see ``schema``).

Names are the snake_case of the ONNX op types (``onnx_op_to_kernel``); inputs, attributes and
defaults are ONNX's, with rpcsrv's few additions marked.  Where an opset moved an attribute to an
input, both are declared (the tensor as an input, the attribute by its ONNX name).  An attribute
with ``allowed`` values is one the board implements only in part: any other value is refused when
compiling and when a library is loaded, not when it runs.

The order follows the kernel modules (binary, unary, linalg, conv, pool, norm, reduce, resize,
shape, quant, misc); ``docs/examplejson.md`` ("Op list") lists the same ops by group.
"""

from __future__ import annotations

from .schema import REQUIRED, Attr, OpSpec

OPS: dict[str, OpSpec] = {}


def op(name: str, inputs: str, outputs: str = "y", dtypes: str = "", **attrs: Attr) -> None:
    """Declare op ``name``: ``inputs``/``outputs`` as space-separated names (see ``OpSpec``)."""
    if name in OPS:
        raise ValueError(f"op {name!r} declared twice")
    OPS[name] = OpSpec(name, tuple(inputs.split()), tuple(outputs.split()), attrs, dtypes)


def i(default=None, allowed=None, why=""):
    return Attr("int", default, allowed, why)


def f(default=None):
    return Attr("float", default)


def s(default=None, allowed=None, why=""):
    return Attr("str", default, allowed, why)


INTS, FLOATS, TENSOR, DTYPE = Attr("ints"), Attr("floats"), Attr("tensor"), Attr("dtype")
#: the fused composites' attributes (rpcsrv): a one-input op applied to the result, and its attrs
FUSED = dict(activation=Attr("op"), activation_attrs=Attr("object"))
AUTO_PAD = s("NOTSET", ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"))
WINDOW = dict(auto_pad=AUTO_PAD, dilations=INTS, kernel_shape=INTS, pads=INTS, strides=INTS)
CONV = dict(WINDOW, group=i(1))
REDUCE = dict(axes=INTS, keepdims=i(1), noop_with_empty_axes=i(0))
REDUCTION = s("none", ("none", "add", "mul", "max", "min"))
BLOCK_MODE = s("DCR", ("DCR", "CRD"))
FLOAT8_ONLY = dict(saturate=i(1), round_mode=s("up"))  # float8/float4 options: accepted, no effect

# -- binary.py: elementwise with broadcasting, variadic
op("add", "a b", dtypes="same", **FUSED)  # activation: the Add+Relu composite (ResNet's residual)
for _name in ("sub", "mul", "div"):
    op(_name, "a b", dtypes="same")
op("pow", "x y")
op("mod", "a b", dtypes="same", fmod=i(0))
for _name in ("equal", "less", "greater", "less_or_equal", "greater_or_equal", "and", "or", "xor",
              "bitwise_and", "bitwise_or", "bitwise_xor"):
    op(_name, "a b")
op("bitwise_not", "x")
op("bit_shift", "x y", direction=s(REQUIRED, ("LEFT", "RIGHT")))
for _name in ("max", "min", "mean"):
    op(_name, "xs+", dtypes="same")
op("sum", "xs+", dtypes="same", **FUSED)
op("where", "condition x y", dtypes="same x y")
op("prelu", "x slope")

# -- unary.py: elementwise, activations, casts
for _name in ("exp", "log", "sqrt", "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
              "asinh", "acosh", "atanh", "tanh", "floor", "ceil", "round", "erf", "sigmoid", "softplus",
              "softsign", "mish", "hard_swish"):
    op(_name, "x", dtypes="float")
for _name in ("abs", "neg", "sign", "relu", "identity", "not", "is_nan"):
    op(_name, "x")
op("is_inf", "x", detect_negative=i(1), detect_positive=i(1))
op("leaky_relu", "x", dtypes="float", alpha=f(0.01))
op("elu", "x", dtypes="float", alpha=f(1.0))
op("celu", "x", dtypes="float", alpha=f(1.0))
op("selu", "x", dtypes="float", alpha=f(1.67326319217681884765625), gamma=f(1.05070102214813232421875))
op("thresholded_relu", "x", dtypes="float", alpha=f(1.0))
op("hard_sigmoid", "x", dtypes="float", alpha=f(0.2), beta=f(0.5))
op("shrink", "x", bias=f(0.0), lambd=f(0.5))
op("swish", "x", dtypes="float", alpha=f(1.0))
op("gelu", "x", dtypes="float", approximate=s("none", ("none", "tanh")))
op("clip", "x min? max?", min=f(), max=f())  # bounds as inputs (opset >= 11) or attributes (opset 6)
op("cast", "x", to=Attr("dtype", REQUIRED), **FLOAT8_ONLY)
op("cast_like", "x target_type", **FLOAT8_ONLY)

# -- linalg.py: matrix products (c of matmul: rpcsrv's bias input for the dense+bias composite)
op("matmul", "a b c?", dtypes="same a b", **FUSED)
op("gemm", "a b c?", alpha=f(1.0), beta=f(1.0), transA=i(0), transB=i(0), **FUSED)
op("einsum", "inputs+", equation=s(REQUIRED))

# -- conv.py
# input_shuffle: rpcsrv, the compiler's channel-shuffle composite (X's channels shuffled in that many groups)
op("conv", "x w b?", **CONV, **FUSED, input_shuffle=i(1))
op("conv_transpose", "x w b?", **CONV, output_padding=INTS, output_shape=INTS)

# -- pool.py (return_indices: rpcsrv, set by the compiler when MaxPool's Indices output is used)
op("max_pool", "x", "y indices?", **WINDOW, ceil_mode=i(0), storage_order=i(0), return_indices=i(0))
op("average_pool", "x", **WINDOW, ceil_mode=i(0), count_include_pad=i(0))
op("lp_pool", "x", **WINDOW, ceil_mode=i(0), p=i(2))
op("global_average_pool", "x")
op("global_max_pool", "x")

# -- norm.py: inference-mode normalizations
_INFERENCE = "the board runs inference only, without batch statistics"
op("batch_normalization", "x scale b mean var", epsilon=f(1e-5), momentum=f(0.9),
   training_mode=i(0, (0,), _INFERENCE), spatial=i(1, (1,), "per-activation statistics are not implemented"),
   is_test=i(1, (1,), _INFERENCE), **FUSED)
op("instance_normalization", "x scale b", epsilon=f(1e-5))
op("layer_normalization", "x scale b?", "y mean? inv_std_dev?", axis=i(-1), epsilon=f(1e-5), stash_type=i(1))
op("group_normalization", "x scale b", epsilon=f(1e-5), num_groups=i(REQUIRED), stash_type=i(1))
op("rms_normalization", "x scale", axis=i(-1), epsilon=f(1e-5), stash_type=i(1))
op("lrn", "x", alpha=f(1e-4), beta=f(0.75), bias=f(1.0), size=i(REQUIRED))
op("lp_normalization", "x", axis=i(-1), p=i(2, (1, 2), "only L1 and L2 norms"))
op("mean_variance_normalization", "x", axes=Attr("ints", (0, 2, 3)))

# -- reduce.py: reductions (axes as input from opset 18, ReduceSum 13; as attribute before)
for _name in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1",
              "reduce_l2", "reduce_sum_square", "reduce_log_sum", "reduce_log_sum_exp"):
    op(_name, "data axes?", **REDUCE)
for _name in ("arg_max", "arg_min"):
    op(_name, "data", axis=i(0), keepdims=i(1), select_last_index=i(0))
for _name in ("softmax", "log_softmax", "hardmax"):
    op(_name, "x", axis=i(-1))
for _name in ("cum_sum", "cum_prod"):
    op(_name, "x axis", exclusive=i(0), reverse=i(0))
op("top_k", "x k", "values indices", axis=i(-1), largest=i(1), sorted=i(1))

# -- resize.py: resampling and Pad
op("resize", "x roi? scales? sizes?", antialias=i(0, (0,), "antialiased downsampling is not implemented"),
   axes=INTS, coordinate_transformation_mode=s("half_pixel", (
       "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
       "tf_crop_and_resize")),
   cubic_coeff_a=f(-0.75), exclude_outside=i(0), extrapolation_value=f(0.0),
   keep_aspect_ratio_policy=s("stretch", ("stretch", "not_larger", "not_smaller")),
   mode=s("nearest", ("nearest", "linear", "cubic")),
   nearest_mode=s("round_prefer_floor", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")))
op("upsample", "x scales?", mode=s("nearest", ("nearest", "linear", "cubic")), scales=FLOATS)
op("pad", "data pads? constant_value? axes?", mode=s("constant", ("constant", "reflect", "edge", "wrap")),
   pads=INTS, value=f(0.0))

# -- shape.py: shape and data movement
op("reshape", "data shape", allowzero=i(0))
op("transpose", "data", perm=INTS)
op("concat", "inputs+", axis=i(REQUIRED))
op("split", "data split?", "outputs+", axis=i(0), num_outputs=i(), split=INTS)
op("slice", "data starts? ends? axes? steps?", starts=INTS, ends=INTS, axes=INTS)  # attributes: opset 1
op("gather", "data indices", axis=i(0))
op("gather_elements", "data indices", axis=i(0))
op("gather_nd", "data indices", batch_dims=i(0))
op("scatter_elements", "data indices updates", axis=i(0), reduction=REDUCTION)
op("squeeze", "data axes?", axes=INTS)
op("unsqueeze", "data axes?", axes=INTS)
op("flatten", "data", axis=i(1))
op("expand", "data shape")
op("tile", "data repeats")
op("shape", "data", start=i(0), end=i())
op("size", "data")
# dtype (rpcsrv): the fill's element type, which a JSON number cannot carry
op("constant_of_shape", "shape", value=TENSOR, dtype=DTYPE)
op("range", "start limit delta")
op("depth_to_space", "x", blocksize=i(REQUIRED), mode=BLOCK_MODE)
op("space_to_depth", "x", blocksize=i(REQUIRED), mode=BLOCK_MODE)
op("trilu", "x k?", upper=i(1))

# -- quant: integer and quantized ops (ONNX's, and onnxruntime's com.microsoft contrib ops); the roles of
# their scale and zero-point inputs are opset/quant.py's QUANT_ROLES.  ``activation`` (rpcsrv) on an int8
# op: relu or clip applied to the real-valued result before it is quantized, an exact clamp of the output
# (a folded DQ -> Conv -> Relu -> Q chain).  A zero point that a contrib op may leave out before other inputs
# is required here: a compiler writes the 0 it means
Q_FUSED = dict(activation=Attr("op", None, ("relu", "clip"), "an int8 op clamps its output: relu and clip only"),
               activation_attrs=Attr("object"))
op("matmul_integer", "a b a_zero_point? b_zero_point?")
op("conv_integer", "x w x_zero_point? w_zero_point?", **CONV)
op("q_linear_matmul", "a a_scale a_zero_point b b_scale b_zero_point y_scale y_zero_point", **Q_FUSED)
op("q_linear_conv", "x x_scale x_zero_point w w_scale w_zero_point y_scale y_zero_point b?", **CONV, **Q_FUSED)
op("q_gemm", "a a_scale a_zero_point b b_scale b_zero_point c? y_scale? y_zero_point?", alpha=f(1.0),
   transA=i(0), transB=i(0), **Q_FUSED)  # y_scale absent: the output is float32
for _name in ("q_linear_add", "q_linear_mul"):
    op(_name, "a a_scale a_zero_point b b_scale b_zero_point c_scale c_zero_point?", **Q_FUSED)
op("q_linear_concat", "y_scale y_zero_point inputs+", axis=i(REQUIRED))  # inputs: (x, x_scale, x_zero_point)...
op("q_linear_global_average_pool", "x x_scale x_zero_point y_scale y_zero_point", channels_last=i(0, (0,)))
op("q_linear_average_pool", "x x_scale x_zero_point y_scale y_zero_point?", auto_pad=AUTO_PAD,
   kernel_shape=Attr("ints", REQUIRED), pads=INTS, strides=INTS, ceil_mode=i(0), count_include_pad=i(0),
   channels_last=i(0, (0,)))
op("q_linear_sigmoid", "x x_scale x_zero_point y_scale y_zero_point?")
op("q_linear_leaky_relu", "x x_scale x_zero_point y_scale y_zero_point?", alpha=f(0.01))
op("q_linear_softmax", "x x_scale x_zero_point y_scale y_zero_point", axis=i(-1), opset=i(REQUIRED))
op("dynamic_quantize_linear", "x", "y y_scale y_zero_point")
op("dynamic_quantize_matmul", "a b b_scale b_zero_point? bias?",
   activation=Attr("op", None, ("relu",), "a float int8 product fuses relu only"))  # (rpcsrv: a Relu folded in)
op("matmul_integer_to_float", "a b a_scale b_scale a_zero_point? b_zero_point? bias?")

# -- misc.py
op("dropout", "data ratio? training_mode?", "output mask?", seed=i(), ratio=f(), is_test=i(1))
op("one_hot", "indices depth values", axis=i(-1))
op("non_zero", "x")
op("compress", "data condition", axis=i())
op("eye_like", "x", dtype=DTYPE, k=i(0))
op("scatter_nd", "data indices updates", reduction=REDUCTION)
op("reverse_sequence", "x sequence_lens", batch_axis=i(1), time_axis=i(0))
op("constant", "", value=TENSOR, value_float=f(), value_floats=FLOATS, value_int=i(), value_ints=INTS)
op("dequantize_linear", "x x_scale x_zero_point?", axis=i(1), block_size=i(0), output_dtype=Attr("dtype", 0))
op("quantize_linear", "x y_scale y_zero_point?", axis=i(1), block_size=i(0), output_dtype=Attr("dtype", 0),
   precision=i(0), saturate=i(1))
