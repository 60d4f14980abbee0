"""Executor speed on real topologies (issues 16, 27): the light model zoo, a BERT-class encoder and the
depthwise family against onnxruntime.

The nine architectures that ship inside the ``onnx`` wheel (``onnx/backend/test/data/light/``), a transformer
encoder built with ``onnx.helper`` (``bench_models.py``) and MobileNetV2, MobileNetV3-Large and
EfficientNet-B0 at 224x224 (``zoo_mobile.py``, random weights), and where torch is installed the PyTorch
exports of ``zoo_torch.py`` (MobileNetV2, ResNet-18, ShuffleNetV2, SqueezeNet 1.1, an encoder) are compiled by
``client.compile_onnx``, written as libraries, loaded with ``rpcsrv.executor.load_module`` and run through the
graph executor, as the board does. onnxruntime runs the same model in the same process. For each thread count
(``--threads 1,2``: BLAS threads through threadpoolctl, onnxruntime's ``intra_op_num_threads``) both engines
run interleaved, ``--repeat`` times each, and the medians are compared; the geometric mean of the ratios
closes each table. ``auto`` runs rpcsrv with the server's own policy (``rpcsrv.executor.compute``).
onnxruntime's worker threads do not spin between runs here (they would hold the cores rpcsrv runs on next:
with spinning, 2-thread rpcsrv runs measured 5-20x slower in this interleaving).

Also reported: the BLAS library and kernel (threadpoolctl), the first run after loading against the
steady state, and the peak resident memory each engine adds while loading and running (the process's
high-water mark is reset through ``/proc/self/clear_refs`` before each engine starts).

The light models fill their weights with ``ConstantOfShape``; the fills are made initializers here, so
neither engine computes weights per run, with varied values as in the zoo test
(``tests/models/zoo_weights.varied``: a uniform fill gives every class the same score, and the error
column would compare nothing).  Deep models still saturate their softmax (one class near 1): an error of
0 there says that both engines picked the same class.

    python bench/zoo_bench.py [--threads 1,2,auto] [--repeat 10] [--models shufflenet,...,encoder]

Where one model's time goes, per kind of op, in both engines: ``bench/zoo_profile.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "models"))  # zoo_weights (no pytest needed)

import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))

import zoo_torch  # noqa: E402
from zoo_mobile import BUILDERS as _MOBILE_BUILDERS, MODELS as MOBILE  # noqa: E402

BUILDERS = {**_MOBILE_BUILDERS, **zoo_torch.BUILDERS}
#: PyTorch exports (``zoo_torch.py``) join the default set where torch is installed
TORCH = list(zoo_torch.MODELS) if zoo_torch.available() else []


def fills_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``ConstantOfShape`` of an initializer shape replaced by the same values as an
    initializer."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    keep = []
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            value = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0]
            shape = tuple(int(d) for d in inits[node.input[0]])
            out.graph.initializer.append(numpy_helper.from_array(np.full(shape, value), node.output[0]))
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.ir_version = max(out.ir_version, 4)
    return out


def load_model(name: str) -> onnx.ModelProto:
    if name in BUILDERS:  # the depthwise family (zoo_mobile.py)
        return BUILDERS[name]()
    if name == "encoder":
        from bench_models import build_encoder

        # BERT-small-class: 4 layers, width 256, 4 heads, FFN 1024, 128 tokens
        return build_encoder(seq=128, width=256, heads=4, ffn=1024, layers=4)
    # the weights varied as the zoo test varies them (a uniform fill makes every output equal, so the
    # error column would compare nothing); the huge dense fills stay uniform
    from zoo_weights import varied

    return fills_as_initializers(varied(onnx.load(str(LIGHT / f"light_{name}.onnx"))))


def feeds_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(2)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input if i.name not in inits}


# ---------------------------------------------------------------------- memory and BLAS facts
def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def reset_peak() -> float:
    """Reset the process's peak RSS (Linux ``clear_refs`` 5); the current RSS in MB.  Freed heap is
    handed back first (``malloc_trim``), else a new engine reuses resident pages and seems to cost nothing."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status("VmRSS")


def peak_since(base: float) -> float:
    return _status("VmHWM") - base


def blas_info() -> dict:
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return {"blas": "none found"}
    b = blas[0]
    return {"blas": f"{b.get('internal_api')} {b.get('version')}", "blas_kernel": b.get("architecture"),
            "blas_default_threads": b.get("num_threads")}


