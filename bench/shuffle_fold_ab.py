"""ShuffleNetV2's Concat + channel shuffle folded and not, paired (issue 27,
``rpcsrv.executor.examplejson.shuffle_fold``): one library loaded twice in one process, once as it is and once
with the fold and the plan of convs that are not depthwise reading a shuffle
(``plans_conv.shuffled_conv_plan``) turned off, run alternately (the order flips each round), onnxruntime after
each pair, 1 thread; medians.

    RPCSRV_TORCH_ZOO=... python bench/shuffle_fold_ab.py [--models torch_shufflenetv2,shufflenet] [--rounds 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_bench  # noqa: E402  (sets up the import paths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="torch_shufflenetv2,shufflenet")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute, load_module
    from rpcsrv.executor.examplejson import subgraphs as examplejson
    from rpcsrv.executor.kernels.conv import plans_conv
    from rpcsrv.protocol.dtypes import Device

    print("| model | onnxruntime ms | unfolded ms | folded ms | unfolded / ort | folded / ort | gain | steps |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, compute.fixed_threads(1), threadpool_limits(1, "blas"):
        for name in args.models.split(","):
            eng = zoo_bench.Engines(name, Path(tmp))  # the folded executor, as the board loads it
            with mock.patch.object(examplejson, "fold_shuffles", lambda graph, ops, kernels: (ops, {})), \
                    mock.patch.object(plans_conv, "shuffled_conv_plan", lambda *args: None):
                plain = load_module(str(Path(tmp) / f"{name}.blob")).get_function("default")(Device(1, 0))
            for key, value in eng.feeds.items():
                plain.get_function("set_input")(key, value)
            runs = {"folded": eng._run, "plain": plain.get_function("run")}
            runs["plain"]()
            out = plain.get_function("get_output")(0)
            # the data moves exactly; a conv whose input_shuffle was folded away takes its plan (float32 rounding)
            np.testing.assert_allclose(out, eng.ex.get_function("get_output")(0), rtol=1e-4, atol=1e-5)
            steps = [sum(len(getattr(f, "steps", ())) for f in ex._functions.values()) for ex in (plain, eng.ex)]
            sess = eng.session(1)
            m = zoo_bench.paired({arm: (None, runs[arm]) for arm in ("folded", "plain")}, args.rounds,
                                 lambda: sess.run(None, eng.feeds))
            print(f"| {name} | {m['ort']:.2f} | {m['plain']:.2f} | {m['folded']:.2f} | {m['plain'] / m['ort']:.2f}x | "
                  f"{m['folded'] / m['ort']:.2f}x | {m['plain'] / m['folded']:.3f}x | {steps[0]} → {steps[1]} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
