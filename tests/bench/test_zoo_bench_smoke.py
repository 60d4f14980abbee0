"""Bounded smoke runs of issue 16's benchmarks: the zoo table and the concurrency table (no timing asserts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_zoo_bench_smoke():
    import zoo_bench

    rows = zoo_bench.run(["shufflenet"], ["1", "auto"], repeat=1)
    (row,) = rows
    assert "error" not in row, row
    assert set(row["times"]) == {"1", "auto"} and all(t > 0 for pair in row["times"].values() for t in pair)
    assert row["max_rel_err"] < 1e-4
    text = zoo_bench.table(rows, "1")
    assert "| shufflenet |" in text and "geometric mean" in text
    assert zoo_bench.blas_info()["blas_kernel"]


def test_concurrency_bench_smoke(tmp_path):
    import concurrency_bench

    lib, name, x = concurrency_bench.build_library(tmp_path / "shufflenet.so")
    proc, port = concurrency_bench.start_server()
    try:
        row = concurrency_bench.measure(port, lib, name, x, 2, 2.0)
    finally:
        proc.kill()
        proc.wait()
    assert row["K"] == 2 and row["runs_per_s"] > 0 and row["calls"] > 0 and row["p99"] >= row["p50"] > 0
