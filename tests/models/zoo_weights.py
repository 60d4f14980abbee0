"""The light zoo models with varied weights (``varied``), for the zoo test and ``bench/zoo_bench.py``.

The light models fill every weight with one value (``ConstantOfShape`` 0.02), which makes many mistakes
invisible (a uniform softmax looks right whatever the axis) and every class score equal.  ``varied``
replaces each fill by varied values (0.5x-1.5x the fill, a golden-ratio sequence) as an initializer,
except the few huge dense layers (they would make 500 MB libraries): the same architecture and opset,
with numbers that tell wrong arithmetic apart.  No pytest here: the benchmark imports it too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

MAX_VARIED = 1 << 21  # elements; bigger fills (VGG's 100M-weight dense layers) stay uniform


def varied(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with each constant fill (ConstantOfShape of an initializer shape) made an initializer
    of varied positive values around the fill (positive keeps BatchNormalization's variance valid)."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    keep = []
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits \
                and np.prod(inits[node.input[0]], dtype=np.int64) <= MAX_VARIED:
            fill = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0]
            shape = tuple(int(d) for d in inits[node.input[0]])
            n = int(np.prod(shape, dtype=np.int64))
            steps = (np.arange(n, dtype=np.float32) * np.float32(0.6180339) + np.float32(rng.random())) % 1
            value = (fill * (steps + np.float32(0.5))).reshape(shape)
            out.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.ir_version = max(out.ir_version, 4)  # initializers that are not graph inputs need IR 4
    return out
