"""A bounded smoke run of the int8 benchmark (``bench/quant_bench.py``: onnxruntime-quantized models against
onnxruntime's int8, one thread each, per CPU placement): small models, two runs (no timing asserts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import need_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_quant_bench_smoke():
    need_module("onnxruntime", "quantizes the models and is the anchor")
    import quant_bench

    cpus = sorted(os.sched_getaffinity(0))[:2]
    rows = quant_bench.run(["resnet18-qoperator", "minilm-dynamic"], repeat=2, cpus=cpus, small=True)
    assert [r["model"] for r in rows] == ["resnet18-qoperator", "minilm-dynamic"]
    for r in rows:
        assert r["within"] >= 0.99 and r["classes"] == 1.0 and 0 < r["ort_floor"] <= 1, r
        assert 0 < r["within_unopt"] <= 1, r
        assert set(r["times"]) == set(cpus) and all(t > 0 for pair in r["times"].values() for t in pair)
    text = quant_bench.table(rows, cpus)
    assert "| resnet18-qoperator |" in text and "geometric mean" in text
    assert quant_bench.isa()
