"""Relax VM bench: rpcsrv's VM against TVM's own in-process VM on the same exported libraries.

Both run the same native kernels (the library's ``__tvm_ffi_*`` functions), so what differs is the
VM itself: the interpreter, builtins, allocation and argument passing.  For each model:

* time: median of ``--rounds`` interleaved rounds, each the mean of ``--number`` calls of ``main``
  (TVM: ``relax.VirtualMachine(lib, tvm.cpu())["main"]`` on tvm tensors; rpcsrv: the VM's ``main``
  on numpy arrays, as the server calls it); the ratio rpcsrv / TVM (target <= 1.3 on the CNN and the
  transformer block at ``--size bench``);
* memory: each VM in a fresh child process; the resident set grown from just before the library is
  loaded to the peak over load and runs (``/proc/self/clear_refs`` resets the peak first, so the
  imports do not count).  Target: rpcsrv within 1.5x of TVM.

Run by hand (2 free cores make the figures stable): ``python bench/vm_bench.py [--size bench|test]``.
Libraries are built with apache-tvm into ``--cache`` (default ``~/.cache/rpcsrv/vm-bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "vm"))

import vm_models  # noqa: E402

_CACHE = Path(os.path.join(os.path.expanduser("~"), ".cache", "rpcsrv", "vm-bench"))


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _set_threads(n: int, which: str) -> None:
    """Threads for parallel kernels: TVM reads TVM_NUM_THREADS when its pool starts (set before
    ``import tvm``); rpcsrv's runtime shim is told directly.  0 keeps both defaults (all CPUs)."""
    if n > 0:
        os.environ["TVM_NUM_THREADS"] = str(n)
        if which == "tvm":
            return
        if "tvm" in sys.modules or which == "both":
            import tvm  # noqa: F401  (before the shim: libtvm_ffi must not bind to the shim's symbols)
        from rpcsrv.native.shim import load_shim

        load_shim().rpcsrv_set_num_threads(n)


def _warm_up(which: str) -> None:
    """Load and run a small library once, so one-time runtime set-up is not counted as model memory."""
    main, convert = _make(which, str(vm_models.build("mlp", _CACHE, "test")))
    main(*convert(vm_models.inputs("mlp")))


def _make(which: str, lib: str):
    """A ``main`` callable for ``which`` ("tvm" or "rpcsrv") and a converter of numpy inputs."""
    if which == "tvm":
        import tvm
        from tvm import relax

        vm = relax.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
        return vm["main"], lambda args: [tvm.runtime.tensor(a) for a in args]
    from rpcsrv.native import load_native_module as load_module

    vm = load_module(lib).find_function("vm_load_executable")()
    vm.get_function("vm_initialization")(1, 0, 2)
    return vm.get_function("main"), lambda args: list(args)


def child_memory(which: str, lib: str, name: str, size: str, runs: int, threads: int) -> dict:
    """Run in a child: RSS growth (KiB) from before loading to the peak over ``runs`` calls."""
    import numpy as np  # noqa: F401  (imported before the baseline, as both VMs need it)

    _set_threads(threads, which)

    if which == "tvm":
        import tvm  # noqa: F401
    else:
        import rpcsrv.executor  # noqa: F401
        import rpcsrv.native  # noqa: F401  (the native layer's code, like TVM's, is not the VM's memory)
    args = vm_models.inputs(name, size)
    _warm_up(which)
    reset = _reset_peak()
    base = _rss_kb("VmRSS")
    main, convert = _make(which, lib)
    inputs = convert(args)
    for _ in range(runs):
        main(*inputs)
    return {"which": which, "grown_kb": _rss_kb("VmHWM") - base, "peak_reset": reset}


def memory(which: str, lib: Path, name: str, size: str, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--threads", str(threads), "--cache", str(_CACHE),
                          "--child", which, str(lib), name, size],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(f"memory child for {which} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def timing(lib: Path, name: str, size: str, number: int, rounds: int) -> dict:
    import numpy as np

    args = vm_models.inputs(name, size)
    runs = {}
    for which in ("tvm", "rpcsrv"):
        main, convert = _make(which, str(lib))
        inputs = convert(args)
        out = main(*inputs)
        runs[which] = (main, inputs, out)
    ours, theirs = runs["rpcsrv"][2], runs["tvm"][2]
    if hasattr(theirs, "numpy"):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)
    times: dict[str, list[float]] = {"tvm": [], "rpcsrv": []}
    for _ in range(rounds):
        for which, (main, inputs, _) in runs.items():
            start = time.perf_counter()
            for _ in range(number):
                main(*inputs)
            times[which].append((time.perf_counter() - start) / number)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"tvm_us": med["tvm"] * 1e6, "rpcsrv_us": med["rpcsrv"] * 1e6, "ratio": med["rpcsrv"] / med["tvm"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=["bench", "test"], default="bench")
    p.add_argument("--models", default="cnn,transformer,mlp,dynbatch,two_outputs")
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "rpcsrv", "vm-bench"))
    p.add_argument("--threads", type=int, default=0, help="threads for parallel kernels (0: all CPUs)")
    p.add_argument("--child", nargs=4, metavar=("WHICH", "LIB", "NAME", "SIZE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    global _CACHE
    _CACHE = cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if a.child:
        print(json.dumps(child_memory(a.child[0], a.child[1], a.child[2], a.child[3], 10, a.threads)))
        return 0
    _set_threads(a.threads, "both")
    print(f"threads for parallel kernels: {a.threads or os.cpu_count()}")
    print(f"{'model':<12} {'size':<6} {'TVM VM us':>10} {'rpcsrv us':>10} {'ratio':>6} "
          f"{'TVM MiB':>8} {'rpcsrv MiB':>10} {'mem ratio':>9}")
    for name in a.models.split(","):
        size = a.size if name in ("cnn", "transformer") else "test"
        lib = vm_models.build(name, cache, size)
        t = timing(lib, name, size, a.number, a.rounds)
        mt, mr = memory("tvm", lib, name, size, a.threads), memory("rpcsrv", lib, name, size, a.threads)
        mem_ratio = mr["grown_kb"] / max(mt["grown_kb"], 1)
        print(f"{name:<12} {size:<6} {t['tvm_us']:>10.1f} {t['rpcsrv_us']:>10.1f} {t['ratio']:>6.2f} "
              f"{mt['grown_kb'] / 1024:>8.1f} {mr['grown_kb'] / 1024:>10.1f} {mem_ratio:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
