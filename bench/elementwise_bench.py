"""Where a light-zoo model's run goes, per op type, and what the elementwise work around the convolutions costs.

For each model (``--models densenet121,...``, the names of ``zoo_bench``) three executors run interleaved in
one process, one BLAS thread, CPU time of the calling thread (``time.thread_time``: less disturbed by the
other processes of a shared machine than wall time), best and median of ``--repeat`` runs:

* ``folded``: ``compile_onnx`` as the user gets it: per-channel BatchNormalization/Mul/Add chains composed
  (``rpcsrv.client.compiler.simplify``), folded into the Conv before them or their scale moved through the Relu
  into the Conv after them, Relu fused into its producer; concat chains written in place at run time
  (``rpcsrv.executor.examplejson.concat_chain``);
* ``no concat chains``: the same library with every concat copying all its inputs;
* ``unfolded``: ``compile_onnx(fold_batchnorm=False)``: each BatchNormalization, Mul and Add its own pass.

Then the ``folded`` run per op type (sum over the run's steps through the ExampleJSON step hook, best of
the runs), to see what is left besides the convolutions.

    python bench/elementwise_bench.py [--models densenet121,inception_v2,resnet50] [--repeat 15]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _executor(lib: str, feeds: dict, chains: bool = True):
    from rpcsrv.executor import load_module
    from rpcsrv.executor.examplejson import subgraphs as examplejson
    from rpcsrv.protocol.dtypes import Device

    plan = examplejson.chain_kernels
    if not chains:
        examplejson.chain_kernels = lambda graph, concat: {}
    try:
        ex = load_module(lib).get_function("default")(Device(1, 0))
    finally:
        examplejson.chain_kernels = plan
    for key, value in feeds.items():
        ex.get_function("set_input")(key, value)
    run = ex.get_function("run")
    run()
    return run, ex.get_function("get_output")(0).copy()


def _key(node) -> str:
    key = node.op + ("+" + node.attrs["activation"] if node.attrs.get("activation") else "")
    if node.op == "conv":
        key += " " + "x".join(map(str, node.attrs.get("kernel_shape", [])))
    return key


def measure(name: str, repeat: int, workdir: Path) -> dict:
    from threadpoolctl import threadpool_limits

    from rpcsrv.client import compile_onnx
    from rpcsrv.executor.module import STEP_HOOK
    from zoo_bench import feeds_of, load_model

    model = load_model(name)
    feeds = feeds_of(model)
    libs = {}
    for label, fold in (("folded", True), ("unfolded", False)):
        libs[label] = str(workdir / f"{name}_{label}.blob")
        compile_onnx(model, fold_batchnorm=fold).export_library(libs[label], fmt="blob")
    variants = {"folded": _executor(libs["folded"], feeds),
                "no concat chains": _executor(libs["folded"], feeds, chains=False),
                "unfolded": _executor(libs["unfolded"], feeds)}
    want = variants["folded"][1]
    err = max(float(np.max(np.abs(out - want))) / max(float(np.max(np.abs(want))), 1e-30)
              for _, out in variants.values())
    times: dict[str, list[float]] = {k: [] for k in variants}
    per_op: dict[str, list[float]] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(repeat):
            for label, (run, _) in variants.items():
                start = time.thread_time()
                run()
                times[label].append(time.thread_time() - start)
        steps: dict[str, float] = {}
        token = STEP_HOOK.set(lambda graph, node, value, s: steps.__setitem__(_key(node), steps.get(_key(node), 0) + s))
        try:
            for _ in range(repeat):
                steps.clear()
                variants["folded"][0]()
                for k, v in steps.items():
                    per_op.setdefault(k, []).append(v)
        finally:
            STEP_HOOK.reset(token)
    return {"model": name, "max_rel_diff": err,
            "ms": {k: (min(v) * 1e3, float(np.median(v)) * 1e3) for k, v in times.items()},
            "per_op_ms": {k: min(v) * 1e3 for k, v in sorted(per_op.items(), key=lambda kv: -min(kv[1]))}}


def report(row: dict) -> str:
    lines = [f"{row['model']} (1 BLAS thread, CPU ms best / median; outputs differ by {row['max_rel_diff']:.1e} "
             "relative)"]
    lines += [f"  {label:18s} {best:7.1f} / {median:7.1f}" for label, (best, median) in row["ms"].items()]
    lines.append("  folded, per op type (best run):")
    lines += [f"    {op:26s} {ms:7.2f}" for op, ms in row["per_op_ms"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="densenet121,inception_v2,resnet50")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            print(report(measure(name, args.repeat, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
