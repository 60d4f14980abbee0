"""How close a dynamic model's float output is between rpcsrv and onnxruntime (``quant_bench.py``'s dynamic models:
the MiniLM-shaped encoder and, where installed, the real all-MiniLM-L6-v2), with onnxruntime's graph optimizations
off (``ORT_DISABLE_ALL``: the graph as written, which is what rpcsrv computes) and on (its default, the fused
contrib ops), and onnxruntime's two modes against each other.

Per pair: the fraction of the output within one quantization step (8 bits over the output's range,
``quant_models.float_step``), the fraction exactly equal, the largest difference in steps, and the fraction of rows
(tokens) whose argmax agrees.

    python bench/quant_closeness.py [--models minilm-dynamic,all-minilm-dynamic] [--seeds 7,8,9]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_bench  # noqa: E402
import quant_models  # noqa: E402


def outputs(pair: quant_bench.Pair, feeds: dict) -> dict:
    """The first output of rpcsrv, onnxruntime optimized and onnxruntime unoptimized on ``feeds``."""
    import onnxruntime as ort

    for key, value in feeds.items():
        pair.ex.get_function("set_input")(key, value)
    pair.run_ours()
    got = pair.ex.get_function("get_output")(0).copy()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(pair.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return {"rpcsrv": got, "ort": pair.sess.run(None, feeds)[0], "ort-unopt": plain.run(None, feeds)[0]}


def compare(a: np.ndarray, b: np.ndarray, step: float) -> dict:
    diff = np.abs(a.astype(np.float64) - b)
    return {"within": float((diff <= step * 1.001).mean()), "equal": float((diff == 0).mean()),
            "max_steps": float(diff.max() / step), "rows": float((a.argmax(-1) == b.argmax(-1)).mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dynamic = [m for m in quant_bench.DEFAULT if quant_bench.MODELS[m][1] == "dynamic"]
    ap.add_argument("--models", default=",".join(dynamic))
    ap.add_argument("--seeds", default="7,8,9", help="the inputs' seeds (one set of inputs each)")
    args = ap.parse_args(argv)
    print("| model | inputs | pair | within 1 step | equal | largest difference (steps) | rows' argmax agree |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            pair = quant_bench.Pair(name, Path(tmp))
            base = quant_models.float_model(quant_bench.MODELS[name][0])
            for seed in (int(s) for s in args.seeds.split(",")):
                out = outputs(pair, quant_models.inputs_of(base, seed=seed))
                step = quant_models.float_step(out["ort"])
                for x, y in (("rpcsrv", "ort-unopt"), ("rpcsrv", "ort"), ("ort", "ort-unopt")):
                    c = compare(out[x], out[y], step)
                    print(f"| {name} | seed {seed} | {x} / {y} | {c['within']:.2%} | {c['equal']:.2%} | "
                          f"{c['max_steps']:.2f} | {c['rows']:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
