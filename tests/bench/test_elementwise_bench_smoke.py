"""Bounded smoke run of bench/elementwise_bench.py on DenseNet-121: the three variants agree and the report
names the fused kernels (no timing asserts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_elementwise_bench_smoke(tmp_path):
    import elementwise_bench

    row = elementwise_bench.measure("densenet121", 1, tmp_path)
    assert row["max_rel_diff"] < 1e-4
    assert set(row["ms"]) == {"folded", "no concat chains", "unfolded"} and all(b > 0 for b, _ in row["ms"].values())
    # DenseNet's pre-activation BN+Relu became add+relu, its Unsqueeze/Mul/Add are gone
    assert "add+relu" in row["per_op_ms"] and "unsqueeze" not in row["per_op_ms"] and "mul" not in row["per_op_ms"]
    assert "folded" in elementwise_bench.report(row)
