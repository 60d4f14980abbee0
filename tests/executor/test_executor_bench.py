"""The executor benchmark runs end to end on small settings and agrees with onnxruntime."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import need_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_executor_bench_rows(capsys):
    need_module("onnxruntime")
    need_module("onnx")
    import executor_bench

    assert executor_bench.main(["--models", "resnet,encoder", "--compiler", "client", "--repeat", "1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["model"], r.get("size")) for r in rows] == [("resnet", "half"), ("encoder", None)]
    for row in rows:
        assert row["max_abs_diff"] <= 1e-3 * max(1.0, row["max_abs_output"])
        assert row["blas_core"] and row["rpcsrv_ms"] > 0
        assert "batch_normalization" not in row["slowest_ops_ms"]  # folded by the compiler


def test_full_size_resnet_is_resnet18():
    need_module("onnx")
    import executor_bench

    model = executor_bench.build_resnet("full")
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 224, 224]
    weights = {t.name: t.dims for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert list(weights[convs[0].input[1]]) == [64, 3, 7, 7]
    assert sorted({weights[n.input[1]][0] for n in convs}) == [64, 128, 256, 512]
    assert len(convs) == 20