# ---------------------------------------------------------------------- engines
class Engines:
    """One model, both engines, loaded once (each load measured for peak RSS and first-run time)."""

    def __init__(self, name: str, workdir: Path):
        import onnxruntime as ort

        from rpcsrv.client import compile_onnx
        from rpcsrv.executor import load_module
        from rpcsrv.protocol.dtypes import Device

        self.name = name
        model = load_model(name)
        self.feeds = feeds_of(model)
        self.serialized = model.SerializeToString()
        self.ort = ort
        lib = workdir / f"{name}.blob"
        compile_onnx(model).export_library(str(lib), fmt="blob")
        del model

        base = reset_peak()
        self.ex = load_module(str(lib)).get_function("default")(Device(1, 0))
        for key, value in self.feeds.items():
            self.ex.get_function("set_input")(key, value)
        self._run = self.ex.get_function("run")
        start = time.perf_counter()  # first run after load_module, against the steady state
        self._run()
        self.first_ms = (time.perf_counter() - start) * 1e3
        self.rss_ours = peak_since(base)
        self.got = [self.ex.get_function("get_output")(k).copy()
                    for k in range(self.ex.get_function("get_num_outputs")())]

        self.sessions = {}
        base = reset_peak()
        self.session(1)
        self.rss_ort = peak_since(base)
        self.want = self.sessions[1].run(None, self.feeds)

    def session(self, threads: int):
        if threads not in self.sessions:
            opts = self.ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            opts.log_severity_level = 3
            # interleaved with rpcsrv: onnxruntime's workers must not spin on the cores after their run
            # (they would take the cores rpcsrv's BLAS threads run on next; OpenBLAS's sleep when idle)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.sessions[threads] = self.ort.InferenceSession(self.serialized, opts,
                                                               providers=["CPUExecutionProvider"])
            self.sessions[threads].run(None, self.feeds)
        return self.sessions[threads]

    def max_rel_err(self) -> float:
        worst = 0.0
        for g, w in zip(self.got, self.want):
            scale = max(float(np.max(np.abs(w))), 1e-30)
            worst = max(worst, float(np.max(np.abs(g - w))) / scale)
        return worst

    def time_pair(self, threads, repeat: int) -> tuple[float, float]:
        """Interleaved medians (ms): onnxruntime, rpcsrv; ``threads`` an int or "auto"."""
        from threadpoolctl import threadpool_limits

        from rpcsrv.executor import compute

        sess = self.session(2 if threads == "auto" else threads)
        fixed = None if threads == "auto" else threads
        ort_t, our_t = [], []
        with compute.fixed_threads(fixed), threadpool_limits(limits=fixed, user_api="blas"):
            # the policy's steady state: past the runs in which the executor learns its thread count
            for _ in range(1 + (2 * compute.ThreadChoice.TRIALS + 1 if fixed is None else 0)):
                self._run()
            for _ in range(repeat):
                t = time.perf_counter()
                sess.run(None, self.feeds)
                ort_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                self._run()
                our_t.append(time.perf_counter() - t)
        return float(np.median(ort_t) * 1e3), float(np.median(our_t) * 1e3)


def paired(arms: dict, rounds: int, ort=None) -> dict[str, float]:
    """Median milliseconds of each arm, run in turns: ``arms`` maps a name to ``(setup, run)`` (``setup``:
    None, or what switches to that arm, untimed); within each round every arm runs once, the order flipped
    every round (no arm always runs second), then ``ort`` (onnxruntime's run, timed as ``"ort"``) if given.
    The A/B benches' one loop (gemm_ab, im2gemm_ab, zoo_compiled_ab, shuffle_fold_ab, concat_fold_ab)."""
    names = list(arms)
    times: dict = {name: [] for name in names + (["ort"] if ort is not None else [])}
    for r in range(rounds):
        for name in names if r % 2 else names[::-1]:
            setup, run_arm = arms[name]
            if setup is not None:
                setup()
            start = time.perf_counter()
            run_arm()
            times[name].append(time.perf_counter() - start)
        if ort is not None:
            start = time.perf_counter()
            ort()
            times["ort"].append(time.perf_counter() - start)
    return {name: float(np.median(v)) * 1e3 for name, v in times.items()}

def table(rows: list[dict], threads) -> str:
    lines = [f"threads: {threads} (BLAS threads per run for rpcsrv, intra_op for onnxruntime"
             + ("; rpcsrv's own policy, onnxruntime 2)" if threads == "auto" else ")"),
             "| model | onnxruntime ms | rpcsrv ms | ratio | first run / steady | peak RSS MB ort / rpcsrv "
             "| max rel err |", "|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | – | – | {r['error']} | | | |")
            continue
        t = r["times"][str(threads)]
        ratios.append(t[1] / t[0])
        lines.append(f"| {r['model']} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f}x | "
                     f"{r['first_ms'] / r['times']['1'][1]:.1f}x | {r['rss_ort']:.0f} / {r['rss_ours']:.0f} | "
                     f"{r['max_rel_err']:.1e} |")
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"| **geometric mean** | | | **{gm:.2f}x** | | | |")
    return "\n".join(lines)


def run(models: list[str], thread_counts: list, repeat: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            try:
                eng = Engines(name, Path(tmp))
                row = {"model": name, "first_ms": eng.first_ms, "rss_ours": eng.rss_ours, "rss_ort": eng.rss_ort,
                       "max_rel_err": eng.max_rel_err(), "times": {}}
                for threads in ["1"] + [str(t) for t in thread_counts if str(t) != "1"]:
                    key = threads if threads == "auto" else int(threads)
                    row["times"][threads] = eng.time_pair(key, repeat)
                del eng
            except Exception as exc:  # a model that does not compile or run: reported, the rest go on
                row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:200]}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2,auto", help="thread counts to compare (1, 2, auto)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--models", default=",".join(ZOO + ["encoder"] + list(MOBILE) + TORCH))
    args = ap.parse_args(argv)
    if not TORCH:
        print(f"torch is not installed: the PyTorch exports ({', '.join(zoo_torch.MODELS)}) are left out "
              "(pip install torch)", flush=True)
    from rpcsrv.executor import compute

    info = blas_info()
    print(f"BLAS: {info.get('blas')}, kernel {info.get('blas_kernel')}, default threads "
          f"{info.get('blas_default_threads')}; cores {compute.CORES}; repeat {args.repeat}", flush=True)
    threads = args.threads.split(",")
    rows = run(args.models.split(","), threads, args.repeat)
    for t in ["1"] + [t for t in threads if t != "1"]:
        print()
        print(table(rows, t))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
