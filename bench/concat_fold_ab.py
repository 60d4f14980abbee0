"""Paired A/B of ``concat_fold`` (producers written into their Concat's buffer) on whole model runs.

Each model is compiled once and loaded twice in one process, with the fold on and off
(``concat_fold.SWITCH``); the two run alternately, one BLAS thread (``--threads``), and the medians are
compared (other processes load the CPU: interleaving keeps them out of the ratio).  Also checks that both
give the same outputs (bit for bit, both run with the same threads: one is deterministic).

    python bench/concat_fold_ab.py [--models squeezenet,inception_v1,/tmp/x/model.onnx] [--repeat 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_bench  # noqa: E402  (sets up the import paths)


def engine(lib: str, feeds: dict):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    ex = load_module(lib).get_function("default")(Device(1, 0))
    for key, value in feeds.items():
        ex.get_function("set_input")(key, value)
    return ex.get_function("run"), ex


def outputs(ex) -> list:
    return [ex.get_function("get_output")(k).copy() for k in range(ex.get_function("get_num_outputs")())]


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    from rpcsrv.client import compile_onnx
    from rpcsrv.executor import compute
    from rpcsrv.executor.examplejson import concat_fold

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="squeezenet,torch_squeezenet11,inception_v1,inception_v2,densenet121")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per run")
    args = ap.parse_args(argv)
    print("| model | fold off ms | fold on ms | on / off | outputs equal |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = zoo_bench.onnx.load(name) if name.endswith(".onnx") else zoo_bench.load_model(name)
            name = Path(name).stem
            feeds = zoo_bench.feeds_of(model)
            lib = str(Path(tmp) / f"{name}.blob")
            compile_onnx(model).export_library(lib, fmt="blob")
            concat_fold.SWITCH["on"] = False
            off, ex_off = engine(lib, feeds)
            concat_fold.SWITCH["on"] = True
            on, ex_on = engine(lib, feeds)
            with compute.fixed_threads(args.threads), threadpool_limits(limits=args.threads, user_api="blas"):
                off()
                on()
                same = all(np.array_equal(g, w) for g, w in zip(outputs(ex_on), outputs(ex_off)))
                m = zoo_bench.paired({"off": (None, off), "on": (None, on)}, args.repeat)
            a, b = m["off"], m["on"]
            print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.3f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
