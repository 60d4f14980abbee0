"""Compiled kernels on and off, paired (issue 27): zoo models run with ``RPCSRV_COMPILED_KERNELS`` 1 and 0
alternately in one process (the order flips each round), onnxruntime after each pair, 1 thread; medians.

The switch is read at each conv call, so one loaded executor serves both arms: the pairs see the same
neighbours on a shared machine, and their ratio holds when the absolute times do not.

    python bench/zoo_compiled_ab.py [--models mobilenetv2,mobilenetv3,efficientnet,shufflenet] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_bench  # noqa: E402  (sets up the import paths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenetv2,mobilenetv3,efficientnet,shufflenet")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    from rpcsrv.executor import compute
    from rpcsrv.executor.kernels.clib import compiled

    print(f"compiled kernels: {compiled.status()}")
    print("| model | onnxruntime ms | numpy ms | compiled ms | numpy / ort | compiled / ort | gain |")
    print("|---|---|---|---|---|---|---|")
    saved = os.environ.get(compiled.ENV_SWITCH)
    try:
        with tempfile.TemporaryDirectory() as tmp, compute.fixed_threads(1), threadpool_limits(1, "blas"):
            for name in args.models.split(","):
                eng = zoo_bench.Engines(name, Path(tmp))
                sess = eng.session(1)
                m = zoo_bench.paired({arm: (lambda arm=arm: os.environ.__setitem__(compiled.ENV_SWITCH, arm), eng._run)
                                      for arm in ("1", "0")}, args.rounds, lambda: sess.run(None, eng.feeds))
                print(f"| {name} | {m['ort']:.1f} | {m['0']:.1f} | {m['1']:.1f} | {m['0'] / m['ort']:.2f}x | "
                      f"{m['1'] / m['ort']:.2f}x | {m['0'] / m['1']:.2f}x |", flush=True)
    finally:
        if saved is None:
            os.environ.pop(compiled.ENV_SWITCH, None)
        else:
            os.environ[compiled.ENV_SWITCH] = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
