"""The op table of JSON-runtime graphs: kernel name -> factory, as data.

``OPS`` holds relay's op names (what ``JSONSerializer`` writes for a plain call, and what ACL's and
CLML's serializers write for their composites, with a bias input and an ``activation_type``).  A relay op
that is one op of the op language (``rpcsrv.loader.opset``, the board's declaration of its kernels) is a
``Direct`` row naming that op and how relay names its attributes; its inputs, attribute kinds, defaults,
allowed values and dtype rule are the schema's, declared once there.  The other factories translate
what relay says differently (layouts, padding forms, relay's own defaults).
``COMPOSITES`` holds the backends' composite names: DNNL's ``dnnl.<op>[_bias][_sum][_<act>]``, BNNS's
``bnns.<op>_bias_relu`` family, ACL's ``arm_compute_lib.*`` pattern names.  TensorRT prefixes every
op with ``tensorrt.`` (its runtime registers ``"tensorrt." + op``); :func:`lookup` strips it.

A name missing from both is an op this board lacks: the runtime refuses the module at ``load_module``
naming the node, its name and the op.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

from . import nn, tensor_ops as t
from .nn import checked
from .qnn import QNN_COMPOSITES, QNN_OPS
from .tensor_ops import Direct

Factory = Callable  # factory(node, attrs, input_shapes) -> Prepared

_UNARY = {"nn.relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
          "abs": "abs", "negative": "neg", "sin": "sin", "cos": "cos", "atan": "atan",
          "ceil": "ceil", "floor": "floor", "erf": "erf", "copy": "identity", "nn.gelu": "gelu"}
_BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max",
           "minimum": "min", "power": "pow"}
_REDUCE = {"sum": "reduce_sum", "mean": "reduce_mean", "max": "reduce_max", "min": "reduce_min",
           "prod": "reduce_prod"}

OPS: dict[str, Factory] = {
    **{name: Direct(kernel) for name, kernel in {**_UNARY, **_BINARY}.items()},
    **{name: t.reduce(kernel) for name, kernel in _REDUCE.items()},
    "rsqrt": lambda node, a, shapes: nn.Prepared(lambda x: 1 / t.KERNELS["sqrt"](x)),
    "nn.relu6": Direct("clip", fixed={"min": 0.0, "max": 6.0}),  # CLML's name for clip(0, 6)
    "nn.leaky_relu": Direct("leaky_relu", {"alpha": "alpha"}),
    "clip": Direct("clip", {"a_min": "min", "a_max": "max"}),
    "nn.softmax": Direct("softmax", {"axis": "axis"}),
    "nn.log_softmax": Direct("log_softmax", {"axis": "axis"}),
    **{f"nn.conv{k}d": nn.conv for k in (1, 2, 3)},
    "nn.depthwise_conv2d": nn.conv,  # ACL (kernel layout IHWO) and CLML (IOHW)
    **{f"nn.conv{k}d_transpose": partial(nn.conv, transpose=True) for k in (1, 2, 3)},
    "nn.dense": nn.dense,
    "nn.batch_matmul": checked(nn.matmul, batch=True),
    "nn.matmul": checked(nn.matmul, batch=False),
    "nn.bias_add": checked(nn.bias_add),
    "nn.batch_norm": checked(nn.batch_norm),
    "nn.layer_norm": checked(nn.layer_norm),
    "nn.instance_norm": checked(nn.instance_norm),
    **{f"nn.max_pool{k}d": checked(nn.pool, kind="max") for k in (1, 2, 3)},
    **{f"nn.avg_pool{k}d": checked(nn.pool, kind="avg") for k in (1, 2, 3)},
    "nn.l2_pool2d": checked(nn.pool, kind="l2"),
    "nn.global_max_pool2d": checked(nn.global_pool, kind="max"),
    "nn.global_avg_pool2d": checked(nn.global_pool, kind="avg"),
    "nn.adaptive_max_pool2d": checked(nn.adaptive_pool, kind="max"),
    "nn.adaptive_avg_pool2d": checked(nn.adaptive_pool, kind="avg"),
    "reshape": t.to_declared_shape,
    "nn.batch_flatten": t.to_declared_shape,
    "squeeze": t.to_declared_shape,
    "expand_dims": t.to_declared_shape,
    "transpose": t.transpose,
    "layout_transform": t.layout_transform,
    "concatenate": t.concatenate,
    "nn.pad": t.pad,
    "strided_slice": t.strided_slice,
    "split": t.split,
    "nn.depth_to_space": t.depth_to_space,
    "nn.upsampling": t.upsampling,
    **QNN_OPS,
}

_ACTS = ("relu", "tanh", "sigmoid", "clip", "gelu", "swish", "mish")
_DNNL_IGNORED = {"gelu": 3, "mish": 1}


def _dnnl_composites() -> dict[str, Factory]:
    """DNNL's pattern names (python/tvm/relay/op/contrib/dnnl.py): conv/deconv/dense, with or without
    ``_bias``, with or without a post-op, plus the ``_sum`` residual forms."""
    table: dict[str, Factory] = {}
    bases = {**{f"conv{k}d": nn.conv for k in (1, 2, 3)},
             **{f"deconv{k}d": partial(nn.conv, transpose=True) for k in (2, 3)},
             "dense": nn.dense}
    for base, factory in bases.items():
        for bias in (True, False):
            for act in (*_ACTS, None):
                if bias or act:
                    name = f"dnnl.{base}{'_bias' if bias else ''}{'_' + act if act else ''}"
                    # the gelu and mish patterns' constants are composite arguments DNNL does not read
                    table[name] = partial(factory, bias=bias, act=act, ignore=_DNNL_IGNORED.get(act, 0))
    table["dnnl.conv2d_bias_sum"] = partial(nn.conv, bias=True, sum_input=True)
    table["dnnl.conv2d_bias_sum_relu"] = partial(nn.conv, bias=True, sum_input=True, act="relu")
    table["dnnl.dense_bias_sum"] = partial(nn.dense, bias=True, sum_input=True)
    return table


COMPOSITES: dict[str, Factory] = {
    **_dnnl_composites(),
    "bnns.conv2d_relu": partial(nn.conv, bias=False, act="relu"),
    "bnns.conv2d_bias_relu": partial(nn.conv, bias=True, act="relu"),
    "bnns.conv2d_sigmoid": partial(nn.conv, bias=False, act="sigmoid"),
    "bnns.conv2d_bias_sigmoid": partial(nn.conv, bias=True, act="sigmoid"),
    "bnns.conv2d_bias": partial(nn.conv, bias=True),
    "bnns.dense_bias": partial(nn.dense, bias=True),
    "bnns.dense_bias_gelu": partial(nn.dense, bias=True, act="gelu_tanh"),
    # ACL's pattern names, as the plain JSON serializer would keep them (ACL's own writes nn.*)
    "arm_compute_lib.conv2d": nn.conv,
    "arm_compute_lib.dense": nn.dense,
    "arm_compute_lib.avg_pool2d": checked(nn.pool, kind="avg"),
    "arm_compute_lib.l2_pool2d": checked(nn.pool, kind="l2"),
    "arm_compute_lib.concatenate": t.concatenate,
    **QNN_COMPOSITES,
}

#: prefixes a backend puts before relay's op names
PREFIXES = ("tensorrt.",)


def lookup(name: str) -> Optional[Factory]:
    """The factory for kernel name ``name``, or None when the board lacks it."""
    factory = OPS.get(name) or COMPOSITES.get(name)
    if factory is None:
        for prefix in PREFIXES:
            if name.startswith(prefix):
                return OPS.get(name[len(prefix):])
    return factory


def supported_names() -> list[str]:
    """Every kernel name the board runs (without the ``tensorrt.`` spellings)."""
    return sorted(OPS) + sorted(COMPOSITES)
